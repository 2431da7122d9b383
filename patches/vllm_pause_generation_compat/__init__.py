"""verl 0.9 calls ``AsyncLLM.pause_generation(wait_for_inflight_requests=..., clear_cache=...)``;
vLLM 0.32 replaced that keyword by ``mode``. The wrapper maps ``False`` to ``mode="abort"``
and ``True`` to ``mode="wait"``, which is what the old keyword meant."""

from __future__ import annotations

from rlweave.patches import Revert


def apply() -> Revert:
    from vllm.v1.engine.async_llm import AsyncLLM

    original = AsyncLLM.pause_generation

    async def pause_generation(self, *args, wait_for_inflight_requests=None, **kwargs):  # type: ignore[no-untyped-def]
        if wait_for_inflight_requests is not None and "mode" not in kwargs:
            kwargs["mode"] = "wait" if wait_for_inflight_requests else "abort"
        return await original(self, *args, **kwargs)

    AsyncLLM.pause_generation = pause_generation

    def revert() -> None:
        AsyncLLM.pause_generation = original

    return revert
