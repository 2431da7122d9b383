"""An observer plugin for engines under test: appends one JSON line per request that leaves the
engine (id, lengths, times vLLM preempted it) to the file named by ``RLWEAVE_SERVING_LOG``.
Registered with ``RLWEAVE_PLUGIN_MODULES=rlweave.benchmarks.serving_log``."""

from __future__ import annotations

import json
import os
from dataclasses import asdict

from rlweave.hookspecs import hookimpl
from rlweave.types import RequestView


@hookimpl
def rlweave_request_finished(request: RequestView) -> None:
    with open(os.environ["RLWEAVE_SERVING_LOG"], "a") as f:
        f.write(json.dumps(asdict(request)) + "\n")
