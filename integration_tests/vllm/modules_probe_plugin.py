"""Test plugin: after every finished request, writes the module names loaded in the process
that finished it (the EngineCore, where rlweave's scheduler runs) to ``$MODULES_PROBE_OUT``."""

from __future__ import annotations

import json
import multiprocessing
import os
import sys

from rlweave.hookspecs import hookimpl
from rlweave.types import RequestView


@hookimpl
def rlweave_request_finished(request: RequestView) -> None:
    seen = {"process": multiprocessing.current_process().name, "modules": sorted(sys.modules)}
    with open(os.environ["MODULES_PROBE_OUT"], "w") as out:
        json.dump(seen, out)
