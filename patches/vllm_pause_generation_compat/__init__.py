"""verl 0.9 calls ``AsyncLLM.pause_generation(wait_for_inflight_requests=..., clear_cache=...)``.
vLLM 0.24 still takes that keyword; 0.32 through 0.34 replaced it by ``mode``. Where the
installed ``pause_generation`` lacks it (found from its signature, not the version), the
wrapper maps ``False`` to ``mode="abort"`` and ``True`` to ``mode="wait"``, which is what the
old keyword meant; where it has it, nothing is wrapped. Applied in every vLLM process where
rlweave is on, on any platform: verl's abort path runs in its vLLM server process."""

from __future__ import annotations

import inspect

from rlweave.patches import Revert

OLD_KEYWORD = "wait_for_inflight_requests"


def apply() -> Revert:
    from vllm.v1.engine.async_llm import AsyncLLM

    original = AsyncLLM.pause_generation
    if OLD_KEYWORD in inspect.signature(original).parameters:  # vLLM 0.24: verl's call fits
        return lambda: None

    async def pause_generation(self, *args, wait_for_inflight_requests=None, **kwargs):  # type: ignore[no-untyped-def]
        if wait_for_inflight_requests is not None and "mode" not in kwargs:
            kwargs["mode"] = "wait" if wait_for_inflight_requests else "abort"
        return await original(self, *args, **kwargs)

    AsyncLLM.pause_generation = pause_generation

    def revert() -> None:
        AsyncLLM.pause_generation = original

    return revert
