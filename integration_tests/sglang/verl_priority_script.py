"""Import-level check of the verl_sglang_priority patch on the installed verl and SGLang; prints
one JSON line of findings. No SGLang server can start here (no GPU, no SGLang CPU kernels), so
two stand-ins are used, and only for that:

- SGLang's GPU-only imports (``torchvision``; on 0.5.12 also ``sgl_kernel``): mock modules
  from :mod:`cuda_stand_ins` stand in for them; nothing checked here calls them.
- the engine behind verl's server object: a tokenizer manager that records the request verl
  hands to SGLang (the real ``GenerateReqInput``) and answers with two tokens.
"""

from __future__ import annotations

import asyncio
import inspect
import json
from types import SimpleNamespace
from typing import Any

import cuda_stand_ins  # noqa: F401 (installs the stand-ins; this script's folder is on sys.path)
import verl.workers.rollout.llm_server as client_module  # noqa: E402
import verl.workers.rollout.sglang_rollout.async_sglang_server as server_module  # noqa: E402
from omegaconf import OmegaConf  # noqa: E402
from ray._common.signature import extract_signature, flatten_args  # noqa: E402
from sglang.srt.managers.io_struct import GenerateReqInput  # noqa: E402
from sglang.srt.server_args import ServerArgs  # noqa: E402
from verl.workers.config import RolloutConfig  # noqa: E402

from rlweave.frameworks import require_supported  # noqa: E402
from rlweave.patches import REQUEST_PRIORITY, apply_patches, revert_all  # noqa: E402
from rlweave.patches.verl_sglang_priority import HANDOFF  # noqa: E402

Server, Client = server_module.SGLangHttpServer, client_module.LLMServerClient


class RecordingEngine:
    """Stands in for SGLang's TokenizerManager: keeps each request, returns two tokens."""

    def __init__(self) -> None:
        self.requests: list[Any] = []

    async def _answer(self) -> Any:
        yield {"output_ids": [7, 8], "meta_info": {"finish_reason": {"type": "length"}}}

    def generate_request(self, request: Any, _http_request: Any) -> Any:
        self.requests.append(request)
        return self._answer()


def server(policy: str, engine_kwargs: dict[str, Any] | None = None) -> Any:
    """verl's SGLang server object without its __init__ (which would start SGLang)."""
    self = object.__new__(Server)
    self.config = RolloutConfig(name="sglang", max_model_len=64, prompt_length=16, response_length=16,
                                tensor_model_parallel_size=1, scheduling_policy=policy,
                                engine_kwargs=engine_kwargs or {})
    self.model_config = SimpleNamespace(lora_rank=0, lora={})  # no LoRA; no model to launch
    self._disaggregation_role, self._pd_decode_peers, self.nnodes = "null", [], 1
    self.replica_rank, self.global_steps = 0, 1
    self.tokenizer_manager = RecordingEngine()
    return self


def client_for(target: Any) -> Any:
    """verl's LLMServerClient whose load balancer always answers with ``target`` (in-process)."""

    async def reply(value: Any) -> Any:
        return value

    handle = SimpleNamespace(generate=SimpleNamespace(remote=lambda **kw: Server.generate(target, **kw)))
    self = object.__new__(Client)
    self.config = OmegaConf.create({"actor_rollout_ref": {"rollout": {"name": "sglang"}}})
    self._load_balancer = SimpleNamespace(
        acquire_server=SimpleNamespace(remote=lambda **kw: reply(("s0", handle))),
        release_server=SimpleNamespace(remote=lambda **kw: None))
    self._lb_require_acquire_fields, self._lb_require_release_fields = [], []
    return self


def ray_accepts(method: Any, **kwargs: Any) -> bool:
    """Whether Ray's actor-call argument check (the caller's side) lets these keywords through."""
    try:
        flatten_args(extract_signature(method, ignore_first=True), [], kwargs)
        return True
    except TypeError:
        return False


async def launched_engine_kwargs(policy: str, engine_kwargs: dict[str, Any] | None = None) -> dict[str, Any]:
    """Run verl's launch_server until it needs the model (before it starts anything)."""
    target = server(policy, engine_kwargs)
    try:
        await target.launch_server()
    except AttributeError as error:
        assert "local_path" in str(error), error
    return dict(target.config.engine_kwargs)


async def main() -> dict[str, Any]:
    originals = (Client.generate, Server.generate, Server.launch_server, server_module.GenerateReqInput)
    turn = {"prompt_ids": [1, 2, 3], "sampling_params": {"max_tokens": 2}}
    out: dict[str, Any] = {"ray_accepts_priority_before": ray_accepts(Server.generate, request_id="r",
                                                                      priority=3, **turn)}

    out["applied"] = apply_patches("verl", require_supported("verl"), REQUEST_PRIORITY)
    out["ray_accepts_priority"] = ray_accepts(Server.generate, request_id="r", priority=3, **turn)
    out["ray_accepts_handoff"] = ray_accepts(Server.generate, request_id="r", **{HANDOFF: 3}, **turn)
    out["still_coroutines"] = all(inspect.iscoroutinefunction(f) for f in
                                  (Client.generate, Server.generate, Server.launch_server))

    direct = server("priority")
    tokens = (await Server.generate(direct, request_id="r1", priority=5, **turn)).token_ids
    await Server.generate(direct, request_id="r2", **turn)
    out["direct"] = [(type(r).__module__ + "." + type(r).__name__, r.priority)
                     for r in direct.tokenizer_manager.requests]
    out["direct_tokens"] = tokens

    via_client = server("priority")
    await Client.generate(client_for(via_client), "traj-1", priority=-2, **turn)
    await Client.generate(client_for(via_client), "traj-2", **turn)
    out["via_client"] = [r.priority for r in via_client.tokenizer_manager.requests]

    flags = (await launched_engine_kwargs("priority"))["sglang"]
    out["server_args_priority"] = flags
    # "dummy": SGLang 0.5.12 resolves the model and the accelerator in ServerArgs.__post_init__
    # (none here) and skips that for this name; 0.5.23 resolves nothing at construction.
    args = ServerArgs(model_path="dummy", **flags)
    out["sglang_server_args"] = [args.enable_priority_scheduling, args.schedule_low_priority_values_first,
                                 args.default_priority_value]
    out["server_args_user_wins"] = (await launched_engine_kwargs(
        "priority", {"sglang": {"schedule_low_priority_values_first": False}}))["sglang"]
    out["server_args_fcfs"] = await launched_engine_kwargs("fcfs")

    revert_all()
    out["reverted"] = (Client.generate, Server.generate, Server.launch_server,
                       server_module.GenerateReqInput) == originals
    out["request_type_is_sglangs"] = server_module.GenerateReqInput is GenerateReqInput
    return out


print(json.dumps(asyncio.run(main())))
