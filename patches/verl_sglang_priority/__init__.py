"""verl forwards each request's priority to SGLang, and turns on SGLang's priority scheduling.

verl 0.9 passes an agent loop's per-turn ``priority`` to vLLM only. On the SGLang rollout it is
lost in three places, and this patch wraps each at its narrowest point (no verl code copied):

- ``LLMServerClient.generate`` drops ``priority`` unless ``rollout.name == "vllm"``. For SGLang
  the wrapper hands it on under :data:`HANDOFF`, a keyword verl passes through to the server
  untouched (its ``**kwargs``).
- ``SGLangHttpServer.generate`` has no ``priority`` parameter. The wrapper accepts it (and the
  hand-off) and holds it in a context variable while verl builds the request; the name
  ``GenerateReqInput`` in verl's module becomes a builder that gives SGLang's request object
  that priority. A PD prefill's nested local call inherits it; the remote decode half does not.
- ``SGLangHttpServer.launch_server`` never sets SGLang's priority flags. Under
  ``rollout.scheduling_policy=priority`` the wrapper adds :data:`PRIORITY_SERVER_ARGS` to
  ``rollout.engine_kwargs.sglang`` (verl's own path into SGLang's server arguments); values the
  user set there win. They make SGLang order as vLLM does: lower values first, and a request
  without a priority counts as 0 (SGLang's default would run higher values first and put
  requests without one last).

The server side is patched only where SGLang is installed, and then importing verl's SGLang
server (and SGLang's engine) is part of applying the patch, in each verl process.
"""

from __future__ import annotations

import importlib.util
from contextvars import ContextVar
from typing import Any

from rlweave.patches import Revert

HANDOFF = "rlweave_priority"
PRIORITY_SERVER_ARGS: dict[str, Any] = {
    "enable_priority_scheduling": True,
    "schedule_low_priority_values_first": True,
    "default_priority_value": 0,
}

_priority: ContextVar[int | None] = ContextVar("rlweave_sglang_priority", default=None)


def with_priority_server_args(engine_kwargs: dict[str, Any] | None) -> dict[str, Any]:
    """``rollout.engine_kwargs`` with SGLang's priority flags added under ``sglang``."""
    engine_kwargs = dict(engine_kwargs or {})
    engine_kwargs["sglang"] = {**PRIORITY_SERVER_ARGS, **(engine_kwargs.get("sglang") or {})}
    return engine_kwargs


def apply() -> Revert:
    reverts = [_forward_from_client()]
    if importlib.util.find_spec("sglang") is not None:  # without SGLang, verl has no SGLang server
        reverts.append(_accept_on_server())

    def revert() -> None:
        for undo in reversed(reverts):
            undo()

    return revert


# No functools.wraps below: Ray checks actor-call keywords against inspect.signature, which would
# follow __wrapped__ to verl's signature and refuse ``priority``. The wrappers stay coroutine
# functions, which Ray's async actors require.


def _forward_from_client() -> Revert:
    from verl.workers.rollout.llm_server import LLMServerClient

    original = LLMServerClient.generate

    async def generate(self: Any, *args: Any, **kwargs: Any) -> Any:
        if "priority" in kwargs and self.config.actor_rollout_ref.rollout.name == "sglang":
            kwargs[HANDOFF] = kwargs.pop("priority")
        return await original(self, *args, **kwargs)

    LLMServerClient.generate = generate

    def revert() -> None:
        LLMServerClient.generate = original

    return revert


def _accept_on_server() -> Revert:
    import verl.workers.rollout.sglang_rollout.async_sglang_server as module

    server = module.SGLangHttpServer
    originals = (server.generate, server.launch_server, module.GenerateReqInput)
    original_generate, original_launch, request_type = originals

    async def generate(self: Any, *args: Any, priority: int | None = None, **kwargs: Any) -> Any:
        priority = kwargs.pop(HANDOFF, priority)
        if priority is None:  # a nested call (PD prefill) keeps its caller's priority
            return await original_generate(self, *args, **kwargs)
        token = _priority.set(int(priority))
        try:
            return await original_generate(self, *args, **kwargs)
        finally:
            _priority.reset(token)

    def build_request(**request: Any) -> Any:
        return request_type(**{"priority": _priority.get(), **request})

    async def launch_server(self: Any, *args: Any, **kwargs: Any) -> Any:
        if self.config.scheduling_policy == "priority":
            self.config.engine_kwargs = with_priority_server_args(self.config.engine_kwargs)
        return await original_launch(self, *args, **kwargs)

    server.generate, server.launch_server, module.GenerateReqInput = generate, launch_server, build_request

    def revert() -> None:
        server.generate, server.launch_server, module.GenerateReqInput = originals

    return revert
