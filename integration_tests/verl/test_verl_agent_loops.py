"""rlweave's verl agent loop and request balancer, as verl runs them: verl's ``ToolAgentLoop``
subclass on verl's own config and tokenizer, verl's ``LLMServerClient``, and the balancer as a
Ray actor holding the servers' actor handles. The model servers are stand-ins (serving needs
vLLM, which the verl_trainer group and ``rlweave bench agentic`` run): actors with verl's server
interface that return a fixed number of tokens and record the priority of each request.

Checked: the agent loop and the balancer name a trajectory alike (verl's request id), so the
orchestrator in the balancer actor places each turn of a trajectory the agent loop reported,
knowing its task and group; each request carries the plugin's priority; the agent loop's turn
boundaries give the tool time; the learned state goes beside verl's checkpoint and comes back.
"""

from __future__ import annotations

import json
import time
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

TOKENS_PER_TURN = 6
HERE = Path(__file__).parent  # on the Ray workers' path: they build this module's actors


class StandInServer:
    """verl's server interface (``generate(prompt_ids, sampling_params, request_id, ...,
    priority)``), answering ``max_tokens`` copies of one token; ``reset`` returns the records."""

    def __init__(self, name: str) -> None:
        self.name, self.records = name, []

    async def generate(self, prompt_ids: list[int], sampling_params: dict[str, Any],
                       request_id: str, image_data: Any = None, video_data: Any = None,
                       audio_data: Any = None, mm_processor_kwargs: Any = None,
                       priority: int = 0) -> Any:
        from verl.workers.rollout.replica import TokenOutput

        tag = sampling_params["extra_args"]["rlweave_bench"]
        now = time.time()
        self.records.append({**tag, "server": self.name, "priority": priority, "start": now,
                             "queued_s": 0.0, "end": now})
        return TokenOutput(token_ids=[7] * TOKENS_PER_TURN, stop_reason="completed")

    async def reset(self) -> list[dict[str, Any]]:
        records, self.records = self.records, []
        return records


def _recording_balancer() -> type:
    from rlweave.adapters.verl.router import RlweaveLoadBalancer

    class RecordingBalancer(RlweaveLoadBalancer):
        """rlweave's balancer, noting at every acquire what its orchestrator knows of the
        request id being placed."""

        def __init__(self, servers: dict[str, Any], **kwargs: Any) -> None:
            super().__init__(servers, **kwargs)
            self.seen: list[tuple[str, str | None, str | None, int | None]] = []

        def acquire_server(self, request_id: str, **kwargs: Any) -> tuple[str, Any]:
            from rlweave.plugins.agentic_rollout import plugin

            mine = plugin.orchestrator._active.get(request_id)
            self.seen.append((request_id, mine and mine.info.task, mine and mine.info.group_id,
                              mine and mine.info.context_len))
            return super().acquire_server(request_id, **kwargs)

        def acquired(self) -> list[tuple[str, str | None, str | None, int | None]]:
            return self.seen

    return RecordingBalancer


@pytest.fixture(scope="module")
def rig():
    """Ray, two stand-in servers, verl's agent loops on verl's config; rlweave's plugin on in
    the balancers (through the environment, as verl's driver exports it)."""
    import ray

    from rlweave.benchmarks.agentic_rollout import AgentLoops
    from rlweave.config import Setting, build_config, to_env

    base = {"PYTHONPATH": str(HERE), "VERL_LOGGING_LEVEL": "WARN"}
    env = {**to_env(build_config([Setting("agentic_rollout.enable", True, "test"),
                                  Setting("agentic_rollout.slots", 2, "test")])), **base}
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, logging_level="ERROR",
             runtime_env={"env_vars": base})
    servers = {f"s{k}": ray.remote(num_cpus=0)(StandInServer).remote(f"s{k}") for k in range(2)}
    yield SimpleNamespace(servers=servers, env=env, loops=AgentLoops())
    ray.shutdown()


def _balancer(rig: Any, cls: type) -> Any:
    import ray

    return ray.remote(cls).options(num_cpus=0, runtime_env={"env_vars": rig.env}).remote(
        servers=rig.servers)


def _batch() -> list[Any]:
    from rlweave.benchmarks.agentic_workload import synthetic

    return [replace(t, turn_tokens=(TOKENS_PER_TURN,) * len(t.turn_tokens[:4]),
                    tool_s=(0.2,) * len(t.tool_s[:3])) for t in synthetic(2, prompts=3, group=2)]


@pytest.mark.timeout(300)
def test_one_trajectory_id_and_one_orchestrator_whose_state_goes_beside_the_checkpoint(rig, tmp_path):
    import asyncio

    import ray

    from rlweave.adapters.verl.agent_loop import RlweaveToolAgentLoop
    from rlweave.adapters.verl.router import STATE_FILE, RlweaveLoadBalancer, restore_rollout_state, save_rollout_state

    batch = _batch()
    balancer = _balancer(rig, _recording_balancer())
    run = asyncio.run(rig.loops.rollout(batch, RlweaveToolAgentLoop, balancer, rig.servers))
    seen = ray.get(balancer.acquired.remote())

    # verl's request ids (det-<index>: the benchmark's config is deterministic) are what the
    # balancer places, and its orchestrator knows each from the agent loop's reports.
    turns = sum(len(t.turn_tokens) for t in batch)
    assert len(seen) == turns
    assert {rid for rid, _, _, _ in seen} == {f"det-{i}" for i in range(len(batch))}
    assert all(task == batch[int(rid[4:])].task and group for rid, task, group, _ in seen), seen
    # Each turn's context (what migrating it would re-prefill) came with its report, before
    # verl's acquire, which carries the request id alone: it grows turn by turn.
    for rid in {rid for rid, _, _, _ in seen}:
        contexts = [c for r, _, _, c in seen if r == rid]
        assert contexts[0] > 0 and contexts == sorted(contexts) and len(set(contexts)) == len(contexts)
    # The samples of one prompt share a group; the other prompts do not.
    groups = {rid: group for rid, _, group, _ in seen}
    assert groups["det-0"] == groups["det-1"] != groups["det-2"]
    # Every turn reached the server with the plugin's priority (verl's default sends none).
    for t in batch:
        r = run.trajectories[t.id]
        assert len(r.priorities) == len(t.turn_tokens) and all(p < 0 for p in r.priorities)
        assert len(r.tokens) >= TOKENS_PER_TURN * len(t.turn_tokens)

    # The orchestrator in the balancer learned what only the agent loop sees: turn counts,
    # tokens per turn and the time between turns (the replayed tools, 0.2 s each) ...
    trainer = SimpleNamespace(
        llm_server_manager=SimpleNamespace(global_load_balancer=balancer), global_steps=3,
        config=SimpleNamespace(trainer=SimpleNamespace(default_local_dir=str(tmp_path),
                                                       resume_mode="auto", resume_from_path=None)))
    save_rollout_state(trainer)
    saved = json.loads((tmp_path / "global_step_3" / STATE_FILE).read_text())
    learned = saved["agentic_rollout"]["predictor"]["tasks"]
    assert sorted(v for task in learned.values() for v, _ in task["turns"]) == \
        sorted(float(len(t.turn_tokens)) for t in batch)
    assert {v for task in learned.values() for v, _ in task["tokens"]} == {float(TOKENS_PER_TURN)}
    gaps = [v for task in learned.values() for v, _ in task["tools"]]
    assert len(gaps) == sum(len(t.tool_s) for t in batch)
    assert all(0.2 <= g < 2.0 for g in gaps), gaps
    ray.kill(balancer)

    # ... and gets it back when verl resumes from that checkpoint.
    resumed = _balancer(rig, RlweaveLoadBalancer)
    trainer.llm_server_manager.global_load_balancer = resumed
    restore_rollout_state(trainer)
    assert ray.get(resumed.rlweave_rollout_state.remote()) == saved
    ray.kill(resumed)


@pytest.mark.timeout(300)
def test_where_the_predictions_show_no_skill_verl_decides_every_turn(rig):
    """A restored state whose scored predictions stand below the skill guard: every turn keeps
    the priority verl's agent loop gives it (none: the engine serves it first come, first served)
    and stays on the server verl's sticky placement chose, while the reports still arrive."""
    import asyncio

    import ray

    from rlweave.adapters.verl.agent_loop import RlweaveToolAgentLoop
    from rlweave.adapters.verl.router import RlweaveLoadBalancer

    batch = _batch()
    learning = _balancer(rig, RlweaveLoadBalancer)
    asyncio.run(rig.loops.rollout(batch, RlweaveToolAgentLoop, learning, rig.servers))
    state = ray.get(learning.rlweave_rollout_state.remote())
    ray.kill(learning)
    state["agentic_rollout"]["skill"] = {"s": 0.0, "var": 100.0, "batch_s": 0.0, "batch_var": 0.0}
    guarded = _balancer(rig, RlweaveLoadBalancer)
    ray.get(guarded.rlweave_restore_rollout_state.remote(state))
    run = asyncio.run(rig.loops.rollout(batch, RlweaveToolAgentLoop, guarded, rig.servers))
    after = ray.get(guarded.rlweave_rollout_state.remote())
    ray.kill(guarded)
    for t in batch:
        r = run.trajectories[t.id]
        assert r.priorities == [0] * len(t.turn_tokens) and len(set(r.instances)) == 1
    assert after["agentic_rollout"]["skill"] != state["agentic_rollout"]["skill"]  # still scored


def test_the_checkpoint_patch_wraps_and_reverts_verls_trainer():
    from verl.trainer.ppo.v1.trainer_base import PPOTrainer

    from rlweave.patches import PATCHES

    patch = next(p for p in PATCHES if p.name == "verl_rollout_state")
    before = PPOTrainer._save_checkpoint, PPOTrainer._load_checkpoint
    revert = patch.apply()
    try:
        assert (PPOTrainer._save_checkpoint, PPOTrainer._load_checkpoint) != before
    finally:
        revert()
    assert (PPOTrainer._save_checkpoint, PPOTrainer._load_checkpoint) == before


@pytest.mark.timeout(300)
def test_with_another_balancer_the_agent_loop_reports_to_its_own_process(rig):
    """verl's own balancer (or any other): the hooks fire in the agent-loop process."""
    import asyncio

    from verl.workers.rollout.router import GlobalRequestLoadBalancer

    from rlweave.adapters.verl.agent_loop import RlweaveToolAgentLoop
    from rlweave.config import Setting
    from rlweave.hookspecs import hookimpl
    from rlweave.host import activate, reset

    class Recorder:
        def __init__(self) -> None:
            self.events: list[tuple[str, str, int]] = []

        @hookimpl
        def rlweave_trajectory_event(self, event: Any) -> None:
            self.events.append((event.kind.value, event.trajectory.trajectory_id,
                                event.trajectory.turns_done))

        @hookimpl(tryfirst=True)
        def rlweave_request_priority(self, trajectory: Any) -> int:
            return -1 - trajectory.turns_done

    reset()
    host = activate([Setting("agentic_rollout.enable", True, "test")], export_env=False)
    recorder = Recorder()
    host.pm.register(recorder)
    batch = _batch()[:1]
    try:
        run = asyncio.run(rig.loops.rollout(batch, RlweaveToolAgentLoop,
                                            _balancer(rig, GlobalRequestLoadBalancer), rig.servers))
    finally:
        reset()
    n = len(batch[0].turn_tokens)
    kinds = [k for k, _, _ in recorder.events]
    assert kinds == ["start"] + ["turn_start", "turn_end"] * n + ["finish"]
    assert {tid for _, tid, _ in recorder.events} == {"det-0"}
    assert run.trajectories[batch[0].id].priorities == [-1 - k for k in range(n)]


def test_a_forced_length_per_sibling_is_read_by_verls_session_id():
    from rlweave.adapters.verl.agent_loop import forced_length

    per_sibling = {"extra_info": {"rlweave_output_lens": [5, 40, 7]}}
    assert [forced_length(per_sibling | {"session_id": i}) for i in range(4)] == [5, 40, 7, 5]
    assert forced_length({"extra_info": {"rlweave_output_len": 12}, "session_id": 3}) == 12
    assert forced_length({"extra_info": {"index": 0}}) is None and forced_length({}) is None
    with pytest.raises(ValueError, match="session_id"):  # every sibling would get the first length
        forced_length(per_sibling)
