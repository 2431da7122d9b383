"""Test plugin: admits vLLM's waiting requests newest first, and counts its decisions."""

from __future__ import annotations

import os
from collections.abc import Sequence

from rlweave.hookspecs import hookimpl
from rlweave.types import EngineInfo, RequestView, ScheduleDecision


@hookimpl
def rlweave_schedule(
    waiting: Sequence[RequestView], running: Sequence[RequestView], engine: EngineInfo
) -> ScheduleDecision:
    with open(os.environ["REVERSE_PLUGIN_LOG"], "a") as f:
        f.write(f"{os.getpid()} {len(waiting)}\n")
    return ScheduleDecision(waiting_order=tuple(r.request_id for r in reversed(waiting)))
