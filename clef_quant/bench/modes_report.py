"""The markdown report of `clef-quant bench modes` (its JSON is the `ModesResult` itself)."""

from __future__ import annotations

import json
from pathlib import Path

from clef_quant.bench import report_paths
from clef_quant.bench.modes import MODES, ModeRun, ModesResult, median, percentile
from clef_quant.bench.modes_servers import ServerRun
from clef_quant.bench.profile_trace import Breakdown
from clef_quant.formatting import facts_table, markdown_table, utc_minute


def _rate(run: ModeRun) -> str:
    return f"{run.best_records_s:.1f}" if run.records_s else "n/a"


def _mixed(run: ModeRun) -> str:
    if not run.mixed_checked:
        return ""
    return f"{run.mixed_identical}/{run.mixed_checked} (max dp {run.mixed_max_dp:.2g})"


def _batched_peer(result: ModesResult, run: ModeRun) -> ModeRun | None:
    return next(
        (r for r in result.runs if r.scheme == run.scheme and r.mode == "batched" and r.records_s and r is not run),
        None,
    )


def _offline_invariant(result: ModesResult, scheme: str) -> ModeRun | None:
    return next((r for r in result.runs if r.scheme == scheme and r.mode == "invariant" and r.records_s), None)


def render_markdown(result: ModesResult) -> str:
    facts = {
        "machine": result.machine,
        "date": result.date or utc_minute(),
        "versions": result.versions,
        "command": f"`{result.command}`",
        "workload": f"{result.records} requests of {result.tokens / max(1, result.records):,.0f} prompt tokens on "
        f"average ({result.tokens:,} in all), {result.questions} questions each (`serving_requests`), "
        f"max model len {result.max_model_len}",
        "timing": "records/s: the best of the repeats of one `ClefEngine.logits` call over every request, after a "
        "warm-up; latency: single requests one after another; server: every request once at each client count",
    }
    lines = [*facts_table("Serving modes side by side: throughput, invariance, latency", facts), ""]
    lines += ["## Modes", ""]
    lines += [
        f"- `{mode.name}`: {mode.about}" for mode in MODES.values() if any(r.mode == mode.name for r in result.runs)
    ]
    lines += ["", "## Offline throughput and invariance", ""]
    rows = []
    for run in result.runs:
        if run.error:
            rows.append([run.scheme, run.mode, "failed", "", "", "", "", "", run.error])
            continue
        peer = _batched_peer(result, run)
        ratio = f"{run.best_records_s / peer.best_records_s:.2f}" if peer else ""
        rows.append(
            [
                run.scheme,
                run.mode,
                _rate(run),
                f"{max(run.tokens_s, default=0):,.0f}",
                ratio,
                f"{run.alone_identical}/{run.probes} (max dp {run.alone_max_dp:.2g})",
                _mixed(run),
                "yes" if run.repeats_identical else f"no (max dp {run.repeats_max_dp:.2g})",
                f"{run.start_s:.0f}",
            ]
        )
    header = [
        "release",
        "mode",
        "records/s",
        "tokens/s",
        "vs batched",
        "alone = in the batch",
        "alone = in mixed batches",
        "batch = batch again",
        "engine start s",
    ]
    lines += [markdown_table(header, rows, "llrrrrrrr"), ""]
    lines += ["## One request at a time (offline engine)", ""]
    latency = [
        [run.scheme, run.mode, f"{median(run.latency_ms):.1f}", f"{percentile(run.latency_ms, 0.95):.1f}"]
        for run in result.runs
        if run.latency_ms
    ]
    lines += [markdown_table(["release", "mode", "p50 ms", "p95 ms"], latency, "llrr"), ""]
    lines += _servers_section(result)
    for run in result.runs:
        for title, b in (
            ("Where one request's time goes", run.breakdown),
            (f"Where a request's time goes in one call over all {result.records}", run.batch_breakdown),
        ):
            if b is not None:
                lines += _breakdown_section(f"{title} ({run.scheme}, {run.mode})", b)
    lines += [f"- {note}" for note in result.notes]
    return "\n".join(lines).rstrip() + "\n"


def _servers_section(result: ModesResult) -> list[str]:
    """The servers at each client count. Rates, latencies and the comparison with one client are of answered
    requests only; a run whose requests failed shows how many and why, and no speed for them."""
    if not result.servers:
        return []
    rows, failures = [], []
    for server in result.servers:
        offline = _offline_invariant(result, server.scheme)
        # A report written before failures were told apart counted a failed request's time and its missing answer
        # (None == None) as a success: with errors, its rates and agreement say nothing.
        known = server.requests is not None or not server.errors
        speed = known and server.answered != 0
        if server.compared is not None:
            agreement = f"{server.identical_to_one_client}/{server.compared}" if server.compared else "none to compare"
        elif server.identical_to_one_client is not None and known:
            agreement = f"{server.identical_to_one_client}/{result.records}"
        else:
            agreement = ""
        rows.append(
            [
                server.server,
                server.scheme,
                str(server.clients),
                f"{server.requests_s:.1f}" if speed else "—",
                f"{median(server.latency_ms):.1f}" if speed and server.latency_ms else "—",
                f"{percentile(server.latency_ms, 0.95):.1f}" if speed and server.latency_ms else "—",
                f"{server.requests_s / offline.best_records_s:.2f}" if offline and speed else "",
                agreement,
                str(server.errors) if server.requests is None else f"{server.errors}/{server.requests}",
            ]
        )
        if server.errors:
            clients = f"{server.clients} client{'' if server.clients == 1 else 's'}"
            why = f"the first with `{server.first_error}`" if server.first_error else "why was not recorded"
            failed = f"{server.errors} of {server.requests}" if server.requests else str(server.errors)
            failures.append(f"- {server.server}, {server.scheme}, {clients}: {failed} requests failed, {why}")
    header = ["server", "release", "clients", "requests/s", "p50 ms", "p95 ms", "vs offline", "answers = 1 client"]
    lines = ["## Servers: clef-systemone (default mode) and native vLLM", ""]
    lines += [markdown_table([*header, "errors"], rows), ""]
    if failures:
        lines += [
            "Requests/s, latencies and the answers compared with one client count answered requests only: a failed "
            "request has no speed and equals no other answer.",
            "",
            *failures,
            "",
        ]
    return lines


def server_failures(result: ModesResult) -> list[str]:
    """One line per server and release whose requests failed: how many of those sent, and the first reason."""
    found: dict[tuple[str, str], list[ServerRun]] = {}
    for server in result.servers:
        if server.errors:
            found.setdefault((server.server, server.scheme), []).append(server)
    lines = []
    for (name, scheme), runs in found.items():
        sent = sum(run.requests or 0 for run in runs)
        reason = next((run.first_error for run in runs if run.first_error), None)
        lines.append(
            f"{name}, {scheme}: {sum(run.errors for run in runs)} of {sent or '?'} requests failed"
            + (f" (first: {reason})" if reason else "")
            + "; the report gives them no speed and no agreement"
        )
    return lines


def _breakdown_section(title: str, b: Breakdown) -> list[str]:
    if not b.gpu:
        rows = [["wall time per request", f"{b.wall_ms:.2f}", "100%"]]
        table = markdown_table(["part", "ms per request", "share"], rows)
        note = "CPU only: the trace has no GPU kernels to sum by part of the model"
        return [f"## {title}", "", table, "", f"{note}; trace `{b.trace}`.", ""]
    rows = [[part, f"{ms:.2f}", f"{ms / b.wall_ms:.0%}" if b.wall_ms else ""] for part, ms in b.parts_ms.items()]
    rows.append(["GPU idle (scheduling, IPC, launch gaps)", f"{b.idle_ms:.2f}", f"{b.idle_ms / b.wall_ms:.0%}"])
    rows.append(["wall time per request", f"{b.wall_ms:.2f}", "100%"])
    table = markdown_table(["part", "ms per request", "share"], rows)
    return [f"## {title}", "", table, "", f"{b.kernels:.0f} kernels per request; trace `{b.trace}`.", ""]


def write_report(result: ModesResult, out: Path) -> list[Path]:
    from dataclasses import asdict

    return report_paths.write_report(out, render_markdown(result), json.dumps(asdict(result), indent=2))
