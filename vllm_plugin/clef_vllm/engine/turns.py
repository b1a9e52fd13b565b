"""Long prompts in pieces of a fixed size, one piece a step, requests in flight taking turns (`--prompt-chunk`).

Where each step runs one whole prompt (a CPU; NVFP4 before Blackwell: `clef_vllm.engine.invariance`), a step in
progress is never interrupted, so a short request that arrives behind a full-length prompt waits for all of it:
about 1.8 s for 16,384 tokens of the tiny model on two cores, twice that behind two. With a chunk size N, a prompt
longer than N runs in pieces of exactly N tokens (the last one shorter), each alone in its step, and the requests
in flight take steps in turn: the one whose last step (or arrival) is oldest goes next. A short request then waits
for the piece in progress and one piece of each request ahead of it.

Answers still do not depend on load: where a prompt is cut depends only on its length and N, and every piece runs
alone in its step. For prompts longer than N they differ slightly from the whole prompt's: the later pieces read
the earlier pieces' keys, values and Gated DeltaNet state from the cache, with other roundings.

vLLM's scheduler gives every running request a share of each step and admits waiting ones with what is left. This
one shows it a single request per step (the others are set aside for the call and put back in their places), so
vLLM's own code still decides the piece, allocates its cache blocks and builds the step. In-flight requests are
capped at what the KV cache holds at full length, so no request's blocks are ever taken back for another's piece.
"""

from __future__ import annotations

import itertools
from typing import Any

from vllm.v1.core.kv_cache_utils import get_max_concurrency_for_kv_cache_config
from vllm.v1.core.sched.output import SchedulerOutput
from vllm.v1.core.sched.request_queue import RequestQueue, create_request_queue
from vllm.v1.core.sched.scheduler import Scheduler
from vllm.v1.request import Request

QUALNAME = f"{__name__}.TurnScheduler"


class TurnScheduler(Scheduler):
    """vLLM's scheduler, one request per step, in turns (see the module docstring)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        at_full_length = int(get_max_concurrency_for_kv_cache_config(self.vllm_config, self.kv_cache_config))
        self.in_flight_limit = max(1, min(self.max_num_running_reqs, at_full_length))
        self._clock = itertools.count(1)
        self._last_turn: dict[str, int] = {}

    def add_request(self, request: Request) -> None:
        self._last_turn[request.request_id] = next(self._clock)
        super().add_request(request)

    def schedule(self, throttle_prefills: bool = False) -> SchedulerOutput:
        chosen = self._next_turn()
        if chosen is None:
            return super().schedule(throttle_prefills)
        running, waiting, holding = self.running, self.waiting, self.kv_holding_waiting
        self.running = [r for r in running if r is chosen]
        self.waiting = _queue_of(self, [chosen] if _holds(waiting, chosen) else [])
        self.kv_holding_waiting = _queue_of(self, [chosen] if _holds(holding, chosen) else [])
        try:
            return super().schedule(throttle_prefills)
        finally:
            # Whether or not it got its piece (vLLM may have no blocks or encoder budget for it), the turn passes:
            # the next step goes to another request.
            self._last_turn[chosen.request_id] = next(self._clock)
            self.running = [r for r in running if r is not chosen] + self.running
            self.waiting = _put_back(waiting, chosen, self.waiting)
            self.kv_holding_waiting = _put_back(holding, chosen, self.kv_holding_waiting)

    def _next_turn(self) -> Request | None:
        """The request in flight, or admissible, whose last turn (or arrival) is oldest."""
        for request_id in [i for i in self._last_turn if i not in self.requests]:
            del self._last_turn[request_id]  # finished or aborted
        candidates = list(self.running) + list(self.kv_holding_waiting)
        if len(self.running) < self.in_flight_limit:
            candidates += list(self.waiting)
        return min(candidates, key=lambda r: self._last_turn.get(r.request_id, 0), default=None)


def _holds(queue: RequestQueue, request: Request) -> bool:
    return any(r is request for r in queue)


def _queue_of(scheduler: Scheduler, requests: list[Request]) -> RequestQueue:
    queue = create_request_queue(scheduler.policy)
    for request in requests:
        queue.add_request(request)
    return queue


def _put_back(original: RequestQueue, chosen: Request, left: RequestQueue) -> RequestQueue:
    """`original` with `chosen` out of it unless vLLM left it waiting, and first whatever vLLM put back this step
    (the chosen request if it could not start, a request it preempted)."""
    if _holds(original, chosen):
        original.remove_request(chosen)
    for request in reversed(list(left)):
        original.prepend_request(request)
    return original
