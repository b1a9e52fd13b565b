"""The markdown report of `clef-quant bench latency` (its JSON is the `LatencyResult` itself)."""

from __future__ import annotations

from pathlib import Path

from clef_quant.bench import report_paths
from clef_quant.bench.flide_workloads import MULTIRC_QUESTIONS
from clef_quant.bench.latency import LatencyResult
from clef_quant.formatting import facts_table, markdown_table

TITLE = "One request at a time: the Flide workloads"
HEADER = (
    "release",
    "workload",
    "requests",
    "input tokens",
    "state tokens",
    "p50 ms",
    "p95 ms",
    "encode p50 ms",
    "Flide p50 ms",
    "SGLang p50 ms",
    "p50 / Flide",
)


def render_markdown(result: LatencyResult) -> str:
    versions = ", ".join(f"{name} {version}" for name, version in result.versions.items() if version)
    settings = ", ".join(f"{key}={value}" for key, value in result.engine.items()) or "the defaults"
    facts = {
        "machine": result.machine,
        "date": result.date,
        "versions": versions,
        "command": f"`{result.command}`",
        "workloads": "five SystemOne requests shaped like Flide's (`clef_quant.bench.flide_workloads`): "
        f"decision-index, race, multirc ({MULTIRC_QUESTIONS} questions), quality (6-8k state tokens), gqa (one "
        "image)",
        "timing": f"each workload once untimed, then {result.repeats} requests of it one after another, each from "
        "its body to its answers on one `ClefEngine` (encode p50: of that, validating and encoding the body)",
        "engine": f"default mode (invariant), images on, max model len {result.max_model_len}; settings: {settings}",
        "Flide, SGLang": "the medians Flide's documentation publishes for the 27B (clef) on one H200, one request "
        "at a time: p50 / Flide compares like with like for a clef release measured on an H200",
    }
    lines = [*facts_table(TITLE, facts), ""]
    lines += ["## Releases", ""]
    releases = [
        [f"`{run.release}`", run.model, run.scheme, f"{run.start_s:.0f}", run.error or ""] for run in result.releases
    ]
    lines += [markdown_table(["release", "model", "scheme", "engine start s", "error"], releases, "lllrl"), ""]
    lines += ["## Latency", ""]
    rows = [
        [
            f"`{run.release}`",
            w.workload,
            str(len(w.latency_ms)),  # fewer than the repeats where the run was stopped early
            f"{w.input_tokens:,}",
            f"{w.state_tokens:,}",
            f"{w.p50_ms:.1f}",
            f"{w.p95_ms:.1f}",
            f"{w.encode_p50_ms:.1f}",
            f"{w.flide_ms:.1f}",
            f"{w.sglang_ms:.1f}",
            f"{w.p50_over_flide:.2f}",
        ]
        for run in result.releases
        for w in run.workloads
    ]
    lines += [markdown_table(HEADER, rows, "ll" + "r" * (len(HEADER) - 2)), ""]
    return "\n".join(lines)


def write_report(result: LatencyResult, out: Path) -> list[Path]:
    """The markdown at `out` and the JSON beside it (same stem)."""
    return report_paths.write_report(out, render_markdown(result), result.model_dump_json(indent=2) + "\n")
