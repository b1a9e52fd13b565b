"""The commands that made a release folder, rebuilt from its manifest and RESULTS (not from shell history)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from clef_quant.publish.results import EvalResults


def reproduce_commands(
    manifest: dict[str, Any],
    base_model: str,
    source_revision: str | None,
    name: str,
    repo_id: str,
    results: EvalResults,
) -> list[str]:
    """build-data, quantize, eval, card and upload, with the flags that give this folder and these numbers."""
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
