"""The card's plots, as PNG files: accuracy and agreement per task, KL per task, and the probability scatter.

matplotlib runs on its Agg backend (no display); colors stay the same for a side across all plots, and the
release the card is for is named "(this release)" in every legend.
"""

from __future__ import annotations

import math
import textwrap
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from clef_quant.evaluation.results import ALL, SideEntry
from clef_quant.publish.results import EvalResults

DPI = 110
REFERENCE_COLOR = "#4d4d4d"
NOISE_FLOOR_COLOR = "#a6a6a6"
CANDIDATE_COLORS = ("#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#8c564b")
KL_FLOOR = 1e-6  # KL values below this (the noise floor can reach 0) sit on the axis of the log plot
SCATTER_POINTS = 20_000  # more points than this are thinned evenly: the plot stays readable and small


def draw_plots(results: EvalResults, out_dir: Path) -> list[dict[str, str]]:
    """Write the PNGs into `out_dir`; returns `{"file", "alt", "caption"}` per plot, in card order."""
    import matplotlib

    matplotlib.use("Agg", force=True)
    import matplotlib.pyplot as plt

    out_dir.mkdir(parents=True, exist_ok=True)
    plots = []
    for plot in _PLOTS:
        fig = plot.draw(results)
        fig.savefig(out_dir / plot.file, dpi=DPI)
        plt.close(fig)
        plots.append({"file": plot.file, "alt": plot.alt, "caption": plot.caption})
    return plots


def _label(results: EvalResults, side: SideEntry) -> str:
    return f"{side.name} (this release)" if side.key == results.this.key else side.name


def _colors(results: EvalResults) -> dict[str, str]:
    colors = {results.reference.key: REFERENCE_COLOR}
    if results.noise_floor is not None:
        colors[results.noise_floor.key] = NOISE_FLOOR_COLOR
    for index, side in enumerate(results.candidates):
        colors[side.key] = CANDIDATE_COLORS[index % len(CANDIDATE_COLORS)]
    return colors


def _task_labels(results: EvalResults) -> list[str]:
    return ["\n".join(textwrap.wrap(t.label, 12)) for t in results.tasks]


def _value(results: EvalResults, side: SideEntry, task: str, metric: str) -> float:
    return results.value(side, task, metric)


def _grouped_bars(
    ax: Any, results: EvalResults, sides: Sequence[SideEntry], metric: str, scale: float = 1.0, mark_zero: bool = True
) -> None:
    import numpy as np

    colors = _colors(results)
    names = [t.name for t in results.tasks]
    width = 0.8 / max(len(sides), 1)
    x = np.arange(len(names))
    for index, side in enumerate(sides):
        values = [scale * _value(results, side, name, metric) for name in names]
        this = side.key == results.this.key
        positions = x + (index - (len(sides) - 1) / 2) * width
        ax.bar(
            positions,
            values,
            width,
            label=_label(results, side),
            color=colors[side.key],
            edgecolor="black" if this else "none",
            linewidth=0.8,
        )
        # A bar of height 0 is invisible: say 0 (or n/a) so it does not read as missing.
        for position, value in zip(positions, values, strict=True):
            if mark_zero and (value == 0 or math.isnan(value)):
                mark = "0" if value == 0 else "n/a"
                ax.annotate(mark, (position, 0), xytext=(0, 2), textcoords="offset points", ha="center", fontsize=6)
    ax.set_xticks(x, _task_labels(results), fontsize=8)
    if ALL in names:  # set the All group apart from the tasks
        ax.axvline(names.index(ALL) - 0.5, color="#cccccc", linewidth=1, linestyle="--")
    ax.grid(axis="y", color="#e6e6e6")
    ax.set_axisbelow(True)


def _accuracy_agreement(results: EvalResults) -> Any:
    import matplotlib.pyplot as plt

    fig, (top, bottom) = plt.subplots(2, 1, figsize=(10, 7.2), sharex=True, layout="constrained")
    _grouped_bars(top, results, results.sides, "accuracy", 100)
    top.set_ylabel("accuracy vs gold (%)")
    top.set_ylim(0, 100)
    top.set_title("Accuracy against the gold answers, per task", fontsize=10)
    compared = [s for s in results.sides if s.role != "reference"]
    _grouped_bars(bottom, results, compared, "agreement", 100)
    bottom.set_ylabel("top-1 agreement with bf16 (%)")
    bottom.set_ylim(0, 100)
    bottom.set_title("Top-1 agreement with the bf16 reference, per task", fontsize=10)
    _legend_above(fig, top, len(results.sides))
    return fig


def _kl(results: EvalResults) -> Any:
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(10, 4.4), layout="constrained")
    compared = [s for s in results.sides if s.role != "reference"]
    _grouped_bars(ax, results, compared, "kl", mark_zero=False)  # no zero on a log axis
    ax.set_yscale("log")
    low, _ = ax.get_ylim()
    ax.set_ylim(bottom=max(low, KL_FLOOR))
    ax.set_ylabel("mean KL(bf16 || side), nats (log)")
    ax.set_title("KL divergence from the bf16 reference per question, per task (lower is closer)", fontsize=10)
    _legend_above(fig, ax, len(compared))
    return fig


def _scatter(results: EvalResults) -> Any:
    import matplotlib.pyplot as plt

    colors = _colors(results)
    panels = [s for s in results.sides if s.role != "reference"]
    fig, axes = plt.subplots(1, len(panels), figsize=(3.6 * len(panels), 4.1), squeeze=False, layout="constrained")
    for ax, side in zip(axes[0], panels, strict=True):
        xs, ys = results.pairs(side)
        step = max(1, len(xs) // SCATTER_POINTS)
        ax.plot([0, 1], [0, 1], color="#999999", linewidth=0.8, linestyle="--")
        ax.scatter(xs[::step], ys[::step], s=6, alpha=0.45, color=colors[side.key], linewidths=0)
        ax.set_xlim(0, 1)
        ax.set_ylim(0, 1)
        ax.set_aspect("equal")
        ax.set_title("\n".join(textwrap.wrap(_label(results, side), 28)), fontsize=9)
        ax.set_xlabel("bf16 reference probability", fontsize=8)
        ax.tick_params(labelsize=7)
        ax.text(0.03, 0.95, f"{len(xs):,} options", transform=ax.transAxes, fontsize=7, va="top")
    axes[0][0].set_ylabel("side's probability", fontsize=8)
    fig.suptitle("Every option's probability: bf16 reference (x) against each side (y)", fontsize=10)
    return fig


def _legend_above(fig: Any, ax: Any, columns: int) -> None:
    """One legend for all panels (they share colors), above them, so the plots keep the full width."""
    fig.legend(*ax.get_legend_handles_labels(), loc="outside upper center", ncols=columns, fontsize=8)


@dataclass(frozen=True)
class _Plot:
    file: str
    draw: Callable[[EvalResults], Any]  # returns the matplotlib figure
    alt: str
    caption: str


_PLOTS = (
    _Plot(
        "accuracy_agreement.png",
        _accuracy_agreement,
        alt="Bar charts of accuracy and of top-1 agreement with bf16, per task, for every side",
        caption="Accuracy against gold (top) and top-1 agreement with the bf16 reference (bottom), per task and "
        "for All. The noise floor is bf16 through the same vLLM engine; the outlined bars are this release.",
    ),
    _Plot(
        "kl_per_task.png",
        _kl,
        alt="Bar chart of the mean KL divergence from bf16 per task, log scale",
        caption="Mean KL(bf16 reference || side) per question, log scale: a candidate's bar far above the noise "
        "floor's is quantization, not the engine.",
    ),
    _Plot(
        "probability_scatter.png",
        _scatter,
        alt="Scatter plots of option probabilities, bf16 reference against each side",
        caption="One point per option of every evaluated question; on the dashed diagonal a side gives exactly "
        "the reference's probability.",
    ),
)
