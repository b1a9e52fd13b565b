"""The 95% intervals of `clef-quant eval`: their coverage on synthetic probabilities, and how results show them."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from clef_quant.bootstrap import covers_zero
from clef_quant.evaluation.comparison import INTERVAL_METRICS, MIN_RECORDS, paired_intervals, t_quantile
from clef_quant.evaluation.frames import differences_frame, intervals_frame, load_intervals
from clef_quant.evaluation.report import interval_section, render_markdown
from clef_quant.evaluation.results import ALL, RESULTS_FORMAT, ResultsFile, metric_entries, read_results
from clef_quant.evaluation.tables import INDISTINGUISHABLE

OPTIONS = 4
KL, AGREE = INTERVAL_METRICS.index("kl"), INTERVAL_METRICS.index("agreement")


def softmax(x: np.ndarray) -> np.ndarray:
    e = np.exp(x - x.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


class Population:
    """Synthetic records of 1 to 3 questions: a reference's probabilities and sides that perturb its logits by
    `noise` each. Its per-record sums of INTERVAL_METRICS are what eval's `question_sums` gives for real records."""

    def __init__(self, records: int, noises: list[float], seed: int = 0) -> None:
        rng = np.random.default_rng(seed)
        self.counts = rng.integers(1, 4, size=records)
        record_of = np.repeat(np.arange(records), self.counts)  # the record of every question
        logits = rng.normal(0.0, 1.5, size=(len(record_of), OPTIONS))
        reference = softmax(logits)
        gold = rng.integers(0, OPTIONS, size=len(record_of))
        per_side = []
        for noise in noises:
            side = softmax(logits + rng.normal(0.0, noise, size=logits.shape))
            observed = np.stack(
                [
                    (side.argmax(1) == gold).astype(float),
                    (side.argmax(1) == reference.argmax(1)).astype(float),
                    (reference * (np.log(reference) - np.log(side))).sum(1),
                    0.5 * np.abs(reference - side).sum(1),
                ],
                axis=1,
            )  # (questions, metrics) in INTERVAL_METRICS order
            sums = np.zeros((records, len(INTERVAL_METRICS)))
            np.add.at(sums, record_of, observed)
            per_side.append(sums)
        self.sums = np.stack(per_side, axis=1)  # (records, sides, metrics)

    def mean(self, rows: np.ndarray | slice = slice(None)) -> np.ndarray:
        """(sides, metrics): the question means over the records `rows`."""
        return self.sums[rows].sum(0) / self.counts[rows].sum()


def coverage(
    population: Population, pair: tuple[int, int], metric: int, draws: int, size: int, tasks: int = 2
) -> float:
    """How often the interval of the difference of `pair` over All covers the population's, over `draws` samples
    of `size` records in `tasks` tasks of (about) equal size, each sample drawn with its own seed."""
    truth = population.mean()[pair[0], metric] - population.mean()[pair[1], metric]
    keys = [str(i) for i in range(population.sums.shape[1])]
    sizes = {f"t{k}": size // tasks + (k < size % tasks) for k in range(tasks)}
    covered = 0
    for seed in range(draws):
        rows = np.random.default_rng(1000 + seed).choice(len(population.counts), size=size, replace=False)
        drawn = paired_intervals(sizes, keys, population.sums[rows], population.counts[rows], [pair])
        found = next(d for d in drawn.differences if d.task == ALL and d.metric == INTERVAL_METRICS[metric])
        covered += found.low <= truth <= found.high
    return covered / draws


@pytest.fixture(scope="module")
def population() -> Population:
    # sides 0 and 1 differ (a known difference); sides 1 and 2 are drawn alike (a zero difference)
    return Population(40_000, [0.6, 1.0, 1.0])


@pytest.mark.parametrize("metric", [KL, AGREE])
def test_the_interval_of_a_known_difference_covers_it_at_the_stated_rate(population: Population, metric: int) -> None:
    truth = population.mean()[0, metric] - population.mean()[1, metric]
    assert abs(truth) > 0.02  # the difference is real
    rate = coverage(population, (0, 1), metric, draws=200, size=120)
    assert 0.89 <= rate <= 0.99, rate  # 95% stated; 200 draws put the observed rate within about 3 points


@pytest.mark.parametrize("metric", [KL, AGREE])
def test_a_zero_difference_gives_intervals_that_cover_0(population: Population, metric: int) -> None:
    assert abs(population.mean()[1, metric] - population.mean()[2, metric]) < 0.01
    rate = coverage(population, (1, 2), metric, draws=200, size=120)
    assert rate >= 0.89, rate


def test_the_same_probabilities_give_0_exactly_and_are_indistinguishable(population: Population) -> None:
    sums = np.concatenate([population.sums[:50, :1], population.sums[:50, :1]], axis=1)  # one side twice
    drawn = paired_intervals({"t": 50}, ["x", "y"], sums, population.counts[:50], [(0, 1)])
    for d in drawn.differences:
        assert (d.difference, d.low, d.high) == (0.0, 0.0, 0.0) and d.distinguishable is False


def test_the_differences_are_paired(population: Population) -> None:
    rows = slice(0, 80)
    args = ({"t": 80}, ["x", "y"], population.sums[rows, :2], population.counts[rows], [(0, 1)])
    first, again = paired_intervals(*args), paired_intervals(*args)
    assert first == again
    # paired: the difference's interval is narrower than the two sides' intervals allow when both sides move
    # together (the records that are hard for one are hard for the other)
    kl = next(d for d in first.differences if d.task == ALL and d.metric == "kl")
    x, y = first.bounds["x"][ALL]["kl"], first.bounds["y"][ALL]["kl"]
    assert kl.high - kl.low < (x[1] - x[0]) + (y[1] - y[0])
    point = population.mean(rows)
    assert kl.difference == pytest.approx(point[0, KL] - point[1, KL])
    assert x[0] < point[0, KL] < x[1]


@pytest.mark.parametrize("metric", [KL, AGREE])
def test_a_few_records_in_small_tasks_still_cover_at_the_stated_rate(population: Population, metric: int) -> None:
    """14 records in 7 tasks of 2, as `build-data --per-task 2` gives: above the minimum, so All is decided. The
    percentile bootstrap drawn within tasks covered a real difference about 75% of the time here, and told two
    alike sides apart about 20% of the time."""
    assert MIN_RECORDS <= 14
    assert coverage(population, (0, 1), metric, draws=200, size=14, tasks=7) >= 0.89
    assert coverage(population, (1, 2), metric, draws=200, size=14, tasks=7) >= 0.91


def test_t_quantiles_match_the_tables() -> None:
    assert t_quantile(0.95, 1) == pytest.approx(12.7062, abs=1e-4)
    assert t_quantile(0.95, 9) == pytest.approx(2.2622, abs=1e-4)
    assert t_quantile(0.99, 30) == pytest.approx(2.7500, abs=1e-4)
    assert t_quantile(0.95, 10_000) == pytest.approx(1.9602, abs=1e-4)


@pytest.mark.parametrize("records", [1, MIN_RECORDS - 1])
def test_below_the_minimum_of_records_nothing_is_decided(records: int) -> None:
    results = ResultsFile.model_validate(json.loads(json.dumps(results_with_intervals(records))))
    assert results.intervals.min_records == MIN_RECORDS
    candidate = results.candidates[0]
    assert results.bound(candidate, ALL, "kl") is None and results.at_floor(candidate) is None
    differences = differences_frame(results)
    assert len(differences) and differences["distinguishable"].isna().all()
    assert differences["difference"].notna().all()  # the measured difference itself is still shown

    from clef_quant.evaluation.frames import values_frame

    section = render_markdown(results, values_frame(results)).split("## How sure: 95% intervals")[1]
    why = f"too few records to decide (n = {records} < {MIN_RECORDS})"
    assert why in section
    assert "closer to bf16" not in section and "below the floor" not in section and "at the floor" not in section
    rows = [line for line in section.splitlines() if line.startswith("| noise floor − tiny-A | KL |")]
    assert len(rows) == 1 and why in rows[0]

    from clef_quant.publish.results import EvalResults

    card = EvalResults(Path("results"), results, candidate)  # what the model card shows of the same file
    assert card.undecided == why and why in card.floor_verdict
    assert "closer to bf16" not in card.differences_table and why in card.differences_table


# -- in results.json, results.md and the frames ---------------------------------------------------------------


def results_with_intervals(records: int = 60) -> dict[str, Any]:
    """results.json of a run with a noise floor close to bf16 and two candidates far from it, B scoring as A."""
    population = Population(records, [0.0, 0.05, 1.0], seed=3)
    population.sums = population.sums[:, [0, 1, 2, 2]]
    keys = ["reference", "floor", "cand-a", "cand-b"]
    roles = ["reference", "noise-floor", "candidate", "candidate"]
    names = ["bf16 reference", "noise floor", "tiny-A", "tiny-B"]
    sides = [{"key": k, "name": n, "role": r, "folder": n} for k, n, r in zip(keys, names, roles, strict=True)]
    pairs = [(1, 2), (1, 3), (2, 3)]
    drawn = paired_intervals({"mmlu": records}, keys, population.sums, population.counts, pairs)
    point = population.mean()
    values = {
        k: {t: dict(zip(INTERVAL_METRICS, point[i], strict=True)) for t in ("mmlu", ALL)} for i, k in enumerate(keys)
    }
    written = ResultsFile(
        format=RESULTS_FORMAT,
        tasks=[{"name": "mmlu", "records": records, "questions": int(population.counts.sum())}],
        metrics=metric_entries(),
        sides=sides,
        values=values,
    )
    written.intervals = drawn.settings
    written.bounds = {
        k: {t: {m: list(b) for m, b in r.items()} for t, r in per.items()} for k, per in drawn.bounds.items()
    }
    written.differences = drawn.differences
    return written.to_json()


def test_results_md_says_which_differences_are_indistinguishable(tmp_path: Path) -> None:
    raw = results_with_intervals()
    results = ResultsFile.model_validate(json.loads(json.dumps(raw)))
    differences = differences_frame(results)
    by_pair = differences[(differences["task"] == ALL) & (differences["metric"] == "kl")].set_index(["a", "b"])
    assert by_pair.at[("noise floor", "tiny-A"), "distinguishable"]
    assert by_pair.at[("noise floor", "tiny-A"), "high"] < 0  # the floor is closer to bf16, and it shows
    alike = by_pair.loc[("tiny-A", "tiny-B")]
    assert alike["low"] <= 0 <= alike["high"] and not alike["distinguishable"]
    assert results.at_floor(results.candidates[0]) is False

    from clef_quant.evaluation.frames import values_frame

    markdown = render_markdown(results, values_frame(results))
    section = markdown.split("## How sure: 95% intervals")[1].split("\n## ")[0]
    assert "t-interval" in section and f"fewer than {MIN_RECORDS} records" in section
    kl_rows = [line for line in section.splitlines() if line.startswith("| tiny-A − tiny-B | KL |")]
    assert len(kl_rows) == 1 and INDISTINGUISHABLE in kl_rows[0]
    floor_rows = [line for line in section.splitlines() if line.startswith("| noise floor − tiny-A | KL |")]
    assert "noise floor closer to bf16" in floor_rows[0]
    assert "below the floor: its agreement interval lies under the noise floor's" in section

    frame = intervals_frame(results)
    kl = frame[(frame["side_key"] == "cand-a") & (frame["task"] == ALL) & (frame["metric"] == "kl")].iloc[0]
    assert kl["low"] <= kl["value"] <= kl["high"]
    (tmp_path / "results.json").write_text(json.dumps(raw))
    intervals, differences_read = load_intervals(tmp_path)
    assert intervals.equals(frame) and len(differences_read) == len(differences)


def test_results_of_a_run_before_intervals_still_read_and_render(tmp_path: Path) -> None:
    from test_eval_results_file import early_results, write

    results = read_results(write(tmp_path, early_results()))
    assert results.intervals is None and results.bound(results.candidates[0], ALL, "kl") is None
    assert results.at_floor(results.candidates[0]) is None
    assert intervals_frame(results).empty and differences_frame(results).empty

    assert interval_section(results) == []  # results.md shows no interval section
    assert not covers_zero(0.1, 0.2) and covers_zero(-0.1, 0.2)
