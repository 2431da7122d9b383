"""SGLang adapter, loaded by SGLang's ``sglang.srt.plugins`` entry point (``load_plugins()``
runs it in SGLang's main, scheduler and worker processes).

With no rlweave plugin enabled it returns at once; otherwise it checks SGLang's version and
fires ``rlweave_framework_loaded``. SGLang cannot run on a CPU-only machine from PyPI (its CPU
kernels are not published), so this adapter is tested at import level only.
"""

from __future__ import annotations

import multiprocessing

from rlweave.adapters import refusals_exit
from rlweave.host import get_host
from rlweave.types import FrameworkInfo

_registered = False


def register() -> None:
    """SGLang calls this once per process; safe to call again. SGLang logs a plugin's error and
    goes on without it, which would leave a job running with its rlweave flags ignored, so
    rlweave's refusals stop the process with one message (:func:`refusals_exit`)."""
    with refusals_exit():
        _register()


def _register() -> None:
    global _registered
    host = get_host()
    if _registered or not host.active:
        return
    from rlweave.frameworks import require_supported

    version = require_supported("sglang")
    _registered = True
    role = multiprocessing.current_process().name
    host.hook.rlweave_framework_loaded(framework=FrameworkInfo("sglang", version, role))
