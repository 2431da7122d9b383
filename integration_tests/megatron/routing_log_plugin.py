"""Test plugin: appends every routing trace's shape to ``$ROUTING_LOG`` (one line per call)."""

from __future__ import annotations

import os

from rlweave.hookspecs import hookimpl
from rlweave.types import RoutingTrace


@hookimpl
def rlweave_routing_recorded(trace: RoutingTrace) -> None:
    with open(os.environ["ROUTING_LOG"], "a") as f:
        f.write(f"{os.getpid()} {list(trace.topk_ids.shape)} {trace.topk_ids.max()}\n")
