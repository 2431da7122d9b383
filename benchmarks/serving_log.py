"""An observer plugin for engines under test: appends one JSON line per request that leaves the
engine (id, lengths, times vLLM preempted it, tokens re-prefilled) to the file named by
``RLWEAVE_SERVING_LOG``, and, with ``RLWEAVE_SERVING_STEPS`` set, one line per iteration
(requests waiting after it, its wall time, rlweave's decision in it, rlweave's observation
hooks in it less this observer's own, tokens it re-prefilled) to that file, buffered and
written whenever the engine goes idle so that the hot path does no I/O.
Registered with ``RLWEAVE_PLUGIN_MODULES=rlweave.benchmarks.serving_log``."""

from __future__ import annotations

import json
import os
import time

from rlweave.hookspecs import hookimpl
from rlweave.types import EngineStep, RequestView

_steps: list[tuple[int, float, float, float, int]] = []
_own_s = 0.0  # this observer's time in the last call, which the next step's overhead includes


@hookimpl
def rlweave_request_finished(request: RequestView) -> None:
    with open(os.environ["RLWEAVE_SERVING_LOG"], "a") as f:
        f.write(json.dumps(request._asdict()) + "\n")


@hookimpl
def rlweave_engine_step(step: EngineStep) -> None:
    """The step's overhead is reported without this observer's own time in the previous call
    (the adapter counts every hook's time in the next iteration): what a user's engine pays."""
    global _own_s
    start = time.perf_counter()
    path = os.environ.get("RLWEAVE_SERVING_STEPS")
    if not path:
        return
    _steps.append((step.num_waiting, step.end_s - step.start_s, step.schedule_overhead_s,
                   max(step.observe_overhead_s - _own_s, 0.0), step.num_recomputed_tokens))
    if step.num_running == step.num_waiting == 0 or len(_steps) >= 4096:
        with open(path, "a") as f:
            f.writelines(f"{w} {s:.7f} {d:.7f} {o:.7f} {r}\n" for w, s, d, o, r in _steps)
        _steps.clear()
    _own_s = time.perf_counter() - start
