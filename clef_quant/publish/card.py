"""`card`: write a quantized release's model card (`README.md`), its plots, and the sources it ships with.

Every fact on the card comes from a file, never from a hand-typed list: where the release came from from the
manifest (`provenance.py`); what is quantized and what stays bf16, sizes and files from the stored tensors and the
manifest (`folder_facts.py`); the numbers from RESULTS' `results.json` and the per-record probabilities, and the
throughput table from a `bench throughput` report's JSON (`results.py`). The words about each scheme come from its
recipe's front matter (`quantize/registry.py`), why a module stays bf16 from the keep-list (`quantize/recipes.py`);
the prose around them lives in the Jinja2 templates `model_cards/quantized.md.j2` and `model_cards/quantized_texts.j2`.

The sequence: check DIR (inspect, with the manifest hashes of the files `quantize` wrote); resolve the base model
and license; read RESULTS and check it evaluated DIR; render the card and plots and copy the sources into a staging
folder; check the card parses as a Hub model card; move everything into DIR and add it to the manifest
(see `folder.py`).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from clef_quant.card_templates import card_environment
from clef_quant.families import FAMILIES, VLLM, Family
from clef_quant.formatting import first_few, utc_timestamp
from clef_quant.publish import folder_facts
from clef_quant.publish.errors import PublishError
from clef_quant.publish.folder import (
    copy_trees,
    install_card_files,
    quantize_problems,
    require_manifest,
    staging_dir,
)
from clef_quant.publish.provenance import (
    default_repo_id,
    manifest_facts,
    resolve_base_model,
    resolve_license,
    source_front_matter,
)
from clef_quant.publish.reproduce import reproduce_commands
from clef_quant.publish.results import EvalResults, read_results, read_throughput
from clef_quant.publish.upload import validate_repo_id
from clef_quant.quantize.engines_loading import engine_rows
from clef_quant.quantize.recipes import keep_reasons
from clef_quant.quantize.registry import Registry, schemes
from clef_quant.release_folder.fingerprints import manifest_fingerprint
from clef_quant.release_folder.manifest import ASSETS_DIR, CARD_FILE, MANIFEST_FILE, Manifest, is_card_owned
from clef_quant.release_folder.versions import tool_versions
from clef_quant.throughput_report import ThroughputResult, report_facts, results_table
from clef_quant.tiny.card import made_by_make_tiny
from clef_vllm.head.files import HEAD_WEIGHTS, head_prefix

if TYPE_CHECKING:
    pass

TEMPLATE = "quantized.md.j2"
BASE_TAGS = ("clef", "systemone", "compressed-tensors", "llm-compressor", "vllm")
REQUIRED_FRONT_MATTER = ("license", "base_model", "base_model_relation", "library_name", "tags")
# The facts of a throughput report the card names next to its table (the rest are in the report itself).
THROUGHPUT_FACTS = ("machine", "device", "date", "records")
# The model-index entries per task: (results metric, Hub metric type, shown name).
EVAL_METRICS = (
    ("accuracy", "accuracy", "accuracy"),
    ("agreement", "agreement", "top-1 agreement with bf16"),
    ("kl", "kl_divergence", "KL(bf16 || this release), nats"),
)
EVAL_TASK_TYPE = "multiple-choice"  # every task is a SystemOne choice (or noul) over given options
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
    throughput: Path | None = None  # a `bench throughput` report's JSON, or its markdown with the JSON beside it
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
    warnings: list[str] = field(default_factory=list)


def write_card(config: CardConfig) -> CardResult:
    """Write DIR/README.md, DIR/assets/*.png, DIR/vllm_plugin/ and DIR/scripts/, and add them to the manifest."""
    from clef_quant.quantize.inspect import inspect_checkpoint
    from clef_quant.quantize.inspect_report import CHECK_MANIFEST

    folder = Path(config.folder)
    if not folder.is_dir():
        raise PublishError(f"{folder} is not a folder")
    manifest = require_manifest(folder)
    report = inspect_checkpoint(folder, verify_hashes=False)
    problems = [str(v) for v in report.violations if v.check != CHECK_MANIFEST]
    problems += [str(p) for p in quantize_problems(folder, manifest)]
    if problems:
        raise PublishError(
            f"{folder} fails its checks, so no card is written: {first_few(problems, 5)}; "
            f"see clef-quant inspect {folder}"
        )

    base_model, source_revision = resolve_base_model(manifest, config.base_model)
    front_matter = source_front_matter(manifest, folder)
    license_data = resolve_license(manifest, config.license, front_matter)
    repo_id = config.repo_id or default_repo_id(base_model, manifest.scheme)
    validate_repo_id(repo_id)  # the quickstart names it; a bad one would only fail at upload
    results = read_results(config.results, folder, manifest)
    tiny = made_by_make_tiny(front_matter)
    warnings: list[str] = []
    throughput = None
    if config.throughput:
        throughput = throughput_context(*read_throughput(config.throughput), manifest_fingerprint(manifest))
        if not throughput["rows"]:
            warnings.append(
                f"--throughput {config.throughput} did not measure {folder} (no row has its model fingerprint "
                f"{manifest_fingerprint(manifest)[:12]}; it measured {', '.join(throughput['folders'])}): the card "
                "says no throughput was measured; run clef-quant bench throughput on this folder"
            )

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
            config=config,
            tiny=tiny,
            staged_files=folder_facts.staged_sizes(staging),
        )
        text = render_card(context)
        check_card_text(text)
        (staging / CARD_FILE).write_text(text, encoding="utf-8")
        section = {
            "created": utc_timestamp(),
            "clef_quant": tool_versions(("clef-quant",))["clef-quant"],
            "repo_id": repo_id,
            "base_model": base_model,
            "license": license_data["license"],
            "results": {"folder": str(config.results), "sha256": results.json_sha256},
            "throughput": str(config.throughput) if throughput and throughput["rows"] else None,
        }
        updated = install_card_files(folder, staging, manifest, section)
    return CardResult(
        folder=folder,
        card=folder / CARD_FILE,
        repo_id=repo_id,
        plots=[plot["path"] for plot in plots],
        copied=len(copied),
        added=updated.card.files if updated.card is not None else [],
        warnings=warnings,
    )


def card_context(
    *,
    folder: Path,
    manifest: Manifest,
    report: Any,
    base_model: str,
    source_revision: str | None,
    license_data: dict[str, Any],
    repo_id: str,
    results: EvalResults,
    throughput: dict[str, Any] | None,
    plots: list[dict[str, str]],
    config: CardConfig,
    tiny: dict[str, Any] | None,
    staged_files: dict[str, int],
) -> dict[str, Any]:
    """Everything the template shows, as plain data (the templates hold prose and layout only)."""
    from huggingface_hub import ModelCardData

    scheme = manifest.scheme
    tables = folder_facts.quantization_tables(report)
    card_data = ModelCardData(
        base_model=base_model,
        license=license_data["license"],
        license_name=license_data.get("license_name"),
        license_link=license_data.get("license_link"),
        library_name="vllm",
        tags=list(dict.fromkeys([*BASE_TAGS[:2], scheme, *BASE_TAGS[2:]])),
        datasets=results.datasets or None,
        base_model_relation="quantized",
        model_name=repo_id,
        eval_results=eval_results(results) or None,
    )
    # Entries of an earlier card run are about to be replaced: the table shows quantize's files and the new ones.
    files = {k: v for k, v in manifest.files.items() if not is_card_owned(k)}
    name = repo_id.split("/", 1)[1]
    family = report.family or FAMILIES["clef-flash"]
    return {
        **manifest_facts(manifest),
        **scheme_words(schemes(), family),
        "model": {
            "name": family.name,
            "release": family.release,
            "architecture": family.architecture,
            "engine_architecture": family.engine_architecture,
            "native": family.served_by == VLLM,
            "moe": family.moe,
        },
        "card_data": card_data.to_yaml(),
        "title": name,
        "repo_id": repo_id,
        "name": name,
        "notice": config.notice,
        "tiny": tiny,
        "media": media_facts(tables),
        "base_model": base_model,
        "source_revision": source_revision,
        "labels": tables["labels"],
        "tables": tables,
        "other_tensors": folder_facts.other_tensors(folder, report),
        "engines": engine_rows(folder),
        "head": folder_facts.head_summary(folder),
        "backbone_bytes": folder_facts.backbone_bytes(files),
        "source_bytes": folder_facts.source_backbone_bytes(manifest),
        "results": results,
        "throughput": throughput,
        "plots": plots,
        "files": folder_facts.files_table(files, staged_files),
        "head_dir": f"{head_prefix(folder)}{HEAD_WEIGHTS}",
        "head_bytes": folder_facts.head_bytes(files),
        "manifest_file": MANIFEST_FILE,
        "reproduce": reproduce_commands(
            manifest,
            config,
            source_revision=source_revision,
            repo_id=repo_id,
            results=results,
            tiny=tiny,
            throughput_command=throughput["command"] if throughput and throughput["rows"] else None,
        ),
        "example_request": json.dumps({**EXAMPLE_REQUEST, "model": name}, indent=2),
    }


def scheme_words(registry: Registry, family: Family | None = None) -> dict[str, dict[str, str]]:
    """The card's words about scheme labels (each recipe's `card:` front matter) and `family`'s keep-list, by what
    the template looks them up with: a label, or a module kind."""
    texts = registry.card_texts()
    return {
        "scheme_descriptions": {label: text.description for label, text in texts.items()},
        "hardware_notes": {label: text.hardware for label, text in texts.items() if text.hardware},
        "cpu_notes": {label: text.cpu for label, text in texts.items() if text.cpu},
        "keep_reasons": keep_reasons(family),
    }


def throughput_context(result: ThroughputResult, command: str, fingerprint: str) -> dict[str, Any]:
    """The report's table and the facts the card names, rendered by the functions that wrote the report, and which
    of its rows measured this release's files (`rows`; none when the report measured other folders)."""
    facts = report_facts(result, command)
    return {
        "facts": {key: facts[key] for key in THROUGHPUT_FACTS},
        "table": results_table(result),
        "rows": [row.side for row in result.rows if row.sha256 == fingerprint],
        "folders": list(dict.fromkeys(row.folder for row in result.rows)),
        "command": command,
    }


def eval_results(results: EvalResults) -> list[Any]:
    """The Hub's structured eval results (`model-index`): this release's accuracy, top-1 agreement with the bf16
    reference and KL from it, per task. Local rows name their source, never a Hub dataset they only imitate."""
    from huggingface_hub import EvalResult

    found = []
    for task in results.tasks:
        spec = results.data_summary.tasks.get(task.name)
        if spec is None:  # All: not a dataset
            continue
        dataset_id = spec.dataset.id or task.name
        dataset = {
            "dataset_type": dataset_id if results.from_hub else f"{results.data_summary.source}/{dataset_id}",
            "dataset_name": task.label if results.from_hub else f"{task.label} (synthetic stand-in rows)",
            "dataset_config": spec.dataset.config,
            "dataset_split": spec.eval.split,
        }
        for metric, metric_type, metric_name in EVAL_METRICS:
            value = results.value(results.this, task.name, metric)
            if value == value:  # NaN: not measured for this task
                found.append(
                    EvalResult(
                        task_type=EVAL_TASK_TYPE,
                        task_name=task.label,
                        metric_type=metric_type,
                        metric_name=metric_name,
                        metric_value=round(float(value), 6),
                        **dataset,
                    )
                )
    return found


def media_facts(tables: dict[str, Any]) -> dict[str, Any]:
    """What the plugin serves of images and videos (its request limits), and whether this folder keeps the vision
    tower that reads them."""
    from clef_vllm.format.limits import DEFAULT_LIMITS

    return {
        "images": DEFAULT_LIMITS.max_images,
        "videos": DEFAULT_LIMITS.max_videos,
        "vision": any(row["kind"] == "vision" for row in tables["kept_rows"]),
    }


def render_card(context: dict[str, Any]) -> str:
    text = card_environment().get_template(TEMPLATE).render(**context)
    return re.sub(r"\n{3,}", "\n\n", text)  # template blocks that render empty leave blank runs


def check_card_text(text: str) -> None:
    """The card must parse as a Hub model card with the front matter the Hub uses for quantized models."""
    from huggingface_hub import ModelCard

    card = ModelCard(text, ignore_metadata_errors=False)
    data = card.data.to_dict()
    missing = [k for k in REQUIRED_FRONT_MATTER if not data.get(k)]
    if missing:
        raise PublishError(f"the rendered card lacks front matter keys: {', '.join(missing)}")
