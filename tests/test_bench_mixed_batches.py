"""`bench modes`' check of answers inside batches of random sizes and mixed lengths: what it compares, on a real
engine. The default mode must give every request the bits it got alone; the check counts the differences it finds."""

from __future__ import annotations

from pathlib import Path

import torch
from plugins.engines import ENGINE_MAX_MODEL_LEN


def test_the_mixed_batches_hold_prompts_of_every_length_and_the_default_mode_answers_them_as_alone(
    clef_engine, tiny_dir: Path
) -> None:
    from clef_quant.bench.modes import MIXED_ROUNDS, ModeRun, check_mixed_batches
    from clef_quant.bench.workload import MIXED_STATE_WORDS, mixed_length_requests, serving_requests

    engine = clef_engine(tiny_dir)
    workload = [engine.encode(body)[1] for body in serving_requests(12, state_words=40)]
    mixed = [engine.encode(body)[1] for body in mixed_length_requests()]
    lengths = sorted(e.num_tokens for e in mixed)
    assert len(mixed) == len(MIXED_STATE_WORDS)
    assert lengths[0] * 8 < lengths[-1] == ENGINE_MAX_MODEL_LEN  # the questions alone, up to the longest allowed
    alone = [engine.logits([encoding])[0] for encoding in workload[:4]]

    run = ModeRun(str(tiny_dir), "bf16", "invariant", {}, 0.0)
    check_mixed_batches(engine, workload, alone, mixed, run)
    # Every mixed-length prompt in each round, plus the probes the round drew from the workload.
    assert MIXED_ROUNDS * len(mixed) <= run.mixed_checked <= MIXED_ROUNDS * (len(mixed) + len(alone))
    assert (run.mixed_identical, run.mixed_max_dp) == (run.mixed_checked, 0.0)

    # A reference that is not the request's own answer is counted as a difference, with its size.
    shifted = [answer + 0.25 for answer in alone]
    other = ModeRun(str(tiny_dir), "bf16", "invariant", {}, 0.0)
    check_mixed_batches(engine, workload, shifted, mixed, other)
    assert other.mixed_checked == run.mixed_checked
    assert other.mixed_identical == MIXED_ROUNDS * len(mixed)
    assert torch.isclose(torch.tensor(other.mixed_max_dp), torch.tensor(0.25))
