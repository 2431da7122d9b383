"""An observer plugin for engines under test: appends one JSON line per request that leaves the
engine (id, lengths, times vLLM preempted it, tokens re-prefilled) to the file named by
``RLWEAVE_SERVING_LOG``, and, with ``RLWEAVE_SERVING_STEPS`` set, one line per iteration
(requests waiting after it, its wall time, rlweave's overhead in it, tokens it re-prefilled) to
that file, buffered and written whenever the engine goes idle so that the hot path does no I/O.
Registered with ``RLWEAVE_PLUGIN_MODULES=rlweave.benchmarks.serving_log``."""

from __future__ import annotations

import json
import os
from dataclasses import asdict

from rlweave.hookspecs import hookimpl
from rlweave.types import EngineStep, RequestView

_steps: list[str] = []


@hookimpl
def rlweave_request_finished(request: RequestView) -> None:
    with open(os.environ["RLWEAVE_SERVING_LOG"], "a") as f:
        f.write(json.dumps(asdict(request)) + "\n")


@hookimpl
def rlweave_engine_step(step: EngineStep) -> None:
    path = os.environ.get("RLWEAVE_SERVING_STEPS")
    if not path:
        return
    _steps.append(f"{step.num_waiting} {step.end_s - step.start_s:.7f} "
                  f"{step.schedule_overhead_s:.7f} {step.num_recomputed_tokens}\n")
    if step.num_running == step.num_waiting == 0 or len(_steps) >= 4096:
        with open(path, "a") as f:
            f.writelines(_steps)
        _steps.clear()
