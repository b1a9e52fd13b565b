"""clef-quant against plain llm-compressor on the same checkpoint: wall time and peak host and GPU memory.

Each measurement runs in its own process, so peak resident memory belongs to that run alone. "plain" is what a
user of llm-compressor writes: load the model from disk, `oneshot` with the same recipe (and, for the NVFP4
family, the same calibration token ids), `save_pretrained(save_compressed=True)`. "clef" is `clef-quant
quantize` end to end as a user runs it (plan, quantize, save, copy head and tokenizer, hash, manifest, rename):
for the data-free schemes that is the streaming path. For those, two more sides run: "model-free" is plain
`model_free_ptq` on the backbone's files with the ignore list the streaming path uses (it cannot read a Clef
folder as it is), and "clef-oneshot" is `clef-quant quantize --no-streaming`.

    clef-quant bench quantize-vs-plain --model /scratch/flash --work /scratch/bench --device cuda \\
        --scheme fp8-dynamic --scheme nvfp4 --calibration-records 512 --max-seq-len 2048 \\
        --out bench/results/quantize-h200.json
    clef-quant bench quantize-vs-plain --model /scratch/flash --work /scratch/bench --device cpu \
        --scheme fp8-dynamic --out bench/results/quantize-h200-cpu.json   # the same machine's CPUs only

The JSON results hold every stage's seconds, the peaks, the ratios clef/plain and the goals (clef within 1.3x
of plain per scheme; FP8_DYNAMIC end to end under 120 s; peak host memory under 1.3x the bf16 size);
`render_markdown` summarizes them and `write_report` writes both. Each side's process is this module run with one
`--child` argument, a JSON `SideJob`: an internal entry, not a command.
"""

from __future__ import annotations

import json
import os
import platform
import shutil
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from clef_quant.formatting import binary_size, decimal_size, markdown_table, utc_timestamp
from clef_quant.progress import Progress, Stages
from clef_quant.quantize.measure import peak_gpu_bytes, peak_host_bytes
from clef_quant.quantize.release_files import backbone_bytes
from clef_quant.release_folder.versions import tool_versions

if TYPE_CHECKING:
    from clef_quant.quantize.run import QuantizeResult

GOAL_RATIO = 1.3
GOAL_FP8_SECONDS = 120.0
GOAL_HOST_RATIO = 1.3
GOAL_STREAMING_RATIO = 1.3  # the streaming path against plain model_free_ptq
SIDES = ("plain", "clef")  # measured in this order for every scheme
STREAMING_SIDES = ("plain", "model-free", "clef-oneshot", "clef")  # for the schemes that stream by default


def _peaks(device: str) -> dict[str, int | None]:
    return {"peak_host_bytes": peak_host_bytes(), "peak_gpu_bytes": peak_gpu_bytes(device)}


def run_plain(source: Path, out: Path, scheme: str, records: int, max_seq_len: int, device: str) -> dict[str, Any]:
    """Plain llm-compressor on the same recipe and calibration ids; returns seconds per stage and peaks."""
    started = time.perf_counter()
    import torch
    import transformers
    from llmcompressor import oneshot

    from clef_quant.quantize.calibration import as_dataloader, build_calibration
    from clef_quant.quantize.plan import parse_recipe, recipe_needs_calibration
    from clef_quant.quantize.recipes import load_recipe
    from clef_vllm.format.encoder import load_tokenizer

    seconds: dict[str, float] = {"imports": time.perf_counter() - started}
    config = json.loads((source / "config.json").read_text())
    recipe = load_recipe(scheme, None, config)
    tokenizer = load_tokenizer(source)
    kwargs: dict[str, Any] = {}
    if recipe_needs_calibration(parse_recipe(recipe.text)):
        kwargs = {
            "dataset": as_dataloader(build_calibration(tokenizer, records=records, max_seq_len=max_seq_len)),
            "processor": tokenizer,
        }
    mark = time.perf_counter()
    model_class = getattr(transformers, config["architectures"][0])
    model = model_class.from_pretrained(source, dtype=torch.bfloat16, device_map=device if device != "cpu" else None)
    seconds["load"] = time.perf_counter() - mark
    mark = time.perf_counter()
    layers = model.get_submodule("model.language_model.layers")
    oneshot(model=model, recipe=recipe.text, sequential_targets=[type(layers[0]).__name__], **kwargs)
    seconds["oneshot"] = time.perf_counter() - mark
    mark = time.perf_counter()
    model.save_pretrained(str(out), save_compressed=True)
    seconds["save"] = time.perf_counter() - mark
    seconds["total"] = time.perf_counter() - started
    return {"seconds": seconds, **_peaks(device)}


def run_model_free(
    source: Path, out: Path, scheme: str, ignore: Sequence[str], device: str, view: Path
) -> dict[str, Any]:
    """Plain `model_free_ptq` with the recipe's config and `ignore`, on `view`: the backbone's own files only."""
    started = time.perf_counter()
    from llmcompressor import model_free_ptq

    from clef_quant.quantize.plan import parse_recipe
    from clef_quant.quantize.recipes import load_recipe

    seconds: dict[str, float] = {"imports": time.perf_counter() - started}
    config = json.loads((source / "config.json").read_text())
    resolved = parse_recipe(load_recipe(scheme, None, config).text).modifiers[0].resolved_config
    mark = time.perf_counter()
    model_free_ptq(view, out, config=resolved.model_copy(update={"ignore": []}), ignore=list(ignore), device=device)
    seconds["model_free_ptq"] = time.perf_counter() - mark
    seconds["total"] = time.perf_counter() - started
    return {"seconds": seconds, **_peaks(device)}


def model_free_inputs(source: Path, scheme: str, view: Path) -> list[str] | None:
    """For a scheme that streams by default: the ignore list the streaming path gives model-free PTQ, and `view`
    filled with links to the backbone's files (config, index, shards); None for any other scheme."""
    from clef_quant.quantize.plan import parse_recipe
    from clef_quant.quantize.recipes import load_recipe
    from clef_quant.quantize.registry import schemes
    from clef_quant.quantize.streaming import INDEX_FILE, plan_streaming

    if scheme not in schemes().streaming_default():
        return None
    config = json.loads((source / "config.json").read_text())
    splan = plan_streaming(source, config, parse_recipe(load_recipe(scheme, None, config).text))
    shutil.rmtree(view, ignore_errors=True)
    view.mkdir(parents=True)
    for name in ["config.json", *splan.source.shards, *([INDEX_FILE] if (source / INDEX_FILE).is_file() else [])]:
        (view / name).symlink_to((source / name).resolve())
    return list(splan.model_free_config.ignore)


def quantize_into(
    source: Path,
    out: Path,
    scheme: str,
    *,
    calibration_records: int,
    max_seq_len: int,
    device: str = "cpu",
    streaming: bool | None = None,
    **auto: Any,
) -> QuantizeResult:
    """`clef-quant quantize` end to end into `out` (replaced if there), as every quantize benchmark measures it;
    `auto` holds the scan and target of `--scheme auto`."""
    from clef_quant.quantize.run import QuantizeConfig, quantize

    config = QuantizeConfig(
        source=str(source),
        out=out,
        scheme=scheme,
        calibration_records=calibration_records,
        max_seq_len=max_seq_len,
        device=device,
        overwrite=True,
        streaming=streaming,
        **auto,
    )
    return quantize(config)


def run_clef(
    source: Path, out: Path, scheme: str, records: int, max_seq_len: int, device: str, streaming: bool | None = None
) -> dict[str, Any]:
    started = time.perf_counter()
    result = quantize_into(
        source, out, scheme, calibration_records=records, max_seq_len=max_seq_len, device=device, streaming=streaming
    )
    seconds = {**result.timings, "total": time.perf_counter() - started}
    return {"seconds": seconds, **_peaks(device), "calibration": result.calibration.to_dict(), "path": result.path}


@dataclass(frozen=True)
class SideJob:
    """One side of one scheme, as its own process receives it."""

    side: str  # one of SIDES
    source: str
    out: str
    scheme: str
    records: int
    max_seq_len: int
    device: str
    ignore: list[str] | None = None  # model-free: the ignore list
    view: str | None = None  # model-free: the folder of links to the backbone's files


class SideFailed(RuntimeError):
    """A side's process ended with an error; the message ends with the last lines it wrote to stderr."""


def _run_side(job: SideJob) -> dict[str, Any]:
    out = Path(job.out)
    shutil.rmtree(out, ignore_errors=True)
    command = [sys.executable, "-m", __name__, "--child", json.dumps(asdict(job))]
    started = time.perf_counter()
    completed = subprocess.run(command, capture_output=True, text=True, check=False)
    wall = time.perf_counter() - started
    if completed.returncode != 0:
        raise SideFailed(f"{job.side} {job.scheme} failed (exit {completed.returncode}):\n{completed.stderr[-4000:]}")
    measured = json.loads(completed.stdout.strip().splitlines()[-1])
    measured["process_wall_seconds"] = wall
    measured["out_bytes"] = sum(p.stat().st_size for p in out.rglob("*") if p.is_file())
    shutil.rmtree(out, ignore_errors=True)
    return measured


def compare(
    source: Path,
    schemes: Sequence[str],
    *,
    work: Path,
    records: int,
    max_seq_len: int,
    device: str,
    progress: Progress | None = None,
) -> dict[str, Any]:
    """Both sides of every scheme, each in its own process (outputs under `work`, removed after measuring)."""
    stage = Stages(progress)
    work.mkdir(parents=True, exist_ok=True)
    bf16_bytes = backbone_bytes(source)
    results: dict[str, Any] = {
        "source": str(source),
        "bf16_backbone_bytes": bf16_bytes,
        "device": device,
        "records": records,
        "max_seq_len": max_seq_len,
        "host": platform.node(),
        "cpus": os.cpu_count(),
        "date": utc_timestamp(),
        "versions": tool_versions(source_trees=True),
        "schemes": {},
    }
    for scheme in schemes:
        view = work / "model-free-source"
        ignore = model_free_inputs(source, scheme, view)
        measured = {}
        for side in SIDES if ignore is None else STREAMING_SIDES:
            stage(f"{scheme}: {SIDE_NAMES[side]}")
            job = SideJob(
                side,
                str(source),
                str(work / f"{side}-{scheme}"),
                scheme,
                records,
                max_seq_len,
                device,
                ignore=ignore if side == "model-free" else None,
                view=str(view) if side == "model-free" else None,
            )
            measured[side] = _run_side(job)
        shutil.rmtree(view, ignore_errors=True)
        plain, clef = measured["plain"], measured["clef"]
        ratio = clef["process_wall_seconds"] / plain["process_wall_seconds"]
        goals = {
            f"clef within {GOAL_RATIO}x of plain": ratio <= GOAL_RATIO,
            f"peak host under {GOAL_HOST_RATIO}x bf16": clef["peak_host_bytes"] <= GOAL_HOST_RATIO * bf16_bytes,
        }
        if scheme == "fp8-dynamic":
            goals[f"end to end under {GOAL_FP8_SECONDS:.0f} s"] = clef["seconds"]["total"] <= GOAL_FP8_SECONDS
        entry = {**measured, "wall_ratio": ratio, "goals": goals}
        if "model-free" in measured:
            streaming_ratio = clef["process_wall_seconds"] / measured["model-free"]["process_wall_seconds"]
            entry["model_free_ratio"] = streaming_ratio
            goals[f"streaming within {GOAL_STREAMING_RATIO}x of model_free_ptq"] = (
                streaming_ratio <= GOAL_STREAMING_RATIO
            )
        results["schemes"][scheme] = entry
    stage.done()
    return results


SIDE_NAMES = {
    "plain": "plain llm-compressor (oneshot)",
    "model-free": "plain model_free_ptq",
    "clef-oneshot": "clef-quant quantize --no-streaming",
    "clef": "clef-quant quantize",
}


def render_markdown(results: dict[str, Any], command: str) -> str:
    """A short report of `compare`'s results: one row per side of each scheme, then the goals."""
    lines = [
        f"# `clef-quant quantize` against plain llm-compressor on `{Path(results['source']).name}`",
        "",
        f"- host: {results['host']} ({results.get('cpus')} CPUs), device {results['device']}, {results.get('date')}",
        "- versions: " + ", ".join(f"{name} {version}" for name, version in results.get("versions", {}).items()),
        f"- command: `{command}`",
        f"- calibration: {results['records']} records of at most {results['max_seq_len']} tokens (schemes that "
        f"calibrate); bf16 backbone {decimal_size(results['bf16_backbone_bytes'])}",
        "",
    ]
    rows = []
    for scheme, both in results["schemes"].items():
        for side in (side for side in STREAMING_SIDES if side in both):
            run = both[side]
            rows.append(
                [
                    scheme,
                    f"{side} ({run['path']})" if "path" in run else side,
                    f"{run['seconds']['total']:.1f}",
                    f"{run['process_wall_seconds']:.1f}",
                    binary_size(run["peak_host_bytes"]),
                    binary_size(run["peak_gpu_bytes"]) or "—",
                    decimal_size(run["out_bytes"]),
                ]
            )
    header = ["scheme", "side", "total s", "process wall s", "peak host", "peak GPU", "output"]
    lines += [markdown_table(header, rows, "llrrrrr")]
    lines += ["", "Process wall: the side's process from start to exit; the ratio clef/plain uses it.", ""]
    for scheme, both in results["schemes"].items():
        met = ", ".join(f"{goal}: {'yes' if ok else 'no'}" for goal, ok in both["goals"].items())
        versus = f", clef/model-free {both['model_free_ratio']:.2f}x" if "model_free_ratio" in both else ""
        lines.append(f"- {scheme}: clef/plain {both['wall_ratio']:.2f}x{versus}; {met}")
    return "\n".join(lines) + "\n"


def write_report(results: dict[str, Any], command: str, out: Path) -> tuple[Path, Path]:
    """The JSON results and their markdown summary, one stem: `out` names the JSON and the markdown goes beside it.
    Returns the JSON's path, then the markdown's."""
    # Imported here: each side's process imports this module, and its peak memory is what is measured.
    from clef_quant.bench import report_paths

    markdown, json_path = report_paths.write_report(
        out.with_suffix(".md"), render_markdown(results, command), json.dumps(results, indent=2) + "\n"
    )
    return json_path, markdown


def summary_lines(results: dict[str, Any]) -> list[str]:
    """A few lines per scheme for the terminal: each side's process wall time and peak host memory."""
    lines = []
    for name, both in results["schemes"].items():
        clef, plain = both["clef"], both["plain"]
        lines.append(
            f"{name}: clef {clef['process_wall_seconds']:.1f} s, plain {plain['process_wall_seconds']:.1f} s "
            f"({both['wall_ratio']:.2f}x); peak host clef {binary_size(clef['peak_host_bytes'])}, "
            f"plain {binary_size(plain['peak_host_bytes'])}"
        )
        if "model-free" in both:
            free, loaded = both["model-free"], both["clef-oneshot"]
            lines.append(
                f"  plain model_free_ptq {free['process_wall_seconds']:.1f} s ({both['model_free_ratio']:.2f}x), "
                f"clef --no-streaming {loaded['process_wall_seconds']:.1f} s; peak host "
                f"{binary_size(free['peak_host_bytes'])} and {binary_size(loaded['peak_host_bytes'])}"
            )
    return lines


def _child_main(argv: list[str]) -> None:
    """Measure one `SideJob` in this process and print its numbers as the last line of stdout."""
    if len(argv) != 2 or argv[0] != "--child":
        raise SystemExit("internal entry of `clef-quant bench quantize-vs-plain`; run that command instead")
    job = SideJob(**json.loads(argv[1]))
    source, out = Path(job.source), Path(job.out)
    if job.side == "model-free":
        measured = run_model_free(source, out, job.scheme, job.ignore or [], job.device, Path(job.view or ""))
    else:
        run = run_plain if job.side == "plain" else run_clef
        extra = {"streaming": False} if job.side == "clef-oneshot" else {}
        measured = run(source, out, job.scheme, job.records, job.max_seq_len, job.device, **extra)
    print(json.dumps(measured))


if __name__ == "__main__":
    _child_main(sys.argv[1:])
