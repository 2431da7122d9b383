"""vLLM's real v1 scheduler, driven with no model and no device, as vLLM's own
``tests/v1/core`` tests drive it: requests arrive, every iteration is scheduled by the real
``Scheduler`` / ``AsyncScheduler`` over a real ``KVCacheManager``, a stand-in model runner
samples one made-up token per request that finished its prompt, and ``update_from_output``
does the rest. What a model runner would get is checked on the way (:class:`RunnerView`).

The stand-in runner is the one thing mocked here: vLLM 0.24 (torch 2.11 kernels), 0.33 and
0.34 (CUDA builds) have no engine that runs on this CPU machine.
"""

from __future__ import annotations

import dataclasses
import json
import time
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

STAND_IN_ARCH = "RlweaveSchedulerOnlyForCausalLM"
BLOCK_SIZE = 16


class SchedulerOnlyModel(torch.nn.Module):
    """Registered under :data:`STAND_IN_ARCH` so that ``ModelConfig`` inspects a class in this
    process instead of importing vLLM's whole model stack in a subprocess; never built."""

    def __init__(self, *, vllm_config: Any, prefix: str = "") -> None:
        raise AssertionError("the scheduler harness builds no model")

    def embed_input_ids(self, input_ids: Any) -> Any:
        raise AssertionError

    def forward(self, input_ids: Any, positions: Any, intermediate_tensors: Any = None,
                inputs_embeds: Any = None) -> Any:
        raise AssertionError

    def compute_logits(self, hidden_states: Any) -> Any:
        raise AssertionError


def model_dir(root: Path) -> Path:
    """A small Llama's ``config.json`` (no weights, no tokenizer) under the stand-in's name."""
    config = dict(architectures=[STAND_IN_ARCH], model_type="llama", hidden_size=64,
                  intermediate_size=128, num_attention_heads=1, num_key_value_heads=1,
                  head_dim=64, num_hidden_layers=1, vocab_size=1024, max_position_embeddings=1024,
                  torch_dtype="float32", rms_norm_eps=1e-6)
    root.mkdir(parents=True, exist_ok=True)
    (root / "config.json").write_text(json.dumps(config))
    return root


def build_scheduler(cls: type | None, model: Path, *, num_blocks: int, max_num_seqs: int,
                    max_num_batched_tokens: int = 256, policy: str = "fcfs",
                    prefix_caching: bool = False) -> Any:
    """``cls`` (vLLM's scheduler class or rlweave's subclass; None: the class vLLM's config
    picks, as EngineCore does) over a real config and KV layout."""
    from vllm import ModelRegistry
    from vllm.config import CacheConfig, DeviceConfig, ModelConfig, SchedulerConfig, VllmConfig
    from vllm.v1.kv_cache_interface import FullAttentionSpec, KVCacheConfig, KVCacheGroupSpec
    from vllm.v1.structured_output import StructuredOutputManager

    if STAND_IN_ARCH not in ModelRegistry.get_supported_archs():
        ModelRegistry.register_model(STAND_IN_ARCH, SchedulerOnlyModel)
    max_len = 1024
    model_config = ModelConfig(model=str(model), max_model_len=max_len, dtype="float32",
                               skip_tokenizer_init=True)
    cache = CacheConfig(block_size=BLOCK_SIZE, enable_prefix_caching=prefix_caching)
    cache.num_gpu_blocks = num_blocks
    config = VllmConfig(
        model_config=model_config, cache_config=cache, device_config=DeviceConfig(device="cpu"),
        scheduler_config=SchedulerConfig(
            max_num_seqs=max_num_seqs, max_num_batched_tokens=max_num_batched_tokens,
            max_model_len=max_len, is_encoder_decoder=False, policy=policy))
    spec = FullAttentionSpec(block_size=BLOCK_SIZE, num_kv_heads=1, head_size=64, dtype=torch.float32)
    kv = KVCacheConfig(num_blocks=num_blocks, kv_cache_tensors=[],
                       kv_cache_groups=[KVCacheGroupSpec(["layer"], spec)])
    cls = cls or config.scheduler_config.get_scheduler_cls()
    return cls(vllm_config=config, kv_cache_config=kv, log_stats=True,
               structured_output_manager=StructuredOutputManager(config), block_size=BLOCK_SIZE)


def make_request(request_id: str, prompt_len: int, max_tokens: int, priority: int = 0) -> Any:
    from vllm import SamplingParams
    from vllm.v1.request import Request

    params = SamplingParams(max_tokens=max_tokens, ignore_eos=True, temperature=0.0)
    prompt = [(7 * len(request_id) + i) % 1000 + 3 for i in range(prompt_len)]
    kwargs: dict[str, Any] = {"priority": priority, "arrival_time": time.time()}
    return Request(request_id, prompt, params, None, **kwargs)


@dataclass
class RunnerView:
    """What a model runner holds per request, updated from each ``SchedulerOutput`` the way
    model runner V2 does (a preempted or finished request is dropped; a request comes back as
    new request data, or, before 0.34, as cached data marked resumed). Checks that the
    scheduler never sends a request the runner holds as new, nor one it dropped as cached."""

    held: dict[str, int] = field(default_factory=dict)  # request -> tokens whose KV it computed
    preempted_at: dict[str, int] = field(default_factory=dict)  # that count when preempted
    resumed: list[tuple[str, int, int]] = field(default_factory=list)  # (id, had, resumed with)
    scheduled: dict[str, int] = field(default_factory=lambda: defaultdict(int))  # tokens per request

    def take(self, out: Any) -> None:
        for rid in out.finished_req_ids:
            self.held.pop(rid, None)
        for rid in out.preempted_req_ids or ():
            if rid in self.held:
                self.preempted_at[rid] = self.held.pop(rid)
        for new in out.scheduled_new_reqs:
            assert new.req_id not in self.held, (
                f"{new.req_id} sent as a new request while the runner still holds it: the "
                "runner was never told of its preemption (preempted_req_ids)")
            self._resume(new.req_id, new.num_computed_tokens)
        cached = out.scheduled_cached_reqs
        resumed_ids = set(getattr(cached, "resumed_req_ids", ()) or ())  # before 0.34
        for rid, computed in zip(cached.req_ids, cached.num_computed_tokens):
            if rid in resumed_ids:
                assert rid not in self.held, f"{rid} resumed, but the runner was never told it was preempted"
                self._resume(rid, computed)
            else:
                assert rid in self.held, f"{rid} sent as cached data, but the runner dropped it"
                assert self.held[rid] == computed, (rid, self.held[rid], computed)
        for rid, n in out.num_scheduled_tokens.items():
            self.scheduled[rid] += n
            self.held[rid] = self.held.get(rid, 0) + n

    def _resume(self, rid: str, computed: int) -> None:
        had = self.preempted_at.pop(rid, None)
        if had is not None:
            self.resumed.append((rid, had, computed))
        self.held[rid] = computed


@dataclass
class Run:
    tokens: dict[str, list[int]] = field(default_factory=lambda: defaultdict(list))
    finished: list[str] = field(default_factory=list)  # in finishing order, repeats kept
    runner: RunnerView = field(default_factory=RunnerView)
    iterations: int = 0


def step(scheduler: Any, run: Run, compute_s_per_token: float = 0.0) -> None:
    """One engine iteration: schedule, 'run the model' (a made-up token for each request past
    its prompt; ``compute_s_per_token`` of sleep, so time-based policies see work), update."""
    from vllm.v1.outputs import ModelRunnerOutput

    out = scheduler.schedule()
    run.runner.take(out)
    run.iterations += 1
    req_ids = list(out.num_scheduled_tokens)
    sampled = []
    for rid in req_ids:
        request = scheduler.requests[rid]
        done_prompt = request.num_computed_tokens >= request.num_tokens
        sampled.append([(len(run.tokens[rid]) * 31 + 11) % 1000 + 3] if done_prompt else [])
    if compute_s_per_token:
        time.sleep(compute_s_per_token * out.total_num_scheduled_tokens)
    fields = {f.name for f in dataclasses.fields(ModelRunnerOutput)}
    kwargs: dict[str, Any] = dict(req_ids=req_ids, sampled_token_ids=sampled)
    if "req_id_to_index" in fields:  # vLLM 0.24
        kwargs["req_id_to_index"] = {rid: i for i, rid in enumerate(req_ids)}
    if "logprobs" in fields:
        kwargs["logprobs"] = None
    if "prompt_logprobs_dict" in fields:
        kwargs["prompt_logprobs_dict"] = {}
    if "pooler_output" in fields:
        kwargs["pooler_output"] = [None] * len(req_ids)
    outputs = scheduler.update_from_output(out, ModelRunnerOutput(**kwargs))
    for engine_outputs in outputs.values():
        for o in engine_outputs.outputs:
            run.tokens[o.request_id].extend(o.new_token_ids)
            if o.finish_reason is not None:
                run.finished.append(o.request_id)


def drain(scheduler: Any, run: Run, max_iterations: int = 5000, **kw: Any) -> None:
    while scheduler.has_unfinished_requests():
        step(scheduler, run, **kw)
        assert run.iterations < max_iterations, "the scheduler stopped making progress"
