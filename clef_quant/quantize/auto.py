"""`clef-quant quantize --scheme auto`: a mixed recipe chosen from a sensitivity scan, under a target.

Every unit of the scan (one Linear group of one decoder layer) gets NVFP4, FP8_DYNAMIC or stays bf16. The
choice starts from NVFP4 everywhere (the smallest) and upgrades one unit at a time, always the upgrade that
removes the most KL per byte it adds (NVFP4 -> FP8, FP8 -> bf16, or NVFP4 -> bf16 directly), until the
target holds (under `--max-kl` the last step is the cheapest one that reaches the target):

- `--max-kl X`: the predicted KL, the sum of the chosen units' scan KLs, is at most X;
- `--max-size-gb Y`: upgrade while the predicted backbone size stays at most Y (10^9 bytes); the most
  KL per byte is bought first, so at a fixed size this is the greedy answer to "least KL".

Summing unit KLs assumes the units' errors add up; the scan measures each unit alone. `clef-quant eval`
measures the result. The recipe written says, per unit, what was chosen and the scan numbers behind it, and
is saved verbatim as the output folder's `recipe.yaml`.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from clef_quant.quantize.errors import QuantizeError
from clef_quant.quantize.recipes import AUTO_SCHEME, KEEP_BF16, Recipe
from clef_quant.quantize.release_files import backbone_bytes
from clef_quant.quantize.scan_file import GROUPS, ScanFile, config_sha256, read_scan

NVFP4, FP8, BF16 = "NVFP4", "FP8_DYNAMIC", "bf16"
SCAN_SCHEME = {NVFP4: "nvfp4", FP8: "fp8-dynamic"}
# The decoder Linear layers of one group of one layer, in transformers' and vLLM's spellings (see the hybrid).
_GROUP_PATTERN = {"deltanet": "linear_attn", "attention": "self_attn", "mlp": "mlp"}


@dataclass(frozen=True)
class UnitChoice:
    layer: int
    group: str
    choice: str  # NVFP4, FP8_DYNAMIC or bf16
    kl: dict[str, float]  # per option: the scan's mean KL (bf16: 0)
    saved: dict[str, int]  # per option: bytes saved against bf16
    flips: dict[str, int]
    questions: int


@dataclass(frozen=True)
class AutoPlan:
    units: list[UnitChoice]
    predicted_kl: float
    predicted_bytes: int  # backbone bytes on disk, predicted
    source_bytes: int
    target: str  # "--max-kl 0.01" or "--max-size-gb 1.2"

    def counts(self) -> dict[str, int]:
        counts = {NVFP4: 0, FP8: 0, BF16: 0}
        for unit in self.units:
            counts[unit.choice] += 1
        return counts


def target_pattern(layer: int, group: str) -> str:
    return rf"re:.*language_model\.(?:model\.)?layers\.{layer}\.{_GROUP_PATTERN[group]}\.\w*proj\w*$"


def choose(
    scan_file: ScanFile, source_bytes: int, *, max_kl: float | None = None, max_size_bytes: int | None = None
) -> AutoPlan:
    """Pick a scheme per unit under exactly one target; see the module docstring for the rule."""
    if (max_kl is None) == (max_size_bytes is None):
        raise QuantizeError("--scheme auto needs exactly one target: --max-kl or --max-size-gb")
    if max_kl is not None and max_kl < 0:
        raise QuantizeError("--max-kl must be at least 0")
    units = _units(scan_file)
    state = {key: NVFP4 for key in units}
    kl = sum(units[key]["kl"][NVFP4] for key in units)
    size = source_bytes - sum(units[key]["saved"][NVFP4] for key in units)
    if max_size_bytes is not None and size > max_size_bytes:
        raise QuantizeError(
            f"even NVFP4 everywhere comes to {size / 1e9:.4f} GB; --max-size-gb {max_size_bytes / 1e9:g} is below it"
        )
    order = (NVFP4, FP8, BF16)
    while True:
        if max_kl is not None and kl <= max_kl:
            break
        moves = []
        for key, current in state.items():
            for better in order[order.index(current) + 1 :]:
                gain = units[key]["kl"][current] - units[key]["kl"][better]
                cost = units[key]["saved"][current] - units[key]["saved"][better]
                if gain <= 0 or cost <= 0:
                    continue
                if max_size_bytes is not None and size + cost > max_size_bytes:
                    continue
                moves.append((gain / cost, key, better, gain, cost))
        if not moves:
            break
        # Under --max-kl, a single move that reaches the target ends the search: take the cheapest such move
        # rather than the most efficient one, which may overshoot with many more bytes.
        finishing = [m for m in moves if max_kl is not None and kl - m[3] <= max_kl]
        if finishing:
            _, key, better, gain, cost = min(finishing, key=lambda m: (m[4], -m[3]))
        else:
            _, key, better, gain, cost = max(moves, key=lambda m: m[0])
        state[key] = better
        kl -= gain
        size += cost
    choices = [
        UnitChoice(
            layer=key[0],
            group=key[1],
            choice=state[key],
            kl=units[key]["kl"],
            saved=units[key]["saved"],
            flips=units[key]["flips"],
            questions=units[key]["questions"],
        )
        for key in sorted(units, key=lambda k: (k[0], list(GROUPS).index(k[1])))
    ]
    if all(c.choice == BF16 for c in choices):
        raise QuantizeError(f"--max-kl {max_kl:g} leaves every unit bf16: nothing to quantize")
    target = f"--max-kl {max_kl:g}" if max_kl is not None else f"--max-size-gb {max_size_bytes / 1e9:g}"
    return AutoPlan(choices, max(kl, 0.0), size, source_bytes, target)


def _units(scan_file: ScanFile) -> dict[tuple[int, str], dict[str, Any]]:
    found: dict[tuple[int, str], dict[str, Any]] = {}
    for unit in scan_file.units:
        label = next((k for k, v in SCAN_SCHEME.items() if v == unit.scheme), None)
        if label is None:
            continue
        entry = found.setdefault(
            (unit.layer, unit.group),
            {"kl": {BF16: 0.0}, "saved": {BF16: 0}, "flips": {BF16: 0}, "questions": unit.questions},
        )
        entry["kl"][label] = unit.kl_mean
        entry["saved"][label] = unit.bytes_saved
        entry["flips"][label] = unit.flips
    missing = sorted({f"layer {k[0]} {k[1]}" for k, v in found.items() if set(v["kl"]) != {NVFP4, FP8, BF16}})
    if not found or missing:
        raise QuantizeError(
            "--scheme auto needs a scan with both nvfp4 and fp8-dynamic for every unit"
            + (f" (missing: {', '.join(missing[:4])})" if missing else "")
            + "; run: clef-quant scan SOURCE --out DIR --scheme nvfp4 --scheme fp8-dynamic"
        )
    return found


def render_recipe(plan: AutoPlan, scan_path: Path, scan_file: ScanFile) -> str:
    """The mixed recipe, with one comment per unit giving its scan numbers and the choice."""
    lines = [
        "# clef-quant quantize --scheme auto: one scheme per decoder-layer Linear group, chosen from a sensitivity",
        f"# scan ({scan_path.name}: {scan_file.settings.heldout} held-out records, "
        f"{scan_file.settings.calibration_records} calibration records) under {plan.target}.",
        f"# Predicted: KL {plan.predicted_kl:.3e} (sum of the chosen units' scan KLs), backbone "
        f"{plan.predicted_bytes / 1e9:.4f} GB of {plan.source_bytes / 1e9:.4f} GB bf16.",
        "# Per unit: mean KL(bf16 || unit alone quantized) over every held-out question, top-1 flips, MB saved.",
        "# Kept bf16 always: lm_head, the vision tower, DeltaNet in_proj_a/b (see fp8_dynamic.yaml).",
        "default_stage:",
        "  default_modifiers:",
        "    QuantizationModifier:",
        "      ignore:",
    ]
    lines += [f"        - '{target}'" for target in KEEP_BF16]
    for unit in plan.units:
        if unit.choice == BF16:
            lines.append(f"        # {_comment(unit)}")
            lines.append(f"        - '{target_pattern(unit.layer, unit.group)}'")
    lines.append("      scheme:")
    for label in (NVFP4, FP8):
        chosen = [u for u in plan.units if u.choice == label]
        if not chosen:
            continue
        lines.append(f"        {label}:")
        for unit in chosen:
            lines.append(f"          # {_comment(unit)}")
            lines.append(f"          - '{target_pattern(unit.layer, unit.group)}'")
    return "\n".join(lines) + "\n"


def _comment(unit: UnitChoice) -> str:
    def part(label: str, name: str) -> str:
        return (
            f"{name} KL {unit.kl[label]:.2e} flips {unit.flips[label]}/{unit.questions} "
            f"saves {unit.saved[label] / 1e6:.3f} MB"
        )

    return f"layer {unit.layer} {unit.group} -> {unit.choice}: {part(NVFP4, 'nvfp4')}; {part(FP8, 'fp8')}"


def load_auto_recipe(
    scan_path: Path,
    source_dir: Path,
    source_config: dict[str, Any],
    *,
    max_kl: float | None,
    max_size_gb: float | None,
) -> Recipe:
    """The auto recipe for this checkpoint, refusing a scan of another one."""
    del source_config  # the scan must match config.json byte for byte; checked by hash below
    scan_file = read_scan(Path(scan_path))
    if scan_file.config_sha256 != config_sha256(source_dir):
        raise QuantizeError(f"{scan_path} is a scan of another checkpoint (its config.json differs from the source's)")
    max_size_bytes = None if max_size_gb is None else int(max_size_gb * 1e9)
    plan = choose(scan_file, backbone_bytes(source_dir), max_kl=max_kl, max_size_bytes=max_size_bytes)
    text = render_recipe(plan, Path(scan_path), scan_file)
    variables: dict[str, Any] = {
        "scan": str(scan_path),
        "max_kl": max_kl,
        "max_size_gb": max_size_gb,
        "predicted_kl": plan.predicted_kl,
        "predicted_bytes": plan.predicted_bytes,
        "units": plan.counts(),
    }
    return Recipe(scheme=AUTO_SCHEME, path=Path(scan_path), text=text, variables=variables)
