"""clef-quant against plain llm-compressor on the same checkpoint: wall time and peak host and GPU memory.

Each measurement runs in its own process, so peak resident memory belongs to that run alone. "plain" is what a
user of llm-compressor writes: load the model from disk, `oneshot` with the same recipe (and, for the NVFP4
family, the same calibration token ids), `save_pretrained(save_compressed=True)`. "clef" is `clef-quant
quantize` end to end (load, plan, calibrate, save, copy head and tokenizer, hash, manifest, rename).

    python -m clef_quant.bench.quantize_bench /scratch/flash --work /scratch/bench --device cuda \\
        --scheme fp8-dynamic --scheme nvfp4 --records 512 --max-seq-len 2048 \\
        --results bench/results/quantize-h200.json

The JSON results hold every stage's seconds, the peaks, the ratios clef/plain and the issue's goals (clef within
1.3x of plain per scheme; FP8_DYNAMIC end to end under 120 s; peak host memory under 1.3x the bf16 size).
"""

from __future__ import annotations

import argparse
import json
import platform
import resource
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from clef_quant.devices import is_cuda

if TYPE_CHECKING:
    from clef_quant.quantize.run import QuantizeResult

GOAL_RATIO = 1.3
GOAL_FP8_SECONDS = 120.0
GOAL_HOST_RATIO = 1.3


def _peaks(device: str) -> dict[str, int | None]:
    gpu = None
    if is_cuda(device):
        import torch

        gpu = int(torch.cuda.max_memory_allocated())
    return {"peak_host_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024, "peak_gpu_bytes": gpu}


def run_plain(source: Path, out: Path, scheme: str, records: int, max_seq_len: int, device: str) -> dict[str, Any]:
    """Plain llm-compressor on the same recipe and calibration ids; returns seconds per stage and peaks."""
    started = time.perf_counter()
    import torch
    import transformers
    from llmcompressor import oneshot

    from clef_quant.quantize.calibration import as_dataloader, build_calibration
    from clef_quant.quantize.plan import parse_recipe, recipe_needs_calibration
    from clef_quant.quantize.recipes import load_recipe

    seconds: dict[str, float] = {"imports": time.perf_counter() - started}
    config = json.loads((source / "config.json").read_text())
    recipe = load_recipe(scheme, None, config)
    tokenizer = transformers.AutoTokenizer.from_pretrained(source)
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


def quantize_into(
    source: Path,
    out: Path,
    scheme: str,
    *,
    calibration_records: int,
    max_seq_len: int,
    device: str = "cpu",
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
        **auto,
    )
    return quantize(config)


def run_clef(source: Path, out: Path, scheme: str, records: int, max_seq_len: int, device: str) -> dict[str, Any]:
    started = time.perf_counter()
    result = quantize_into(source, out, scheme, calibration_records=records, max_seq_len=max_seq_len, device=device)
    seconds = {**result.timings, "total": time.perf_counter() - started}
    return {"seconds": seconds, **_peaks(device), "calibration": result.calibration.to_dict()}


def _child(kind: str, args: argparse.Namespace, scheme: str) -> dict[str, Any]:
    out = Path(args.work) / f"{kind}-{scheme}"
    shutil.rmtree(out, ignore_errors=True)
    command = [sys.executable, "-m", "clef_quant.bench.quantize_bench", "--child", kind, str(args.source)]
    command += ["--work", str(args.work), "--scheme", scheme, "--records", str(args.records)]
    command += ["--max-seq-len", str(args.max_seq_len), "--device", args.device]
    started = time.perf_counter()
    completed = subprocess.run(command, capture_output=True, text=True, check=False)
    wall = time.perf_counter() - started
    if completed.returncode != 0:
        raise SystemExit(f"{kind} {scheme} failed:\n{completed.stderr[-4000:]}")
    measured = json.loads(completed.stdout.strip().splitlines()[-1])
    measured["process_wall_seconds"] = wall
    measured["out_bytes"] = sum(p.stat().st_size for p in out.rglob("*") if p.is_file())
    shutil.rmtree(out, ignore_errors=True)
    return measured


def compare(args: argparse.Namespace) -> dict[str, Any]:
    source = Path(args.source)
    bf16_bytes = sum(p.stat().st_size for p in source.glob("model*.safetensors"))
    results: dict[str, Any] = {
        "source": str(source),
        "bf16_backbone_bytes": bf16_bytes,
        "device": args.device,
        "records": args.records,
        "max_seq_len": args.max_seq_len,
        "host": platform.node(),
        "schemes": {},
    }
    for scheme in args.scheme:
        plain = _child("plain", args, scheme)
        clef = _child("clef", args, scheme)
        ratio = clef["process_wall_seconds"] / plain["process_wall_seconds"]
        goals = {
            f"clef within {GOAL_RATIO}x of plain": ratio <= GOAL_RATIO,
            f"peak host under {GOAL_HOST_RATIO}x bf16": clef["peak_host_bytes"] <= GOAL_HOST_RATIO * bf16_bytes,
        }
        if scheme == "fp8-dynamic":
            goals[f"end to end under {GOAL_FP8_SECONDS:.0f} s"] = clef["seconds"]["total"] <= GOAL_FP8_SECONDS
        results["schemes"][scheme] = {"plain": plain, "clef": clef, "wall_ratio": ratio, "goals": goals}
    return results


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("source", type=Path)
    parser.add_argument("--work", type=Path, required=True, help="scratch folder for the outputs (removed after)")
    parser.add_argument("--scheme", action="append", default=None)
    parser.add_argument("--records", type=int, default=512)
    parser.add_argument("--max-seq-len", type=int, default=2048)
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--results", type=Path, default=None, help="write the JSON results here")
    parser.add_argument("--child", choices=("plain", "clef"), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    args.scheme = args.scheme or ["fp8-dynamic", "nvfp4"]
    if args.child:
        run = run_plain if args.child == "plain" else run_clef
        out = Path(args.work) / f"{args.child}-{args.scheme[0]}"
        measured = run(args.source, out, args.scheme[0], args.records, args.max_seq_len, args.device)
        print(json.dumps(measured))
        return
    Path(args.work).mkdir(parents=True, exist_ok=True)
    results = compare(args)
    text = json.dumps(results, indent=2)
    if args.results is not None:
        args.results.parent.mkdir(parents=True, exist_ok=True)
        args.results.write_text(text + "\n")
    print(text)


if __name__ == "__main__":
    main()
