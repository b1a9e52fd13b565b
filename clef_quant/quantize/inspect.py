"""Inspect a quantized release folder from its files alone: no model is built, nothing is loaded on a GPU.

The Linear modules come from the safetensors headers (a module with `weight_packed`, or a 2-D `weight` that is
not an embedding), their schemes from `config.json`'s `quantization_config` (compressed-tensors: config groups
with targets, and an ignore list), cross-checked against the tensors actually stored. Then the checks:

- keep-list: `lm_head`, the vision tower, DeltaNet `in_proj_a`/`in_proj_b` and embeddings are bf16;
- fused groups: modules vLLM fuses into one layer (`in_proj_qkv`+`in_proj_z`, q/k/v, gate/up, b/a) have one
  scheme and, where they carry one, equal `weight_global_scale` tensors;
- config and tensors agree: every module the config quantizes is stored quantized, and no other is;
- manifest: `clef_quant.json` present, valid and every sha256 matching; a quantized folder without one fails (it is
  unfinished, or clef-quant did not make it), and the other checks still run;
- code: no file that may run code (`.py`, pickles, shared libraries, scripts, executables) and no `auto_map` key
  unless the manifest lists it as included on purpose (`included`, or the files `card` added);
- head: `clef_head/joint_head.safetensors` and `joint_head_config.json` present.

A `DIR.partial` (or any folder holding a quantize run's writer marker) is unfinished: it fails at once with one
line, nothing else is read. A bf16 source release (no quantization_config, no manifest, head at the root) is
inspected as a source and says so: no manifest is expected, and code files are noted, not failed (quantize
leaves them out).
"""

from __future__ import annotations

import json
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from clef_quant.quantize.contents import RELEASE_CODE, code_in_folder
from clef_quant.quantize.manifest import MANIFEST_FILE, ManifestError, read_manifest, verify_manifest
from clef_quant.quantize.recipes import is_kept_bf16, matches_target
from clef_quant.quantize.schemes import BF16, fused_groups_of, module_kind, scheme_label
from clef_quant.quantize.writer import OWNER_FILE, PARTIAL_SUFFIX
from clef_vllm.errors import CheckpointError
from clef_vllm.head_files import HEAD_CONFIG, HEAD_SUBDIR, HEAD_WEIGHTS

QUANTIZED_MARKERS = ("weight_packed", "weight_scale")
UNKNOWN_SCHEME = "quantized (scheme not in config)"

CHECK_KEEP = "keep-list stays bf16"
CHECK_FUSED = "fused groups share scheme and global scale"
CHECK_CONSISTENT = "config matches stored tensors"
CHECK_MANIFEST = "manifest hashes"
CHECK_HEAD = "head files present"
CHECK_CODE = "no code unless included on purpose"
CHECK_COMPLETE = "finished release"

SOURCE = "source"
RELEASE = "release"
UNFINISHED = "unfinished"


@dataclass(frozen=True)
class LinearInfo:
    name: str
    kind: str
    shape: tuple[int, ...]  # (out_features, in_features) of the dense weight
    scheme: str  # label from the config (FP8_DYNAMIC, NVFP4, ...) or "bf16"
    stored: str  # what the tensors are: their dtype, or e.g. "fp4 packed + F8_E4M3 scales"
    quantized: bool  # by the stored tensors

    @property
    def params(self) -> int:
        total = 1
        for dim in self.shape:
            total *= dim
        return total


@dataclass(frozen=True)
class Violation:
    check: str
    subject: str  # a module, layer or file name
    message: str

    def __str__(self) -> str:
        return f"{self.subject}: {self.message}"


@dataclass(frozen=True)
class CheckResult:
    name: str
    status: str  # "pass", "fail" or "skipped"
    detail: str


@dataclass
class InspectReport:
    folder: Path
    modules: list[LinearInfo]
    checks: list[CheckResult]
    violations: list[Violation]
    notes: list[str] = field(default_factory=list)
    quant_method: str | None = None
    manifest: dict[str, Any] | None = None
    kind: str = RELEASE  # RELEASE, SOURCE (a bf16 source release) or UNFINISHED (nothing but that was read)

    @property
    def ok(self) -> bool:
        return not self.violations

    def totals_by_kind(self) -> dict[str, dict[str, int]]:
        """kind -> {scheme label: module count}, kinds in first-seen order."""
        totals: dict[str, dict[str, int]] = {}
        for module in self.modules:
            counts = totals.setdefault(module.kind, {})
            counts[module.scheme] = counts.get(module.scheme, 0) + 1
        return totals

    def module(self, name: str) -> LinearInfo:
        return next(m for m in self.modules if m.name == name)


@dataclass(frozen=True)
class _Tensor:
    file: Path
    dtype: str
    shape: tuple[int, ...]


def read_tensor_index(folder: Path) -> dict[str, _Tensor]:
    """Name -> (file, dtype, shape) for every tensor of the backbone files in `folder` (headers only)."""
    from safetensors import safe_open

    files = sorted(Path(folder).glob("*.safetensors"))
    if not files:
        raise CheckpointError(f"{folder} has no .safetensors files")
    index: dict[str, _Tensor] = {}
    for path in files:
        try:
            with safe_open(str(path), framework="pt") as handle:
                for key in handle.keys():  # noqa: SIM118 (safe_open is not iterable)
                    tensor = handle.get_slice(key)
                    index[key] = _Tensor(path, tensor.get_dtype(), tuple(tensor.get_shape()))
        except Exception as exc:  # safetensors raises its own error types for a truncated or foreign file
            raise CheckpointError(f"{path} is not a readable safetensors file: {exc}") from None
    return index


def _read_tensor(entry: _Tensor, name: str) -> Any:
    from safetensors import safe_open

    with safe_open(str(entry.file), framework="pt") as handle:
        return handle.get_tensor(name)


def _group_by_module(index: dict[str, _Tensor]) -> dict[str, dict[str, _Tensor]]:
    modules: dict[str, dict[str, _Tensor]] = defaultdict(dict)
    for key, entry in index.items():
        if "." in key:
            prefix, param = key.rsplit(".", 1)
            modules[prefix][param] = entry
    return modules


def _is_embedding(name: str) -> bool:
    last = name.rsplit(".", 1)[-1]
    return "embed" in last or last in ("wte", "wpe")


def _stored(params: dict[str, _Tensor]) -> str:
    if "weight_packed" in params:
        scale = params.get("weight_scale")
        # pack-quantized INT4 stores eight values per int32 (and the dense shape); NVFP4 two per uint8
        packed = "int4 packed" if "weight_shape" in params else "fp4 packed"
        return packed + (f" + {scale.dtype} scales" if scale is not None else "")
    weight = params["weight"]
    if "weight_scale" in params:
        return f"{weight.dtype} + {params['weight_scale'].dtype} scales"
    return weight.dtype


def _dense_shape(name: str, params: dict[str, _Tensor]) -> tuple[int, ...]:
    if "weight_shape" in params:  # int packing (pack-quantized) stores the dense shape as a tensor
        return tuple(int(v) for v in _read_tensor(params["weight_shape"], f"{name}.weight_shape").tolist())
    if "weight_packed" in params:
        rows, packed_cols = params["weight_packed"].shape
        return (rows, packed_cols * 2)  # NVFP4: two FP4 values per byte
    return params["weight"].shape


class _ConfigSchemes:
    """The scheme label compressed-tensors' config assigns to a Linear module by name."""

    def __init__(self, quantization_config: dict[str, Any] | None, notes: list[str]) -> None:
        self.groups: list[tuple[list[str], str]] = []
        self.ignore: list[str] = []
        if not quantization_config:
            return
        for group in (quantization_config.get("config_groups") or {}).values():
            label = scheme_label(group.get("weights"), group.get("input_activations"))
            self.groups.append((list(group.get("targets") or []), label))
        self.ignore = list(quantization_config.get("ignore") or [])
        odd = sorted(
            {t for targets, _ in self.groups for t in targets if self._is_class(t) and t != "Linear"}
            | {t for t in self.ignore if self._is_class(t) and t != "Linear"}
        )
        if odd:
            notes.append(f"class-name targets other than Linear cannot be resolved from files: {', '.join(odd)}")

    @staticmethod
    def _is_class(target: str) -> bool:
        return not target.startswith("re:") and "." not in target and target[:1].isupper()

    def _matches(self, name: str, target: str) -> bool:
        return target == "Linear" if self._is_class(target) else matches_target(name, target)

    def label(self, name: str) -> str:
        if any(self._matches(name, target) for target in self.ignore):
            return BF16
        for targets, label in self.groups:
            if any(self._matches(name, target) for target in targets):
                return label
        return BF16


def inspect_checkpoint(folder: str | Path, *, verify_hashes: bool = True) -> InspectReport:
    """Inspect a release folder; the report's `violations` say what is wrong, each naming its module or file."""
    folder = Path(folder)
    unfinished = _unfinished(folder)
    if unfinished:
        checks = [CheckResult(CHECK_COMPLETE, "fail", "an unfinished quantize output")]
        return InspectReport(folder, [], checks, unfinished, kind=UNFINISHED)
    config_path = folder / "config.json"
    if not config_path.is_file():
        raise CheckpointError(f"{folder} is not a checkpoint folder: it has no config.json")
    try:
        config = json.loads(config_path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as exc:
        raise CheckpointError(f"{config_path} is not valid JSON: {exc.msg}") from None
    notes: list[str] = []
    quantization_config = config.get("quantization_config")
    quant_method = (quantization_config or {}).get("quant_method")
    if not quantization_config:
        notes.append("config.json has no quantization_config: the checkpoint is not quantized")
    elif quant_method != "compressed-tensors":
        notes.append(f"quant_method is {quant_method!r}; only compressed-tensors configs are read")
        quantization_config = None

    index = read_tensor_index(folder)
    by_module = _group_by_module(index)
    configured = _ConfigSchemes(quantization_config, notes)
    violations: list[Violation] = []

    modules: list[LinearInfo] = []
    for name, params in by_module.items():
        packed = "weight_packed" in params
        dense = "weight" in params and len(params["weight"].shape) == 2
        if not (packed or dense):
            continue
        quantized = any(marker in params for marker in QUANTIZED_MARKERS)
        if _is_embedding(name):
            if quantized:
                violations.append(Violation(CHECK_KEEP, name, "embedding is quantized; embeddings stay bf16"))
            continue
        label = configured.label(name)
        if label != BF16 and not quantized:
            violations.append(
                Violation(CHECK_CONSISTENT, name, f"config says {label} but the stored weight is {_stored(params)}")
            )
        if label == BF16 and quantized:
            violations.append(
                Violation(CHECK_CONSISTENT, name, f"stored quantized ({_stored(params)}) but config says bf16")
            )
            label = UNKNOWN_SCHEME
        modules.append(
            LinearInfo(name, module_kind(name), _dense_shape(name, params), label, _stored(params), quantized)
        )

    modules.sort(key=lambda m: _natural_key(m.name))
    violations += _keep_list_violations(modules)
    violations += _fused_group_violations(modules, by_module)

    manifest, manifest_error = None, None
    try:
        manifest = read_manifest(folder)
    except ManifestError as exc:
        manifest_error = str(exc)
    is_source = not quantization_config and manifest is None and manifest_error is None
    is_source = is_source and not (folder / HEAD_SUBDIR).exists()
    manifest_check = _manifest_check(folder, manifest, manifest_error, is_source, verify_hashes, violations)
    code_check = _code_check(folder, manifest, is_source, violations, notes)
    head_check = _head_check(folder, bool(quantization_config), violations)

    kept = [m.name for m in modules if m.scheme == BF16 and not is_kept_bf16(m.name)]
    if quantization_config and kept:
        notes.append(
            f"{len(kept)} Linear module(s) outside the keep-list stay bf16: "
            + ", ".join(kept[:5])
            + (" ..." if len(kept) > 5 else "")
        )

    def status(check: str, detail_ok: str) -> CheckResult:
        failed = [v for v in violations if v.check == check]
        return CheckResult(check, "fail" if failed else "pass", f"{len(failed)} violation(s)" if failed else detail_ok)

    groups = fused_groups_of([m.name for m in modules])
    checks = [
        status(CHECK_KEEP, f"{sum(is_kept_bf16(m.name) for m in modules)} module(s) on the keep-list, all bf16"),
        status(CHECK_FUSED, f"{len(groups)} fused group(s) consistent"),
        status(CHECK_CONSISTENT, f"{sum(m.quantized for m in modules)} quantized module(s) as configured"),
        manifest_check,
        code_check,
        head_check,
    ]
    kind = SOURCE if is_source else RELEASE
    return InspectReport(folder, modules, checks, violations, notes, quant_method, manifest, kind)


def _unfinished(folder: Path) -> list[Violation]:
    """A `.partial` is never a release, whatever it holds; reading its half-written tensors would prove nothing."""
    found = []
    if folder.name.endswith(PARTIAL_SUFFIX):
        found.append(
            Violation(
                CHECK_COMPLETE,
                str(folder),
                f"an unfinished quantize output ({PARTIAL_SUFFIX}): its run is still writing or was killed; "
                "inspect the folder the run finishes, or quantize again",
            )
        )
    if (folder / OWNER_FILE).exists():
        found.append(
            Violation(
                CHECK_COMPLETE,
                f"{folder / OWNER_FILE}",
                "a quantize run's writer marker: the run did not finish its last step; quantize again",
            )
        )
    return found


def _natural_key(name: str) -> list[Any]:
    return [int(part) if part.isdigit() else part for part in name.split(".")]


def _keep_list_violations(modules: list[LinearInfo]) -> list[Violation]:
    return [
        Violation(CHECK_KEEP, m.name, f"must stay bf16 but is {m.scheme} ({m.stored})")
        for m in modules
        if is_kept_bf16(m.name) and (m.quantized or m.scheme != BF16)
    ]


def _fused_group_violations(modules: list[LinearInfo], by_module: dict[str, dict[str, _Tensor]]) -> list[Violation]:
    info = {m.name: m for m in modules}
    violations = []
    for parent, members in fused_groups_of(list(info)):
        short = [m.rsplit(".", 1)[1] for m in members]
        labels = [info[m].scheme for m in members]
        if len(set(labels)) > 1:
            described = ", ".join(f"{s}={lab}" for s, lab in zip(short, labels, strict=True))
            violations.append(
                Violation(CHECK_FUSED, parent, f"vLLM fuses {'+'.join(short)} but their schemes differ: {described}")
            )
            continue
        entries = [by_module[m].get("weight_global_scale") for m in members]
        if any(entry is None for entry in entries):
            continue
        scales = [_read_tensor(entry, f"{m}.weight_global_scale") for entry, m in zip(entries, members, strict=True)]
        if any(not _same(scales[0], other) for other in scales[1:]):
            values = ", ".join(f"{s}={_scalar(t)}" for s, t in zip(short, scales, strict=True))
            violations.append(
                Violation(
                    CHECK_FUSED,
                    parent,
                    f"weight_global_scale differs across {'+'.join(short)} ({values}); vLLM fuses them into "
                    "one GEMM with one scale",
                )
            )
    return violations


def _same(a: Any, b: Any) -> bool:
    import torch

    return a.shape == b.shape and bool(torch.equal(a, b))


def _scalar(tensor: Any) -> str:
    values = tensor.flatten().tolist()
    return f"{values[0]:g}" if len(values) == 1 else str(values[:4])


def _manifest_check(
    folder: Path,
    manifest: dict[str, Any] | None,
    error: str | None,
    is_source: bool,
    verify_hashes: bool,
    violations: list[Violation],
) -> CheckResult:
    if error is not None:
        violations.append(Violation(CHECK_MANIFEST, MANIFEST_FILE, error.replace(f"{folder / MANIFEST_FILE} ", "")))
        return CheckResult(CHECK_MANIFEST, "fail", "unreadable manifest")
    if manifest is None and is_source:
        return CheckResult(CHECK_MANIFEST, "skipped", "a source release has none")
    if manifest is None:
        violations.append(
            Violation(
                CHECK_MANIFEST,
                MANIFEST_FILE,
                "missing: a quantized folder without a manifest is unfinished or was not made by clef-quant "
                "(make releases with clef-quant quantize)",
            )
        )
        return CheckResult(CHECK_MANIFEST, "fail", f"no {MANIFEST_FILE}")
    if not verify_hashes:
        return CheckResult(CHECK_MANIFEST, "skipped", "hash verification turned off")
    problems = verify_manifest(folder, manifest)
    for problem in problems:
        violations.append(Violation(CHECK_MANIFEST, problem.file, problem.problem))
    if problems:
        return CheckResult(CHECK_MANIFEST, "fail", f"{len(problems)} file(s) differ from the manifest")
    return CheckResult(CHECK_MANIFEST, "pass", f"{len(manifest.get('files') or {})} file(s) match")


def included_on_purpose(manifest: dict[str, Any] | None) -> set[str]:
    """What the manifest names as carried on purpose: its `included` entries and the files `card` added."""
    if manifest is None:
        return set()
    names = {entry["path"] for entry in manifest.get("included") or []}
    return names | set((manifest.get("card") or {}).get("files") or [])


def _code_check(
    folder: Path, manifest: dict[str, Any] | None, is_source: bool, violations: list[Violation], notes: list[str]
) -> CheckResult:
    found = code_in_folder(folder, skip=(MANIFEST_FILE,))
    if is_source:
        left_out = [name for name in found if name != RELEASE_CODE]
        if left_out:
            notes.append(f"code that quantize leaves out of a release: {', '.join(left_out)}")
        detail = "a source release" + (f"; {len(found)} code file(s)" if found else "")
        return CheckResult(CHECK_CODE, "skipped", detail)
    allowed = included_on_purpose(manifest)
    unvetted = [name for name in found if name not in allowed]
    for name in unvetted:
        what = "a remote-code key" if ":" in name else "may run code"
        violations.append(
            Violation(CHECK_CODE, name, f"{what}, and the manifest does not list it as included on purpose")
        )
    if unvetted:
        return CheckResult(CHECK_CODE, "fail", f"{len(unvetted)} unvetted")
    return CheckResult(CHECK_CODE, "pass", f"{len(found)} included on purpose" if found else "none")


def _head_check(folder: Path, quantized: bool, violations: list[Violation]) -> CheckResult:
    head_dir = folder / HEAD_SUBDIR
    missing = [name for name in (HEAD_WEIGHTS, HEAD_CONFIG) if not (head_dir / name).is_file()]
    if not missing:
        return CheckResult(CHECK_HEAD, "pass", f"{HEAD_SUBDIR}/{HEAD_WEIGHTS}, {HEAD_SUBDIR}/{HEAD_CONFIG}")
    at_root = all((folder / name).is_file() for name in (HEAD_WEIGHTS, HEAD_CONFIG))
    if at_root and not quantized:
        return CheckResult(CHECK_HEAD, "pass", "head at the release root (an unquantized release)")
    for name in missing:
        message = (
            "missing; the head is at the release root, but a quantized release keeps it in clef_head/"
            if at_root
            else "missing"
        )
        violations.append(Violation(CHECK_HEAD, f"{HEAD_SUBDIR}/{name}", message))
    return CheckResult(CHECK_HEAD, "fail", f"{len(missing)} head file(s) missing")
