"""vLLM adapter, loaded by vLLM's ``vllm.general_plugins`` entry point in every vLLM process
(frontend, EngineCore, workers).

With no rlweave plugin enabled it returns at once. Otherwise it checks vLLM's version, applies
the vLLM patches (so the EngineCore builds rlweave's scheduler) and fires
``rlweave_framework_loaded``.
"""

from __future__ import annotations

import multiprocessing

from rlweave.host import get_host
from rlweave.types import FrameworkInfo

_registered = False


def register() -> None:
    """vLLM calls this once per process (``load_general_plugins``); safe to call again."""
    global _registered
    host = get_host()
    if _registered or not host.active:
        return
    from rlweave.frameworks import require_supported
    from rlweave.patches import apply_patches

    version = require_supported("vllm")
    apply_patches("vllm", version)
    _registered = True
    role = multiprocessing.current_process().name
    host.hook.rlweave_framework_loaded(framework=FrameworkInfo("vllm", version, role))
