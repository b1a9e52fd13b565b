"""`clef-quant card` and `clef-quant upload` on the tiny release, after a real quantize and a real eval.

The card is made from real outputs: the tiny checkpoint quantized by clef-quant (FP8_DYNAMIC), a DATA folder built
from the fixtures, and `clef-quant eval` through the vLLM plugin. Uploads go to `tests/hub_server.py`, a small Hub
stand-in on loopback that records every call, reached through HF_ENDPOINT by a real `clef-quant upload` process.
What is not exercised here: the real Hub, its Xet storage (the library's LFS path is taken instead), its
authentication and its own front matter validation (the stand-in checks only that the YAML parses).
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shlex
import shutil
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from PIL import Image
from test_eval import SharedEngines
from typer.testing import CliRunner

from clef_quant.card_templates import card_environment
from clef_quant.cli import app
from clef_quant.evaluation.config import EvalConfig
from clef_quant.evaluation.metrics import METRICS, format_value
from clef_quant.evaluation.report import write_results
from clef_quant.evaluation.results import ALL
from clef_quant.evaluation.runner import run_eval
from clef_quant.formatting import markdown_table
from clef_quant.publish.card import EXAMPLE_REQUEST, REQUIRED_FRONT_MATTER
from clef_quant.publish.errors import PublishError
from clef_quant.publish.folder import tree_files
from clef_quant.publish.provenance import resolve_base_model, resolve_license
from clef_quant.publish.provenance import source_front_matter as read_source_front_matter
from clef_quant.quantize.engines_loading import Verdict, engine_rows
from clef_quant.quantize.inspect import inspect_checkpoint
from clef_quant.release_folder.manifest import MANIFEST_FILE, CardEntry, Manifest, is_shipped_recipe, read_manifest
from clef_quant.release_folder.writer import OWNER_FILE, Writer, boot_id, process_start_ticks
from clef_vllm.format.request import parse_request
from tests.hub_server import AGENT_REGISTRY, LocalHub

# One of the longest modules: handed out early, so both workers end together (tests/plugins/work_units.py).
pytestmark = pytest.mark.unit(order=90)

FIXTURES = Path(__file__).resolve().parents[1] / "eval" / "fixtures"
REPO = Path(__file__).resolve().parents[1]
PER_TASK = 2
ENGINE_KWARGS = {"max_num_batched_tokens": 4096}  # the plugin tests' engines: shared, not started again
REPO_ID = "clef-test/clef-tiny-FP8_DYNAMIC"
BASE_MODEL = "Cloudflare/clef-flash"
TOKEN = "hf_test_token_0123456789"
PLOTS = ("assets/accuracy_agreement.png", "assets/kl_per_task.png", "assets/probability_scatter.png")
TAGS = {"clef", "systemone", "fp8-dynamic", "compressed-tensors", "llm-compressor", "vllm"}


def tables(text: str) -> list[str]:
    """Every pipe table of a markdown text, each verbatim: what a reader of results.md or a report sees."""
    found: list[str] = []
    current: list[str] = []
    for line in [*text.splitlines(), ""]:
        if line.startswith("|"):
            current.append(line)
            continue
        if len(current) >= 2 and re.match(r"^\|[\s:|-]+\|$", current[1]):
            found.append("\n".join(current))
        current = []
    return found


def cli(*args: str) -> Any:
    return CliRunner().invoke(app, [str(a) for a in args])


def upload_process(
    hub_url: str | None, *args: str, token: str | None = TOKEN, home: Path
) -> subprocess.CompletedProcess:
    """`clef-quant upload` as its own process: huggingface_hub reads HF_ENDPOINT and HF_TOKEN when imported."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("HF_")}
    env.update(HF_HOME=str(home), HF_HUB_DISABLE_XET="1", HF_HUB_DISABLE_TELEMETRY="1", NO_PROXY="127.0.0.1")
    if hub_url:
        env["HF_ENDPOINT"] = hub_url
    if token:
        env["HF_TOKEN"] = token
    command = [sys.executable, "-c", "from clef_quant.cli import main; main()", "upload", *args]
    return subprocess.run(command, env=env, capture_output=True, text=True, timeout=300)


@pytest.fixture(scope="module")
def results_dir(tiny_dir: Path, quantized_dir: Any, clef_engine: Any, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A real RESULTS folder: build-data on the fixtures, then eval of the tiny FP8_DYNAMIC folder."""
    root = tmp_path_factory.mktemp("release-eval")
    built = cli(
        "build-data", "--out", root / "data", "--source", FIXTURES, "--per-task", PER_TASK, "--calibration-count", 0
    )
    assert built.exit_code == 0, built.output
    config = EvalConfig(
        reference=str(tiny_dir),
        candidates=[str(quantized_dir("fp8-dynamic"))],
        data=root / "data",
        out=root / "results",
        max_model_len=clef_engine(tiny_dir, **ENGINE_KWARGS).max_length,
    )
    run = run_eval(config, engines=SharedEngines(clef_engine, config.max_model_len))
    write_results(run.results, config.out)
    return config.out


def manifest_of(folder: Path) -> Manifest:
    manifest = read_manifest(folder)
    assert manifest is not None, f"{folder} has no {MANIFEST_FILE}"
    return manifest


def card_section(folder: Path) -> CardEntry:
    card = manifest_of(folder).card
    assert card is not None, f"{folder}'s manifest has no card section"
    return card


def fresh_copy(quantized_dir: Any, tmp_path: Path, name: str = "tiny-FP8_DYNAMIC") -> Path:
    folder = tmp_path / name
    shutil.copytree(quantized_dir("fp8-dynamic"), folder)
    return folder


def write_card(folder: Path, results: Path, *extra: str) -> Any:
    return cli(
        "card", folder, "--results", results, "--base-model", BASE_MODEL, "--license", "apache-2.0",
        "--repo-id", REPO_ID, *extra,
    )  # fmt: skip


@pytest.fixture(scope="module")
def carded(quantized_dir: Any, results_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A carded copy of the tiny FP8_DYNAMIC folder; tests that change it take their own copy."""
    folder = fresh_copy(quantized_dir, tmp_path_factory.mktemp("carded"))
    result = write_card(folder, results_dir, "--notice", "Test build from random weights.")
    assert result.exit_code == 0, result.output
    return folder


# -- the card ------------------------------------------------------------------------------------------------


@pytest.mark.slow
def test_card_parses_with_the_hub_front_matter(carded: Path) -> None:
    from huggingface_hub import ModelCard

    card = ModelCard.load(carded / "README.md")
    data = card.data.to_dict()
    assert all(data.get(key) for key in REQUIRED_FRONT_MATTER)
    assert data["base_model"] == BASE_MODEL and data["base_model_relation"] == "quantized"
    assert data["library_name"] == "vllm" and data["license"] == "apache-2.0"
    assert set(data["tags"]) == TAGS
    assert "datasets" not in data  # fixture rows are not the datasets; only a Hub-sourced DATA names them
    assert card.text.lstrip().startswith("# clef-tiny-FP8_DYNAMIC")


def side_group_cells(table: str) -> dict[tuple[str, str, str], str]:
    """A card table with a column group per side: (side name, metric title, task title) -> the cell shown."""
    lines = [[c.strip() for c in re.split(r"(?<!\\)\|", line)[1:-1]] for line in table.splitlines()]
    header, rows = lines[0], lines[2:]
    cells = {}
    for row in rows:
        for title, shown in zip(header[3:], row[3:], strict=True):
            side, metric = title.replace("\\|", "|").rsplit(" · ", 1)
            cells[side, metric.rsplit(" ", 1)[0], row[0].strip("*")] = shown
    return cells


def expected_cells(results_dir: Path, level: str) -> dict[tuple[str, str, str], str]:
    """What a column group per side must show, from results.json itself: every side, every metric it measures."""
    results = json.loads((results_dir / "results.json").read_text())
    titles = {t["name"]: t["title"] for t in results["tasks"]} | {ALL: ALL}
    expected = {}
    for side in results["sides"]:
        for metric in (m for m in METRICS if m.level == level):
            if side["role"] == "reference" and metric.compares:
                continue  # the reference against itself: 100% / 0 by construction, not shown
            for task, title in titles.items():
                value = results["values"][side["key"]][task][metric.name]
                expected[side["name"], metric.title, title] = format_value(
                    metric, float("nan") if value is None else value
                )
    return expected


@pytest.mark.slow
def test_card_front_matter_has_the_eval_results_of_every_task(carded: Path, results_dir: Path) -> None:
    """model-index, as the Hub's parser reads it: accuracy, agreement and KL of this release for each task."""
    from huggingface_hub import ModelCard

    results = json.loads((results_dir / "results.json").read_text())
    this = next(s for s in results["sides"] if s["role"] == "candidate")
    summary = results["data"]["summary"]["tasks"]
    card = ModelCard.load(carded / "README.md", ignore_metadata_errors=False)
    assert card.data.model_name == REPO_ID
    found = {(r.task_name, r.metric_type): r for r in card.data.eval_results}
    tasks = [t for t in results["tasks"] if t["name"] != ALL]
    assert len(tasks) == 7 and len(found) == len(card.data.eval_results) == 7 * 3
    for task in tasks:
        for metric, metric_type in (("accuracy", "accuracy"), ("agreement", "agreement"), ("kl", "kl_divergence")):
            entry = found[task["title"], metric_type]
            assert entry.metric_value == pytest.approx(results["values"][this["key"]][task["name"]][metric], abs=1e-6)
            assert (
                entry.task_type == "multiple-choice" and entry.dataset_split == summary[task["name"]]["eval"]["split"]
            )
            # Fixture rows: named as stand-ins, never as the Hub dataset they imitate.
            dataset_id = summary[task["name"]]["dataset"]["id"]
            assert entry.dataset_type == f"eval/fixtures/{dataset_id}" and "stand-in" in entry.dataset_name


@pytest.mark.slow
def test_card_prose_says_what_the_release_is(
    quantized_dir: Any, tiny_dir: Path, results_dir: Path, tmp_path: Path
) -> None:
    """Without --notice: the random-weights warning (from make-tiny's card), what the plugin serves of media, and
    the commands that made it, from its real source and with every flag."""
    folder = fresh_copy(quantized_dir, tmp_path)
    result = write_card(folder, results_dir, "--no-plots")
    assert result.exit_code == 0, result.output
    card = (folder / "README.md").read_text()
    intro = card.split("## Contents")[0]
    assert "> **Warning:** random weights" in intro and "`clef-quant make-tiny`" in intro and "seed 0" in intro
    hardware, limits = section(card, "Hardware"), section(card, "Limits")
    assert "not served" not in card
    assert "the clef-vllm plugin serves them through every front end" in hardware
    assert "up to 8 images and 2 videos per request" in hardware
    assert "Images and videos are served (see Hardware) but not evaluated here" in limits
    reproduce = section(card, "Reproduce").split("```bash\n")[1].split("```")[0].splitlines()
    assert reproduce == [
        f"clef-quant make-tiny {tiny_dir} --size tiny --seed 0",
        f"clef-quant build-data --out {results_dir.parent / 'data'} --source fixtures --per-task {PER_TASK} "
        "--calibration-count 0 --seed 0",
        f"clef-quant quantize {tiny_dir} --scheme fp8-dynamic --out {folder}",
        f"clef-quant eval --reference {tiny_dir} --candidate {quantized_dir('fp8-dynamic')} "
        f"--data {results_dir.parent / 'data'} --out {results_dir} --max-model-len 4096 --enforce-eager "
        "--engine-arg max_num_batched_tokens=4096",  # the shared engines' own engine argument
        f"clef-quant card {folder} --results {results_dir} --base-model {BASE_MODEL} --license apache-2.0 "
        f"--repo-id {REPO_ID} --no-plots",
        f"clef-quant upload {folder} --repo-id {REPO_ID}",
    ]
    assert BASE_MODEL not in "\n".join(reproduce[:4])  # quantized from the tiny folder, not from clef-flash


@pytest.mark.slow
def test_the_cards_build_data_command_rebuilds_the_records_it_was_measured_on(
    carded: Path, results_dir: Path, tmp_path: Path
) -> None:
    """The command is run, not read: with --out elsewhere it writes the very evaluation records eval scored."""
    reproduce = section((carded / "README.md").read_text(), "Reproduce").split("```bash\n")[1].split("```")[0]
    words = shlex.split(next(line for line in reproduce.splitlines() if line.startswith("clef-quant build-data")))
    words[words.index("--out") + 1] = str(tmp_path / "again")
    rebuilt = CliRunner().invoke(app, words[1:])
    assert rebuilt.exit_code == 0, rebuilt.output
    measured = results_dir.parent / "data"
    files = sorted(p.relative_to(measured) for p in measured.rglob("*.jsonl"))
    assert files and files == sorted(p.relative_to(tmp_path / "again") for p in (tmp_path / "again").rglob("*.jsonl"))
    for name in files:
        assert (tmp_path / "again" / name).read_bytes() == (measured / name).read_bytes(), name


@pytest.mark.slow
def test_card_shows_every_side_and_quality_metric_of_results_json(carded: Path, results_dir: Path) -> None:
    card = (carded / "README.md").read_text()
    details = card.split("<summary>Every side and every metric")[1].split("</details>")[0]
    quality = next(t for t in tables(details) if t.startswith("| task | records | questions |"))
    assert side_group_cells(quality) == expected_cells(results_dir, "question")
    # The short table of this release: one row per task and All, the noise floor beside it.
    summary = card.split("| task | bf16 acc |")[1].split("\n\n")[0].splitlines()
    assert len(summary) == 2 + 7 + 1 and summary[-1].startswith("| **All** |")
    # How sure: every side's intervals over All, this release against the noise floor, its paired differences
    from clef_quant.evaluation.results import read_results
    from clef_quant.evaluation.tables import INDISTINGUISHABLE

    results = read_results(results_dir)
    sure = card.split("**How sure these numbers are.**")[1].split("<details>")[0]
    floor_words = "at the floor" if results.at_floor(results.candidates[0]) else "below the floor"
    assert f"this release is {floor_words}" in " ".join(sure.split())
    every_side, differences = tables(sure)
    assert len(every_side.splitlines()) == 2 + len(results.sides)
    rows = differences.splitlines()[2:]
    assert len(rows) == 4  # this release minus the noise floor: acc, agree, KL, TV
    for row in rows:
        low, high = (float(x.split()[0]) for x in row.split(" | ")[3].strip("[]").split(", "))
        assert (INDISTINGUISHABLE in row) == (low <= 0 <= high), row


def section(card: str, title: str) -> str:
    """One `## title` section of a card, up to the next one."""
    return card.split(f"\n## {title}\n")[1].split("\n## ")[0]


@pytest.mark.slow
def test_card_without_a_throughput_report_says_none_was_measured(carded: Path, results_dir: Path) -> None:
    throughput = section((carded / "README.md").read_text(), "Throughput")
    assert "No throughput was measured for this release" in throughput and "records/s" not in throughput
    speed = next(t for t in tables(throughput) if t.startswith("| task | records | questions |"))
    assert side_group_cells(speed) == expected_cells(results_dir, "record")  # eval's own timing, named as such


def fingerprint(folder: Path) -> str:
    from clef_quant.release_folder.fingerprints import folder_fingerprint

    return folder_fingerprint(folder).sha256


def throughput_report(tmp_path: Path, measured: str | None = None) -> Path:
    """A `bench throughput` report as the bench writes it: markdown, with its JSON beside it. Its FP8 row measured
    the folder of fingerprint `measured` (None: a report from before rows named their files)."""
    from clef_quant.throughput_report import ThroughputResult, ThroughputRow, write_report

    counts = {"records": 8, "tokens": 4000}
    rows = (
        ThroughputRow(
            side="bf16 reference",
            runner="transformers",
            folder="tiny",
            **counts,
            seconds=4.0,
            load_seconds=1.0,
            sha256="0" * 64,
        ),
        ThroughputRow(
            side="plugin FP8_DYNAMIC",
            runner="vLLM plugin",
            folder="tiny-FP8_DYNAMIC",
            **counts,
            seconds=0.5,
            load_seconds=3.0,
            sha256=measured,
        ),
    )
    report = ThroughputResult(
        machine="test machine", date="2026-01-01 00:00 UTC", load="0.0", versions={}, source="data", **counts,
        batch_size=8, max_model_len=4096, device="cpu", engine={}, rows=rows,
    )  # fmt: skip
    markdown, _ = write_report(report, "clef-quant bench throughput ...", tmp_path / "throughput-test.md")
    return markdown


@pytest.mark.slow
@pytest.mark.parametrize("given", ["markdown", "json"])
def test_card_shows_a_throughput_report(quantized_dir: Any, results_dir: Path, tmp_path: Path, given: str) -> None:
    folder = fresh_copy(quantized_dir, tmp_path)
    markdown = throughput_report(tmp_path, measured=fingerprint(folder))
    path = markdown if given == "markdown" else markdown.with_suffix(".json")
    result = write_card(folder, results_dir, "--throughput", path, "--no-plots")
    assert result.exit_code == 0, result.output
    throughput = section((folder / "README.md").read_text(), "Throughput")
    table = next(t for t in tables(markdown.read_text()) if "records/s" in t)
    assert table in throughput and "machine: test machine" in throughput
    assert '"plugin FP8_DYNAMIC" row measured these very files' in throughput
    assert card_section(folder).throughput == str(path)


@pytest.mark.slow
@pytest.mark.parametrize("measured", [None, "f" * 64])
def test_card_shows_no_throughput_of_other_folders(
    quantized_dir: Any, results_dir: Path, tmp_path: Path, measured: str | None
) -> None:
    """A report of other files (or one that does not say which) is not this release's throughput."""
    folder = fresh_copy(quantized_dir, tmp_path)
    markdown = throughput_report(tmp_path, measured=measured)
    result = write_card(folder, results_dir, "--throughput", markdown, "--no-plots")
    assert result.exit_code == 0, result.output
    assert f"warning: --throughput {markdown} did not measure {folder}" in result.output
    card = (folder / "README.md").read_text()
    throughput = section(card, "Throughput")
    assert "No throughput was measured for this release" in throughput and '"tiny-FP8_DYNAMIC"' in throughput
    assert "records/s" not in throughput and "test machine" not in card
    assert "bench throughput ..." not in section(card, "Reproduce")
    assert card_section(folder).throughput is None


@pytest.mark.slow
def test_card_refuses_a_throughput_report_without_its_json(
    quantized_dir: Any, results_dir: Path, tmp_path: Path
) -> None:
    markdown = throughput_report(tmp_path)
    markdown.with_suffix(".json").unlink()
    folder = fresh_copy(quantized_dir, tmp_path)
    result = write_card(folder, results_dir, "--throughput", markdown, "--no-plots")
    assert result.exit_code == 2 and "throughput-test.json is missing" in result.output
    assert not (folder / "README.md").exists()


@pytest.mark.slow
def test_card_reads_results_json_only(quantized_dir: Any, results_dir: Path, tmp_path: Path) -> None:
    """The card's tables come from results.json: without results.md and results.csv the card is the same."""
    only_json = tmp_path / "results"
    shutil.copytree(results_dir, only_json)
    (only_json / "results.md").unlink()
    (only_json / "results.csv").unlink()
    cards = []
    for name, results in (("with", results_dir), ("without", only_json)):
        folder = fresh_copy(quantized_dir, tmp_path / name)
        result = write_card(folder, results, "--no-plots")
        assert result.exit_code == 0, result.output
        # Reproduce names the folders this run was given; everything else must not move.
        card = (folder / "README.md").read_text()
        # The paths' lengths move where prose lines wrap, so words are compared, not line breaks.
        cards.append(" ".join(card.replace(str(results), "RESULTS").replace(str(folder), "FOLDER").split()))
    assert cards[0] == cards[1]
    assert "RESULTS" in cards[0] and "FOLDER" in cards[0]
    first_card = (tmp_path / "with" / "tiny-FP8_DYNAMIC" / "README.md").read_text()
    assert tables((results_dir / "results.md").read_text())[0] in first_card  # the sides, with model sha256


@pytest.mark.slow
@pytest.mark.parametrize("plot", PLOTS)
def test_plots_are_png_with_content(carded: Path, plot: str) -> None:
    assert f"]({plot})" in (carded / "README.md").read_text()
    with Image.open(carded / plot) as image:
        assert image.format == "PNG" and image.width >= 600 and image.height >= 300
        pixels = image.convert("RGB").resize((200, 120))
        colors = pixels.getcolors(maxcolors=200 * 120)
    assert colors is not None and len(colors) > 20  # bars, points, text: not a blank canvas
    white = max(count for count, color in colors if color == (255, 255, 255))
    assert white < 0.95 * 200 * 120


@pytest.mark.slow
def test_card_states_what_inspect_reads(carded: Path) -> None:
    card = (carded / "README.md").read_text()
    quantized = card.split("## What is quantized")[1].split("What stays bf16")[0]
    kept = card.split("What stays bf16")[1].split("The backbone's other tensors")[0]
    report = inspect_checkpoint(carded)
    for module in report.modules:
        assert f"| `{module.kind}` |" in (kept if module.scheme == "bf16" else quantized), module.name
    assert {"lm_head", "vision", "linear_attn.in_proj_a", "linear_attn.in_proj_b"} <= {
        m.kind for m in report.modules if m.scheme == "bf16"
    }
    files = card.split("## Files")[1].split("## Limits")[0]
    for name in manifest_of(carded).files:
        top = name.split("/", 1)[0]
        assert f"`{name}`" in files or f"`{top}/ (" in files, name


def test_card_engine_table_is_the_engines_checks(carded: Path) -> None:
    """The card's engines table is what engines_loading and engines_compat say of these files, row for row."""
    section = (carded / "README.md").read_text().split("\n## Engines\n")[1].split("\n## Hardware\n")[0]
    header, _, *lines = tables(section)[0].splitlines()
    rows = [table_cells(line) for line in lines]
    checked = engine_rows(carded)
    assert table_cells(header)[0] == "engine" and len(rows) == len(checked)
    assert [(row[0], row[3]) for row in rows] == [(r["engine"], r["loads"]) for r in checked]
    assert {r["verdict"] for r in checked} == {Verdict.LOADS, None}


def table_cells(line: str) -> list[str]:
    """A pipe-table row as a Markdown renderer splits it: at every `|` not escaped as `\\|`."""
    return [cell.strip() for cell in re.split(r"(?<!\\)\|", line)[1:-1]]


@pytest.mark.slow
def test_every_card_table_is_one_the_table_writer_writes(carded: Path) -> None:
    """Each table, read back into header, alignment and cells, is written again by markdown_table to the same text:
    no table of the card is laid out by hand."""
    found = tables((carded / "README.md").read_text())
    assert len(found) >= 7  # facts, quantized, kept, the task summary, sides, quality, files
    for table in found:
        header, rule, *rows = table.splitlines()
        align = "".join("r" if cell.endswith(":") else "l" for cell in table_cells(rule))
        assert markdown_table(table_cells(header), [table_cells(row) for row in rows], align) == table


@pytest.mark.slow
def test_card_files_join_the_manifest_and_inspect_passes(carded: Path) -> None:
    manifest = manifest_of(carded)
    section = card_section(carded)
    added = set(section.files)
    assert {"README.md", *PLOTS} <= added
    assert {f"vllm_plugin/{n}" for n in tree_files(REPO / "vllm_plugin")} <= added
    assert {n for n in added if n.startswith("scripts/")} == {"scripts/patch_torchvision.py"}
    assert not any("__pycache__" in n or ".egg-info" in n or n.endswith(".pyc") for n in added)
    assert added <= set(manifest.files) and section.repo_id == REPO_ID
    assert [p.name for p in carded.parent.iterdir()] == [carded.name]  # the staging folder is gone
    report = inspect_checkpoint(carded)
    assert report.ok, report.violations


@pytest.mark.slow
def test_card_again_replaces_its_own_files(quantized_dir: Any, results_dir: Path, tmp_path: Path) -> None:
    folder = fresh_copy(quantized_dir, tmp_path)
    assert write_card(folder, results_dir).exit_code == 0
    (folder / "assets" / "stale.png").write_bytes(b"left from an earlier card")
    again = write_card(folder, results_dir, "--no-plots")
    assert again.exit_code == 0, again.output
    assert not (folder / "assets").exists()
    assert inspect_checkpoint(folder).ok


@pytest.mark.slow
def test_card_never_removes_a_staging_folder_a_live_run_writes(
    quantized_dir: Any, results_dir: Path, tmp_path: Path
) -> None:
    folder = fresh_copy(quantized_dir, tmp_path)
    staging = tmp_path / f"{folder.name}.card.partial"
    staging.mkdir()
    live = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
    try:
        writer = Writer(live.pid, process_start_ticks(live.pid), boot_id(), socket.gethostname())
        (staging / OWNER_FILE).write_text(writer.to_json())
        (staging / "README.md").write_text("being written")
        result = write_card(folder, results_dir)
    finally:
        live.kill()
        live.wait()
    assert result.exit_code == 2
    assert f"{staging} is being written by process {live.pid}; wait for it or stop it" in result.output
    assert (staging / "README.md").read_text() == "being written" and not (folder / "README.md").exists()


@pytest.mark.slow
def test_card_keeps_the_eval_fingerprint_of_the_folder(quantized_dir: Any, carded: Path) -> None:
    from clef_quant.release_folder.fingerprints import folder_fingerprint, manifest_fingerprint

    before = folder_fingerprint(quantized_dir("fp8-dynamic")).sha256
    # Results (and stored probabilities) of the uncarded folder still match the carded one.
    assert folder_fingerprint(carded).sha256 == before
    assert manifest_fingerprint(manifest_of(carded)) == before


@pytest.mark.slow
def test_card_refuses_a_tampered_folder(quantized_dir: Any, results_dir: Path, tmp_path: Path) -> None:
    folder = fresh_copy(quantized_dir, tmp_path)
    config = folder / "config.json"
    config.write_text(config.read_text().replace('"bfloat16"', '"float16 "', 1))  # same size: only the hash tells
    result = write_card(folder, results_dir)
    assert result.exit_code == 2 and "config.json: sha256 mismatch" in result.output
    assert not (folder / "README.md").exists()


@pytest.mark.slow
def test_card_refuses_results_of_another_folder(quantized_dir: Any, results_dir: Path, tmp_path: Path) -> None:
    folder = tmp_path / "tiny-NVFP4"
    shutil.copytree(quantized_dir("nvfp4"), folder)
    result = write_card(folder, results_dir)
    assert result.exit_code == 2 and "did not evaluate" in result.output
    assert not (folder / "README.md").exists()


# -- provenance (pure) ---------------------------------------------------------------------------------------


def manifest_with(**sections: Any) -> Manifest:
    """A valid manifest holding `sections`, and of everything else the least a manifest has."""
    least = {"format": "clef-quant-manifest/1", "source": {}, "scheme": "fp8-dynamic", "recipe": {}, "tools": {}}
    return Manifest.model_validate({**least, "calibration": {}, "run": {}, "files": {}, **sections})


def quantize_command(manifest: Manifest) -> str:
    from clef_quant.publish.reproduce import quantize_command_line

    return quantize_command_line(manifest, manifest.source.id, manifest.source.revision, "out")


def test_license_comes_from_the_source_card(tmp_path: Path) -> None:
    (tmp_path / "README.md").write_text("---\nlicense: other\nlicense_name: clef\nlicense_link: LICENSE\n---\n# x\n")
    manifest = manifest_with(source={"id": str(tmp_path), "local": True})
    found = resolve_license(manifest, None, read_source_front_matter(manifest))
    assert found == {"license": "other", "license_name": "clef", "license_link": "LICENSE"}
    assert resolve_license(manifest, "mit", {}) == {"license": "mit"}
    with pytest.raises(PublishError, match="pass --license"):
        resolve_license(manifest, None, {})


def test_license_comes_from_the_source_card_quantize_carried(tmp_path: Path) -> None:
    """The source folder may be gone by the time `card` runs; its card travelled as source_card.md."""
    (tmp_path / "source_card.md").write_text("---\nlicense: apache-2.0\n---\n# x\n")
    manifest = manifest_with(source={"id": str(tmp_path / "moved-away"), "local": True})
    assert read_source_front_matter(manifest) == {}
    found = resolve_license(manifest, None, read_source_front_matter(manifest, tmp_path))
    assert found == {"license": "apache-2.0"}


def test_base_model_comes_from_the_manifest_source() -> None:
    commit = "a" * 40
    hub = manifest_with(source={"id": "Cloudflare/clef-flash", "revision": commit, "local": False})
    assert resolve_base_model(hub, None) == ("Cloudflare/clef-flash", commit)
    cached = manifest_with(source={"id": f"/c/hub/models--Cloudflare--clef-flash/snapshots/{commit}", "local": True})
    assert resolve_base_model(cached, None) == ("Cloudflare/clef-flash", commit)
    with pytest.raises(PublishError, match="pass --base-model"):
        resolve_base_model(manifest_with(source={"id": "artifacts/tiny", "local": True}), None)


def shipped_recipe(scheme: str) -> str:
    from clef_quant.quantize.recipes import scheme_recipe_path

    return str(scheme_recipe_path(scheme))


@pytest.mark.parametrize(
    ("recipe", "words"),
    [
        # Written before `shipped` was recorded: the path says whether the recipe was a --scheme's own.
        ({"file": "<shipped fp8-dynamic>", "text": "x"}, "--scheme fp8-dynamic"),
        ({"file": "my/recipe.yaml", "text": "x"}, "--recipe my/recipe.yaml"),
        # Recorded: a shipped file given as --recipe (the scheme then reads `custom`) is rebuilt with --recipe.
        ({"file": "<shipped fp8-dynamic>", "text": "x", "shipped": False}, "--recipe <shipped fp8-dynamic>"),
        ({"file": "<shipped fp8-dynamic>", "text": "x", "shipped": True}, "--scheme fp8-dynamic"),
    ],
)
def test_reproduce_tells_a_shipped_recipe_from_a_recipe_file(recipe: dict[str, Any], words: str) -> None:
    path = shipped_recipe("fp8-dynamic")
    recipe = {**recipe, "file": recipe["file"].replace("<shipped fp8-dynamic>", path)}
    manifest = manifest_with(source={"id": "acme/model", "local": False}, recipe=recipe)
    assert f" {words.replace('<shipped fp8-dynamic>', path)} " in quantize_command(manifest)


def test_a_manifest_reads_back_as_the_file_it_was(tmp_path: Path) -> None:
    """A manifest written by an older clef-quant (no `included`, no `shipped`, a section of another tool, integer
    seconds) is read, and written back byte for byte; `card` adds its section and changes nothing else."""
    from clef_quant.release_folder.manifest import write_manifest

    old = {
        "format": "clef-quant-manifest/1",
        "source": {"id": "acme/model", "revision": "b" * 40, "local": False},
        "scheme": "fp8-dynamic",
        "recipe": {"file": shipped_recipe("fp8-dynamic"), "text": "stage: {}\n", "variables": {"layers": 2}},
        "tools": {"clef-quant": "0.1.0", "torch": None},
        "calibration": {"source": None, "sha256": None, "records": 0, "tokens": 0, "max_seq_len": 2048},
        "run": {"device": "cpu", "seconds": {"total": 3, "copy": 0.25}, "peak_gpu_bytes": None},
        "files": {"config.json": {"sha256": "c" * 64, "size": 2}},
        "notes": {"written by": "another tool"},
    }
    (tmp_path / MANIFEST_FILE).write_text(json.dumps(old, indent=2, ensure_ascii=False) + "\n")
    before = (tmp_path / MANIFEST_FILE).read_bytes()
    manifest = manifest_of(tmp_path)
    assert is_shipped_recipe(manifest.recipe) and manifest.run.seconds["total"] == 3 and manifest.card is None
    write_manifest(tmp_path, manifest)
    assert (tmp_path / MANIFEST_FILE).read_bytes() == before
    card = {"repo_id": "acme/model-FP8_DYNAMIC", "files": []}
    assert manifest.with_card(manifest.files, card).to_json() == {**old, "card": card}


def test_quickstart_request_is_a_valid_systemone_request() -> None:
    parse_request(EXAMPLE_REQUEST)


@pytest.mark.parametrize(
    ("calibration", "line"),
    [
        (None, "none: FP8_DYNAMIC needs no data"),
        (
            {"source": "data/calibration.jsonl", "records": 1000, "tokens": 512000, "max_seq_len": 2048},
            "1,000 SystemOne requests, 512,000 tokens, at most 2,048 per request, from `data/calibration.jsonl`",
        ),
        (
            {
                "source": "data/calibration.jsonl", "records": 1000, "requested": 1024, "skipped": {"too long": 24},
                "tokens": 512000, "max_seq_len": 2048, "truncated": 3,
            },
            "1,000 SystemOne requests of 1,024 asked for (skipped 24: too long), 512,000 tokens, at most 2,048 per "
            "request (3 cut to fit), from `data/calibration.jsonl`",
        ),
    ],
)  # fmt: skip
def test_calibration_line_says_what_calibration_saw(calibration: dict[str, Any] | None, line: str) -> None:
    texts = card_environment().get_template("quantized_texts.j2").module
    assert str(texts.calibration_line(calibration, ["FP8_DYNAMIC"])) == line


# -- upload --------------------------------------------------------------------------------------------------


def expected_files(folder: Path) -> list[str]:
    return sorted([*manifest_of(folder).files, MANIFEST_FILE])


@pytest.mark.slow
def test_dry_run_lists_every_file_and_sends_nothing(carded: Path, tmp_path: Path) -> None:
    with LocalHub(TOKEN) as hub:
        done = upload_process(hub.url, str(carded), "--repo-id", REPO_ID, "--dry-run", home=tmp_path)
    assert done.returncode == 0, done.stderr
    # path -> size (two files may have the same size)
    sizes = {path: int(size) for size, path in re.findall(r"^\s+(\d+)\s+(\S+)$", done.stdout, flags=re.MULTILINE)}
    assert sorted(sizes) == expected_files(carded)
    # The model repo gets what serves it: the plugin and the CPU fix, not the project's demo or fixture scripts.
    assert [p for p in sizes if p.startswith("scripts/")] == ["scripts/patch_torchvision.py"]
    assert "vllm_plugin/pyproject.toml" in sizes
    assert all(sizes[p] == (carded / p).stat().st_size for p in sizes)
    assert f"would create public model repo {REPO_ID}" in done.stdout and "token: found" in done.stdout
    assert [c for c in hub.calls if c.path != AGENT_REGISTRY] == []


@pytest.mark.slow
def test_upload_pushes_the_folder_in_one_commit(carded: Path, tmp_path: Path) -> None:
    with LocalHub(TOKEN) as hub:
        done = upload_process(hub.url, str(carded), "--repo-id", REPO_ID, "--private", home=tmp_path)
        assert done.returncode == 0, done.stderr
        again = upload_process(hub.url, str(carded), "--repo-id", REPO_ID, "--revision", "v2", home=tmp_path)
        assert again.returncode == 0, again.stderr
    repo = hub.repos[REPO_ID]
    assert repo.private
    first, second = repo.commits
    assert first["revision"] == "main" and second["revision"] == "v2"
    assert sorted(first["files"]) == expected_files(carded)
    for name, content in first["files"].items():
        assert hashlib.sha256(content).digest() == hashlib.sha256((carded / name).read_bytes()).digest(), name
    assert set(first["lfs"]) == {"model.safetensors", "joint_head.safetensors", *PLOTS}
    assert "base_model_relation: quantized" in hub.validated[0]
    unexpected = [c for c in hub.calls if c.status >= 400 and c.path != AGENT_REGISTRY]
    assert [(c.path, c.status) for c in unexpected] == [("/api/repos/create", 409)]  # the second run's repo exists
    assert len(hub.calls_to(r"/commit/")) == 2 and len(hub.calls_to(r"/branch/v2$")) == 1
    assert f"/{REPO_ID}/commit/" in done.stdout and second["summary"] == first["summary"]


def tamper_weights(folder: Path) -> None:
    with open(folder / "model.safetensors", "r+b") as handle:
        handle.seek(-1, os.SEEK_END)
        last = handle.read(1)
        handle.seek(-1, os.SEEK_END)
        handle.write(bytes([last[0] ^ 0xFF]))


def add_stray_file(folder: Path) -> None:
    (folder / "notes.txt").write_text("not made by clef-quant")


def drop_card(folder: Path) -> None:
    (folder / "README.md").unlink()


@pytest.mark.slow
@pytest.mark.parametrize(
    ("change", "message"),
    [
        (tamper_weights, "model.safetensors: sha256 mismatch"),
        (add_stray_file, "notes.txt: not in manifest"),
        (drop_card, "README.md: missing"),
    ],
)
def test_upload_refuses_a_folder_that_differs_from_its_manifest(
    carded: Path, tmp_path: Path, change: Any, message: str
) -> None:
    folder = tmp_path / "release"
    shutil.copytree(carded, folder)
    change(folder)
    with LocalHub(TOKEN) as hub:
        done = upload_process(hub.url, str(folder), "--repo-id", REPO_ID, home=tmp_path)
    assert done.returncode == 2 and f"refused: {message}" in done.stderr
    assert "Traceback" not in done.stderr and hub.repos == {}


@pytest.mark.slow
def test_upload_refuses_a_folder_without_card(quantized_dir: Any, tmp_path: Path) -> None:
    with LocalHub(TOKEN) as hub:
        done = upload_process(hub.url, str(quantized_dir("fp8-dynamic")), "--repo-id", REPO_ID, home=tmp_path)
    assert done.returncode == 2 and "refused: README.md: no model card" in done.stderr
    assert hub.repos == {}


@pytest.mark.slow
def test_upload_refuses_a_card_written_for_another_repo(carded: Path, tmp_path: Path) -> None:
    done = upload_process(None, str(carded), "--repo-id", "someone/else", "--dry-run", home=tmp_path)
    assert done.returncode == 2 and f"written for {REPO_ID}, not someone/else" in done.stderr


@pytest.mark.slow
def test_upload_without_token_is_one_clear_line(carded: Path, tmp_path: Path) -> None:
    with LocalHub(TOKEN) as hub:
        done = upload_process(hub.url, str(carded), "--repo-id", REPO_ID, token=None, home=tmp_path)
    assert done.returncode == 2
    assert done.stderr.splitlines()[0] == "error: no Hugging Face token: set HF_TOKEN or run `hf auth login`"
    assert [c for c in hub.calls if c.path != AGENT_REGISTRY] == []


@pytest.mark.slow
def test_a_hub_refusal_is_one_line(carded: Path, tmp_path: Path) -> None:
    with LocalHub(TOKEN, refuse_create=True) as hub:
        done = upload_process(hub.url, str(carded), "--repo-id", REPO_ID, home=tmp_path)
    assert done.returncode == 2 and "Traceback" not in done.stderr
    assert f"error: the Hub refused to create the repo for {REPO_ID} (403)" in done.stderr
    assert hub.calls_to(r"/commit/") == []


def test_upload_rejects_a_bad_repo_id(tmp_path: Path) -> None:
    result = cli("upload", tmp_path, "--repo-id", "no-slash", "--dry-run")
    assert result.exit_code == 2 and "--repo-id must be ORG/NAME" in result.output


def test_manifest_is_written_whole_and_only_when_valid(tmp_path: Path) -> None:
    # Written through a temporary file (a leftover would show up as a stray file), and validated first: a manifest
    # that `inspect` would reject must never replace one it accepts.
    from clef_quant.release_folder.manifest import ManifestError, build_manifest, write_manifest

    (tmp_path / "config.json").write_text("{}\n")
    manifest = build_manifest(
        tmp_path, source={"id": "x", "local": True}, scheme="fp8-dynamic", recipe={}, calibration={}, run={}
    )
    write_manifest(tmp_path, manifest)
    assert read_manifest(tmp_path) == manifest
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(["config.json", MANIFEST_FILE])
    with pytest.raises(ManifestError, match=r"refusing to write an invalid clef_quant\.json: format"):
        write_manifest(tmp_path, {"files": {}})
    assert read_manifest(tmp_path) == manifest
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(["config.json", MANIFEST_FILE])
