"""Failed requests in the serving benchmarks: counted as errors with their first reason, never as throughput, and
never as agreement. `bench modes --serve-native` on vLLM 0.32 (no native Clef class) fails every request, so it is
the reproduction: it used to report hundreds of requests/s, "14x offline" and "8/8" answers equal to one client's."""

from __future__ import annotations

import asyncio
import re
from pathlib import Path

import pytest

from clef_quant.bench import serve
from clef_quant.bench.modes import ModeRun, ModesResult
from clef_quant.bench.modes_report import render_markdown, server_failures
from clef_quant.bench.modes_servers import (
    CLIENT_COUNTS,
    NATIVE,
    ServerRun,
    identical_answers,
    serve_at_client_counts,
)
from clef_quant.bench.processes import free_port
from clef_quant.bench.workload import serving_requests

RECORDS = 8


def server_rows(report: str) -> list[list[str]]:
    table = report.split("## Servers")[1].split("\n\n")[1]
    return [[c.strip() for c in line.split("|")[1:-1]] for line in table.splitlines()[2:]]


def test_two_failed_answers_are_not_an_agreement() -> None:
    assert identical_answers([None, None, None], [None, None, None]) == (0, 0)
    assert identical_answers([[1], None, [3]], [[1], [2], [4]]) == (1, 2)  # only the pairs both answered


def test_a_report_written_before_failures_were_told_apart_shows_no_speed_for_them() -> None:
    result = ModesResult(machine="m", versions="v", command="c", records=RECORDS, tokens=800, questions=3,
                         max_model_len=1024)  # fmt: skip
    result.runs = [ModeRun("f", "bf16", "invariant", {}, 1.0, records_s=[19.0])]
    # as such a report recorded `vllm serve` failing every request: the failures' time as speed, None == None
    result.servers = [
        ServerRun("f", "bf16", "vLLM's defaults", 8, 417.3, [15.7] * RECORDS, RECORDS, RECORDS, NATIVE),
        ServerRun("f", "bf16", "invariant", 8, 18.1, [400.0] * RECORDS, 0, RECORDS),  # no errors: as measured
    ]
    failed, fine = server_rows(render_markdown(result))
    assert failed[3:8] == ["—", "—", "—", "", ""] and failed[8] == str(RECORDS)
    assert fine[3] == "18.1" and fine[6] == "0.95" and fine[7] == f"{RECORDS}/{RECORDS}"


@pytest.mark.slow
def test_a_native_server_that_fails_every_request_reports_its_errors_not_a_speed(tiny_dir: Path) -> None:
    bodies = serving_requests(RECORDS, seed=0, state_words=20)
    runs = serve_at_client_counts(tiny_dir, "bf16", bodies, 1024, ["--enforce-eager"], NATIVE)

    assert [run.clients for run in runs] == list(CLIENT_COUNTS)
    for run in runs:
        assert (run.requests, run.errors, run.answered) == (RECORDS, RECORDS, 0)
        assert run.requests_s == 0 and run.latency_ms == []
        assert re.match(r"HTTP [45]\d\d: \S", run.first_error or ""), run.first_error  # 501: no structured decision API
    assert [(run.identical_to_one_client, run.compared) for run in runs[1:]] == [(0, 0)] * 2

    result = ModesResult(machine="m", versions="v", command="c", records=RECORDS, tokens=800, questions=3,
                         max_model_len=1024)  # fmt: skip
    result.runs = [ModeRun(str(tiny_dir), "bf16", "invariant", {}, 1.0, records_s=[19.0])]  # an offline rate to beat
    result.servers = runs
    report = render_markdown(result)
    rows = server_rows(report)
    assert len(rows) == len(CLIENT_COUNTS)
    for cells in rows:
        requests_s, p50, vs_offline, agreement, errors = cells[3], cells[4], cells[6], cells[7], cells[8]
        assert (requests_s, p50, vs_offline, errors) == ("—", "—", "", f"{RECORDS}/{RECORDS}")
        assert agreement in ("", "none to compare")
    assert runs[0].first_error in report
    (warning,) = server_failures(result)
    assert f"{len(CLIENT_COUNTS) * RECORDS} of {len(CLIENT_COUNTS) * RECORDS} requests failed" in warning
    assert runs[0].first_error in warning


def test_bench_serve_counts_requests_nobody_answered_as_errors_not_speed() -> None:
    bodies = serving_requests(4, seed=0, state_words=20)
    url = f"http://127.0.0.1:{free_port()}"  # nothing listens: every request fails to connect
    rate, tally = asyncio.run(serve._clients(url, bodies, clients=2))
    assert rate == 0 and (tally.answered, tally.errors) == (0, 4)
    assert tally.first_error is not None and tally.first_error.startswith("ConnectError")

    result = serve.ServeBenchResult(model="m", records=4, tokens=400, clients=2, offline_records_s=19.0)
    result.server_errors, result.server_first_error = 2 * tally.errors, tally.first_error
    report = serve.render_markdown(result, "c", "m")
    assert "server / offline | — |" in report  # no ratio from a server that answered nothing
    assert f"Server errors: 8 of 8 requests, the first: `{tally.first_error}`" in report
    assert '"server_over_offline": null' in serve.result_json(result)


def test_a_long_input_that_gets_no_answer_is_a_failed_row_not_a_traceback() -> None:
    """`bench serve --long-inputs`: a server that holds a request past its timeout (vLLM's priority queue can starve
    a long one) gave a row with the time waited and why, and counted the small requests it never answered."""
    import socket
    import threading

    from clef_quant.bench.long_inputs import behind

    listener = socket.create_server(("127.0.0.1", 0))
    held: list[socket.socket] = []
    stop = threading.Event()

    def accept_and_never_answer() -> None:
        listener.settimeout(0.1)
        while not stop.is_set():
            try:
                held.append(listener.accept()[0])
            except TimeoutError:
                continue

    thread = threading.Thread(target=accept_and_never_answer)
    thread.start()
    try:
        url = f"http://127.0.0.1:{listener.getsockname()[1]}"
        row = behind(url, "state: held", b"{}", clients=2, timeouts=(1.0, 0.5))
    finally:
        stop.set()
        thread.join()
        for connection in held:
            connection.close()
        listener.close()
    assert (row.status, row.error_code) == (0, "no answer in 1 s")
    assert row.seconds >= 1.0
    assert row.small_errors == len(row.small_seconds) >= 2
