"""Inspect a quantized release folder from its files alone: no model is built, nothing is loaded on a GPU.

The Linear modules come from the safetensors headers (a module with `weight_packed`, or a 2-D `weight` that is
not an embedding), their schemes from `config.json`'s `quantization_config` (compressed-tensors: config groups
with targets, and an ignore list), cross-checked against the tensors actually stored. Then the checks:

- keep-list: `lm_head`, the vision tower, DeltaNet `in_proj_a`/`in_proj_b` and embeddings are bf16;
- fused groups: modules vLLM fuses into one layer (`in_proj_qkv`+`in_proj_z`, q/k/v, gate/up, b/a) have one
  scheme and, where they carry one, equal `weight_global_scale` tensors;
- config and tensors agree: every module the config quantizes is stored quantized, and no other is;
- manifest: `clef_quant.json` present, valid and every sha256 matching, and no symlink anywhere (to a file or a
  folder: what it points at is no file of the release); a quantized folder without a manifest fails (it is
  unfinished, or clef-quant did not make it), and the other checks still run;
- code: no file that may run code (`.py`, pickles, shared libraries, scripts, executables) and no `auto_map` key
  unless the manifest lists it as included on purpose (`included`, or the files `card` added);
- head: `joint_head.safetensors` and `joint_head_config.json` at the root, where every engine looks (an older
  release's `clef_head/` passes with a note: only clef-vllm reads it);
- load safety (`audit.py`): scales finite and positive, no zeroed block or row where the bf16 source has values,
  every target and ignore entry matching a module, and the tensor names the architecture loads. Unlike the checks
  above it reads tensor values (one at a time) and builds the model on the meta device.

A `DIR.partial` (or any folder holding a writer marker of quantize, make-tiny, build-data or card) is
unfinished: it fails at once with one line, nothing else is read. A bf16 source release (no quantization_config,
no manifest, head at the root) is inspected as a source and says so: no manifest is expected, and code files are
noted, not failed (quantize leaves them out).
"""

from __future__ import annotations

from pathlib import Path

from clef_quant.families import family_of_folder
from clef_quant.quantize.audit import audit_release
from clef_quant.quantize.inspect_checks import (
    check_code,
    check_head,
    check_manifest,
    fused_group_violations,
    keep_list_violations,
    unfinished_violations,
)
from clef_quant.quantize.inspect_modules import ConfigSchemes, linear_modules
from clef_quant.quantize.inspect_report import (
    CHECK_COMPLETE,
    CHECK_CONSISTENT,
    CHECK_FUSED,
    CHECK_KEEP,
    RELEASE,
    SOURCE,
    UNFINISHED,
    CheckResult,
    InspectReport,
    check_result,
)
from clef_quant.quantize.recipes import is_kept_bf16
from clef_quant.quantize.schemes import BF16, fused_groups_of
from clef_quant.quantize.stored_tensors import group_by_module, read_tensor_index
from clef_quant.release_folder.manifest import ManifestError, read_manifest
from clef_vllm.errors import CheckpointError
from clef_vllm.format.release_config import read_release_config
from clef_vllm.format.release_source import BACKBONE_CONFIG
from clef_vllm.head.files import HEAD_SUBDIR


def inspect_checkpoint(folder: str | Path, *, verify_hashes: bool = True) -> InspectReport:
    """Inspect a release folder; the report's `violations` say what is wrong, each naming its module or file."""
    folder = Path(folder)
    unfinished = unfinished_violations(folder)
    if unfinished:
        checks = [CheckResult(CHECK_COMPLETE, "fail", "an unfinished quantize output")]
        return InspectReport(folder, [], checks, unfinished, kind=UNFINISHED)
    if not (folder / BACKBONE_CONFIG).is_file():
        raise CheckpointError(f"{folder} is not a checkpoint folder: it has no {BACKBONE_CONFIG}")
    config = read_release_config(folder)
    notes: list[str] = []
    quantization_config = config.quantization_config
    if quantization_config is None:
        notes.append("config.json has no quantization_config: the checkpoint is not quantized")
    elif not quantization_config.is_compressed_tensors:
        notes.append(f"quant_method is {quantization_config.quant_method!r}; only compressed-tensors configs are read")
        quantization_config = None

    index = read_tensor_index(folder)
    by_module = group_by_module(index)
    configured = ConfigSchemes(quantization_config, notes)
    modules, violations = linear_modules(by_module, configured)
    violations += keep_list_violations(modules)
    violations += fused_group_violations(modules, by_module)

    manifest, manifest_error = None, None
    try:
        manifest = read_manifest(folder)
    except ManifestError as exc:
        manifest_error = str(exc)
    is_source = quantization_config is None and manifest is None and manifest_error is None
    is_source = is_source and not (folder / HEAD_SUBDIR).exists()
    audit_checks = audit_release(
        folder, config, quantization_config, configured, index, by_module, manifest, violations, notes
    )
    manifest_check = check_manifest(folder, manifest, manifest_error, is_source, verify_hashes, violations)
    code_check = check_code(folder, manifest, is_source, violations, notes)
    head_check = check_head(folder, violations, notes)

    kept = [m.name for m in modules if m.scheme == BF16 and not is_kept_bf16(m.name)]
    if quantization_config is not None and kept:
        notes.append(
            f"{len(kept)} Linear module(s) outside the keep-list stay bf16: "
            + ", ".join(kept[:5])
            + (" ..." if len(kept) > 5 else "")
        )

    groups = fused_groups_of([m.name for m in modules])
    kept_count = sum(is_kept_bf16(m.name) for m in modules)
    quantized_count = sum(m.quantized for m in modules)
    checks = [
        check_result(CHECK_KEEP, violations, f"{kept_count} module(s) on the keep-list, all bf16"),
        check_result(CHECK_FUSED, violations, f"{len(groups)} fused group(s) consistent"),
        check_result(CHECK_CONSISTENT, violations, f"{quantized_count} quantized module(s) as configured"),
        *audit_checks,
        manifest_check,
        code_check,
        head_check,
    ]
    kind = SOURCE if is_source else RELEASE
    return InspectReport(folder, modules, checks, violations, notes, kind, family_of_folder(folder))
