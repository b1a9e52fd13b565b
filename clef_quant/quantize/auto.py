"""`clef-quant quantize --scheme auto`: a mixed recipe chosen from a sensitivity scan, under a target.

Every unit of the scan (one Linear group of one decoder layer) gets one of the scan's default schemes (the
registry's, smallest first: NVFP4, then FP8_DYNAMIC) or stays bf16. The choice starts from the smallest
everywhere and upgrades one unit at a time, always the upgrade that removes the most KL per byte it adds
(NVFP4 -> FP8, FP8 -> bf16, or NVFP4 -> bf16 directly), until the target holds (under `--max-kl` the last step
is the cheapest one that reaches the target):

- `--max-kl X`: the predicted KL, the sum of the chosen units' scan KLs, is at most X;
- `--max-size-gb Y`: upgrade while the predicted backbone size stays at most Y (10^9 bytes); the most
  KL per byte is bought first, so at a fixed size this is the greedy answer to "least KL".

Summing unit KLs assumes the units' errors add up; the scan measures each unit alone, on a few held-out records.
The choice is one for the size (or KL) it was made for: another target moves other units. Where a unit kept at
the smallest scheme and a unit moved up cannot be ranked by the scan (the 95% interval of their paired KL
difference over the held-out records covers 0, `sensitivity.py`), the recipe says so: swapping them is as
justified by the scan. `clef-quant eval` measures the result. The recipe (rendered from the shipped template
`recipes/auto.yaml.j2`) says, per unit, what was chosen and the scan numbers behind it, and is saved verbatim as
the output folder's `recipe.yaml`.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from clef_quant import shipped
from clef_quant.bootstrap import Bootstrap
from clef_quant.quantize import registry
from clef_quant.quantize.errors import QuantizeError
from clef_quant.quantize.recipes import AUTO_SCHEME, Recipe, parsed_recipe, recipe_environment
from clef_quant.quantize.release_files import backbone_bytes
from clef_quant.quantize.scan_file import GROUPS, ScanFile, config_sha256, read_scan
from clef_quant.quantize.schemes import BF16
from clef_quant.quantize.sensitivity import indistinguishable_pairs
from clef_vllm.format.release_config import ReleaseConfig

TEMPLATE = "auto.yaml.j2"
# The decoder Linear layers of one group of one layer, in transformers' and vLLM's spellings (see the hybrid).
_GROUP_PATTERN = {"deltanet": "linear_attn", "attention": "self_attn", "mlp": "mlp"}


@dataclass(frozen=True)
class Rung:
    """One step of the ladder auto climbs: a default scan scheme, by the label inspect gives its modules."""

    label: str
    name: str


def ladder() -> tuple[Rung, ...]:
    """The scan's default schemes, smallest first, each by its one label."""
    rungs = []
    for name in registry.schemes().default_scan():
        labels = registry.schemes().scheme(name).labels
        if len(labels) != 1:
            raise QuantizeError(f"--scheme auto cannot use {name}: it stores {len(labels)} schemes, not one")
        rungs.append(Rung(labels[0], name))
    return tuple(rungs)


@dataclass(frozen=True)
class UnitChoice:
    layer: int
    group: str
    choice: str  # a rung's label (NVFP4, FP8_DYNAMIC) or bf16
    kl: dict[str, float]  # per option: the scan's mean KL (bf16: 0)
    saved: dict[str, int]  # per option: bytes saved against bf16
    flips: dict[str, int]
    questions: int
    interval: dict[str, tuple[float, float] | None]  # per rung label: the scan's 95% interval of its KL
    ties: tuple[str, ...] = ()  # units across the choice's line that the scan cannot rank against this one

    @property
    def target(self) -> str:
        return target_pattern(self.layer, self.group)

    @property
    def name(self) -> str:
        return f"layer {self.layer} {self.group}"


@dataclass(frozen=True)
class AutoPlan:
    units: list[UnitChoice]
    predicted_kl: float
    predicted_bytes: int  # backbone bytes on disk, predicted
    source_bytes: int
    target: str  # "--max-kl 0.01" or "--max-size-gb 1.2"
    ties: int | None = None  # pairs (one kept at the smallest scheme, one moved up) the scan cannot rank; None:
    # the scan has no per-record KLs (written before intervals)

    def counts(self) -> dict[str, int]:
        counts = {**{rung.label: 0 for rung in ladder()}, BF16: 0}
        for unit in self.units:
            counts[unit.choice] += 1
        return counts


def target_pattern(layer: int, group: str) -> str:
    return rf"re:.*language_model\.(?:model\.)?layers\.{layer}\.{_GROUP_PATTERN[group]}\.\w*proj\w*$"


def check_auto_options(
    scheme: str | None, scan_file: Path | None, max_kl: float | None, max_size_gb: float | None
) -> None:
    """--scan, --max-kl and --max-size-gb belong to --scheme auto, which needs the scan and exactly one target."""
    if scheme == AUTO_SCHEME and scan_file is None:
        raise QuantizeError("--scheme auto needs --scan SCAN.json (clef-quant scan SOURCE --out DIR makes one)")
    if scheme == AUTO_SCHEME:
        _one_target(max_kl, max_size_gb)
    if scheme != AUTO_SCHEME and (scan_file is not None or max_kl is not None or max_size_gb is not None):
        raise QuantizeError("--scan, --max-kl and --max-size-gb go with --scheme auto")


def _one_target(max_kl: float | None, max_size: float | None) -> None:
    if (max_kl is None) == (max_size is None):
        raise QuantizeError("--scheme auto needs exactly one of --max-kl and --max-size-gb")
    if max_kl is not None and max_kl < 0:
        raise QuantizeError("--max-kl must be at least 0")


def choose(
    scan_file: ScanFile, source_bytes: int, *, max_kl: float | None = None, max_size_bytes: int | None = None
) -> AutoPlan:
    """Pick a scheme per unit under exactly one target; see the module docstring for the rule."""
    _one_target(max_kl, max_size_bytes)
    order = (*(rung.label for rung in ladder()), BF16)
    smallest = order[0]
    units = _units(scan_file)
    state = {key: smallest for key in units}
    kl = sum(units[key]["kl"][smallest] for key in units)
    size = source_bytes - sum(units[key]["saved"][smallest] for key in units)
    if max_size_bytes is not None and size > max_size_bytes:
        raise QuantizeError(
            f"even {smallest} everywhere comes to {size / 1e9:.4f} GB; --max-size-gb {max_size_bytes / 1e9:g} is "
            "below it"
        )
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
    keys = sorted(units, key=lambda k: (k[0], list(GROUPS).index(k[1])))
    if all(state[key] == BF16 for key in keys):
        raise QuantizeError(f"--max-kl {max_kl:g} leaves every unit bf16: nothing to quantize")
    ties = _ties(scan_file, units, state, smallest)
    choices = [
        UnitChoice(
            layer=key[0],
            group=key[1],
            choice=state[key],
            kl=units[key]["kl"],
            saved=units[key]["saved"],
            flips=units[key]["flips"],
            questions=units[key]["questions"],
            interval=units[key]["interval"],
            ties=tuple(f"layer {k[0]} {k[1]}" for k in sorted(ties.get(key, []) if ties else [], key=keys.index)),
        )
        for key in keys
    ]
    target = f"--max-kl {max_kl:g}" if max_kl is not None else f"--max-size-gb {max_size_bytes / 1e9:g}"
    pairs = None if ties is None else sum(len(v) for v in ties.values()) // 2
    return AutoPlan(choices, max(kl, 0.0), size, source_bytes, target, pairs)


def _ties(
    scan_file: ScanFile, units: dict[tuple[int, str], dict[str, Any]], state: dict[tuple[int, str], str], smallest: str
) -> dict[tuple[int, str], list[tuple[int, str]]] | None:
    """For each unit, the units on the other side of the choice (kept at `smallest` / moved up) whose KL under
    `smallest` the scan cannot tell from its own; None when the scan has no per-record KLs."""
    kept = [key for key in units if state[key] == smallest]
    moved = [key for key in units if state[key] != smallest]
    index = {id(unit): n for n, unit in enumerate(scan_file.units)}
    position = {key: index[id(units[key]["result"][smallest])] for key in units}
    pairs = [(position[a], position[b]) for a in kept for b in moved]
    found = indistinguishable_pairs(scan_file.units, pairs, scan_file.record_questions, _bootstrap(scan_file))
    if found is None:
        return None
    by_position = {position[key]: key for key in units}
    ties: dict[tuple[int, str], list[tuple[int, str]]] = {}
    for a, b in found:
        ties.setdefault(by_position[a], []).append(by_position[b])
        ties.setdefault(by_position[b], []).append(by_position[a])
    return ties


def _bootstrap(scan_file: ScanFile) -> Bootstrap:
    """The draws the scan's intervals were made with (the defaults for a scan that names none)."""
    default = Bootstrap()
    settings = scan_file.intervals
    return Bootstrap(
        confidence=float(settings.get("confidence", default.confidence)),
        resamples=int(settings.get("resamples", default.resamples)),
        seed=int(settings.get("seed", default.seed)),
    )


def _units(scan_file: ScanFile) -> dict[tuple[int, str], dict[str, Any]]:
    rungs = ladder()
    found: dict[tuple[int, str], dict[str, Any]] = {}
    for unit in scan_file.units:
        label = next((rung.label for rung in rungs if rung.name == unit.scheme), None)
        if label is None:
            continue
        entry = found.setdefault(
            (unit.layer, unit.group),
            {
                "kl": {BF16: 0.0},
                "saved": {BF16: 0},
                "flips": {BF16: 0},
                "questions": unit.questions,
                "interval": {BF16: None},
                "result": {},
            },
        )
        entry["kl"][label] = unit.kl_mean
        interval = None if unit.kl_low is None or unit.kl_high is None else (unit.kl_low, unit.kl_high)
        entry["interval"][label] = interval
        entry["result"][label] = unit
        entry["saved"][label] = unit.bytes_saved
        entry["flips"][label] = unit.flips
    wanted = {*(rung.label for rung in rungs), BF16}
    missing = sorted({f"layer {k[0]} {k[1]}" for k, v in found.items() if set(v["kl"]) != wanted})
    if not found or missing:
        raise QuantizeError(
            f"--scheme auto needs a scan with {' and '.join(rung.name for rung in rungs)} for every unit"
            + (f" (missing: {', '.join(missing[:4])})" if missing else "")
            + "; run: clef-quant scan SOURCE --out DIR"
            + "".join(f" --scheme {rung.name}" for rung in rungs)
        )
    return found


def render_recipe(plan: AutoPlan, scan_path: Path, scan_file: ScanFile) -> str:
    """The mixed recipe, with one comment per unit giving its scan numbers and the choice."""
    environment = recipe_environment()
    environment.trim_blocks = environment.lstrip_blocks = True  # the template's own loops leave no blank lines
    template = environment.from_string(shipped.recipes().joinpath(TEMPLATE).read_text(encoding="utf-8"))
    return template.render(
        rungs=ladder(),
        bf16=BF16,
        units=plan.units,
        scan_name=scan_path.name,
        heldout=scan_file.settings.heldout,
        calibration_records=scan_file.settings.calibration_records,
        target=plan.target,
        predicted_kl=plan.predicted_kl,
        predicted_bytes=plan.predicted_bytes,
        source_bytes=plan.source_bytes,
        smallest=ladder()[0],
        ties=plan.ties,
    )


def load_auto_recipe(
    scan_path: Path,
    source_dir: Path,
    source_config: ReleaseConfig,
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
    return parsed_recipe(AUTO_SCHEME, Path(scan_path), text, variables)
