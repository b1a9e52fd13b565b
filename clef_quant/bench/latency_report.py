"""The markdown report of `clef-quant bench latency` (its JSON is the `LatencyResult` itself)."""

from __future__ import annotations

from pathlib import Path

from clef_quant.bench import report_paths
from clef_quant.bench.flide_workloads import MULTIRC_QUESTIONS
from clef_quant.bench.latency import PROFILED_REQUESTS, LatencyResult, ReleaseLatency
from clef_quant.bench.modes import MODES
from clef_quant.bench.profile_trace import MEMCPY, OTHER, PARTS, POOLER
from clef_quant.formatting import facts_table, markdown_table

TITLE = "One request at a time: the Flide workloads"
HEADER = (
    "release",
    "mode",
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
        "engine": f"each release in its mode (invariant: the default), images on, max model len "
        f"{result.max_model_len}; settings: {settings}",
        "Flide, SGLang": "the medians Flide's documentation publishes for the 27B (clef) on one H200, one request "
        "at a time: p50 / Flide compares like with like for a clef release measured on an H200",
    }
    lines = [*facts_table(TITLE, facts), ""]
    lines += ["## Releases", ""]
    releases = [
        [f"`{run.release}`", run.mode, run.model, run.scheme, f"{run.start_s:.0f}", run.error or ""]
        for run in result.releases
    ]
    header = ["release", "mode", "model", "scheme", "engine start s", "error"]
    lines += [markdown_table(header, releases, "llllrl"), ""]
    lines += _modes_section(result.releases)
    lines += ["## Latency", ""]
    rows = [
        [
            f"`{run.release}`",
            run.mode,
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
    lines += [markdown_table(HEADER, rows, "lll" + "r" * (len(HEADER) - 3)), ""]
    lines += _profile_section(result.releases)
    return "\n".join(lines)


def _modes_section(releases: list[ReleaseLatency]) -> list[str]:
    """What each mode other than the default changes, where a run used one."""
    used = sorted({run.mode for run in releases} - {"invariant"})
    if not used:
        return []
    return [*(f"- `{name}`: {MODES[name].about}" for name in used), ""]


# The parts in a fixed order, so that two releases' rows read side by side.
PROFILE_PARTS = (*(part for part, _ in PARTS), POOLER, OTHER, MEMCPY)


def _profile_section(releases: list[ReleaseLatency]) -> list[str]:
    profiled = [(run, w, w.breakdown) for run in releases for w in run.workloads if w.breakdown is not None]
    if not profiled:
        return []
    header = ("release", "mode", "workload", *PROFILE_PARTS, "GPU idle", "engine wall", "kernels")
    rows = []
    for run, w, b in profiled:
        parts = [f"{b.parts_ms.get(part, 0.0):.2f}" if b.gpu else "" for part in PROFILE_PARTS]
        idle = f"{b.idle_ms:.2f}" if b.gpu else ""
        rows.append([f"`{run.release}`", run.mode, w.workload, *parts, idle, f"{b.wall_ms:.2f}", f"{b.kernels:.0f}"])
    lines = ["## Where one request's engine time goes (ms, torch profiler)", ""]
    lines += [markdown_table(header, rows, "lll" + "r" * (len(header) - 3)), ""]
    lines.append(
        f"Each workload {PROFILED_REQUESTS} more times after its timed requests, under vLLM's torch profiler: GPU "
        "kernel time summed by part of the model (kernel names, `clef_quant.bench.profile_trace`), the GPU's idle "
        "time (scheduling, IPC, launch gaps), and the wall time of the engine call (encoding and answers left out), "
        "per request."
    )
    if any(not b.gpu for _, _, b in profiled):
        lines.append("A row with only its wall time ran on a CPU: its trace has no GPU kernels to sum by part.")
    lines.append("")
    return lines


def write_report(result: LatencyResult, out: Path) -> list[Path]:
    """The markdown at `out` and the JSON beside it (same stem)."""
    return report_paths.write_report(out, render_markdown(result), result.model_dump_json(indent=2) + "\n")
