"""On a GPU: which Gated DeltaNet layers replay their graphs for a one-prompt step, and whether a request alone gets
the bits it gets in one batch, on a release folder.

vLLM's GPU model runner gives each KV-cache group of Gated DeltaNet layers its own copy of the step's metadata
(`clef_vllm.engine.gdn_graphs.keeping_mark`); a layer whose copy lost the one-prompt mark runs vLLM's path. This
counts, per layer index, the steps that replayed a graph and those that did not, on three Flide-shaped requests
(two short enough for the graphs, one longer), times them, and compares each one's logits alone and in one batch.

    python scripts/check_gdn_graphs.py /dev/shm/small   # clef-quant make-tiny /dev/shm/small --size small --device cuda
"""

from __future__ import annotations

import os
import sys
import time
from collections import Counter

os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")


def main() -> None:
    import torch

    from clef_quant.bench.flide_workloads import flide_workloads
    from clef_vllm.engine import ClefEngine, gdn_graphs

    hits, falls = Counter(), Counter()
    forward = gdn_graphs.PromptGraphs.forward

    def counting(self, index, mixed_qkv, b, a, core_attn_out):
        if not torch.cuda.is_current_stream_capturing():
            tokens, _ = self._qualifies(index, mixed_qkv)
            (hits if tokens is not None else falls)[index] += 1
        return forward(self, index, mixed_qkv, b, a, core_attn_out)

    gdn_graphs.PromptGraphs.forward = counting
    model = sys.argv[1]
    t = time.perf_counter()
    engine = ClefEngine(model, max_model_len=12288)
    device = torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu"
    print(f"engine start {time.perf_counter() - t:.1f} s on {device}", flush=True)
    bodies = [w.body for w in flide_workloads(model, names=("decision-index", "race", "multirc"))]
    for body in bodies:
        engine.score([body])
    hits.clear()
    falls.clear()
    times = []
    for body in bodies:
        for _ in range(5):
            t = time.perf_counter()
            engine.score([body])
            times.append((body["id"], (time.perf_counter() - t) * 1000))
    print("graph replays per GDN layer index:", dict(sorted(hits.items())), flush=True)
    print("vLLM path per GDN layer index:", dict(sorted(falls.items())), flush=True)
    for name in dict.fromkeys(n for n, _ in times):
        ms = sorted(v for n, v in times if n == name)
        print(f"{name}: p50 {ms[len(ms) // 2]:.1f} ms, all {[round(v, 1) for v in ms]}", flush=True)
    encodings = [engine.encode(body)[1] for body in bodies]
    alone_logits = [engine.logits([e])[0] for e in encodings]
    together = engine.logits(encodings)
    print(
        "alone == in one batch (torch.equal):",
        [torch.equal(a, b) for a, b in zip(alone_logits, together, strict=True)],
        flush=True,
    )
    engine.close()


if __name__ == "__main__":
    main()
