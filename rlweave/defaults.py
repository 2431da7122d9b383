"""rlweave's core implementations: the framework's own behaviour behind every wrapper hook."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from rlweave.hookspecs import hookimpl
from rlweave.types import StageContext


@hookimpl(trylast=True)
def rlweave_run_stage(context: StageContext, run: Callable[[], Any]) -> Any:
    """Run the framework's own stage; plugins wrap or replace this."""
    return run()
