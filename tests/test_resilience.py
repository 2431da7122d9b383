"""The resilience plugin's pure parts: the health monitor, the recovery policy, the checkpoint
choice, the fault grammar and the hooks."""

from __future__ import annotations

import pytest

from rlweave.adapters.verl_needs import verl_requirements
from rlweave.chaos import format_fault, parse_fault, parse_faults
from rlweave.config import ConfigError, Setting, build_config
from rlweave.host import build_plugin_manager
from rlweave.plugins.resilience.checkpoints import newest_good
from rlweave.plugins.resilience.monitor import HealthMonitor, MonitorPolicy
from rlweave.plugins.resilience.policy import RecoveryPolicy
from rlweave.requirements import gathered
from rlweave.types import (
    CheckpointCandidate,
    FaultSpec,
    Health,
    Heartbeat,
    RecoveryKind,
    SectionTime,
    WorkerIncident,
)

POLICY = MonitorPolicy(heartbeat_s=0.5, min_timeout_s=3.0, initial_timeout_s=60.0, calibration_beats=4,
                       section_floor_s=5.0)


def beat(worker: str, t: float, step: int = 1, section: str = "", section_s: float = 0.0, **kw) -> Heartbeat:
    return Heartbeat(worker=worker, time_s=t, pid=100, host="h", step=step, section=section,
                     section_s=section_s, **kw)


def steady(monitor: HealthMonitor, workers: list[str], until: float, every: float = 0.5) -> None:
    t = 0.0
    while t <= until:
        for w in workers:
            monitor.observe(beat(w, t))
        t += every


def test_a_steady_run_raises_nothing():
    monitor = HealthMonitor(POLICY)
    steady(monitor, ["trainer:0", "trainer:1", "rollout:0"], until=30)
    assert monitor.check(30.1) == []


def test_heartbeat_timeout_is_calibrated_from_the_longest_gap_once_training_runs():
    monitor = HealthMonitor(POLICY)
    monitor.observe(beat("trainer:0", 0.0, step=0))
    monitor.observe(beat("trainer:0", 40.0, step=0))  # a start-up stall: not a sample
    assert monitor.heartbeat_timeout("trainer") == 60.0  # not calibrated yet
    for t in (40.5, 41.0, 41.5, 42.3, 42.8):
        monitor.observe(beat("trainer:0", t, step=1))
    assert monitor.heartbeat_timeout("trainer") == pytest.approx(max(3.0, 5 * 0.8))


def test_a_stopped_rank_is_the_hung_culprit_and_its_peer_waits_on_it():
    monitor = HealthMonitor(POLICY)
    steady(monitor, ["trainer:0", "trainer:1"], until=10)
    monitor.observe(beat("trainer:0", 10.0, finished=(SectionTime("update_actor", 0, 0.0, 0.5),)))
    # both enter update_actor; rank 1 stops at 10.5, rank 0 keeps beating, stuck in the section
    for t in (10.5,):
        for w in ("trainer:0", "trainer:1"):
            monitor.observe(beat(w, t, section="update_actor", collective="all_gather#7"))
    t = 11.0
    while t < 30:
        monitor.observe(beat("trainer:0", t, section="update_actor", section_s=t - 10.5,
                             collective="all_gather#8"))
        t += 0.5
    assert monitor.check(12.0) == []  # not silent long enough yet
    found = monitor.check(14.0)
    assert [(i.worker, i.kind, i.culprit) for i in found] == [("trainer:1", Health.HUNG, True)]
    assert found[0].section == "update_actor" and found[0].collective == "all_gather#7"
    assert found[0].since_s == 10.5
    # rank 0's section runs past its floor: it waits on rank 1
    waiting = monitor.check(29.0)
    assert [(i.worker, i.culprit) for i in waiting] == [("trainer:0", False)]
    assert "waits on trainer:1" in waiting[0].detail
    assert monitor.check(29.5) == []  # each incident once


def test_a_stuck_group_without_a_silent_rank_blames_the_one_behind():
    monitor = HealthMonitor(POLICY)
    monitor.observe(beat("trainer:0", 0.0, finished=(SectionTime("update_actor", 0, 0.0, 0.5),)))
    t = 0.0
    while t < 30:
        monitor.observe(beat("trainer:0", t, section="update_actor", section_s=t, collective="all_reduce#5"))
        monitor.observe(beat("trainer:1", t, section="update_actor", section_s=t, collective="all_reduce#4"))
        t += 0.5
    found = {i.worker: i.culprit for i in monitor.check(30.0)}
    assert found == {"trainer:1": True, "trainer:0": False}


def test_an_exit_is_dead_at_once_and_a_replacement_starts_afresh():
    monitor = HealthMonitor(POLICY)
    steady(monitor, ["rollout:0/engine"], until=5)
    monitor.observe(Heartbeat("rollout:0/engine", 5.1, alive=False, detail="exit code -9"))
    [dead] = monitor.check(5.2)
    assert (dead.kind, dead.since_s, dead.detail) == (Health.DEAD, 5.1, "exit code -9")
    monitor.observe(beat("rollout:0/engine", 20.0))  # the replaced engine
    assert monitor.check(20.1) == []


def test_section_timeout_is_a_safety_factor_over_the_longest_seen():
    monitor = HealthMonitor(POLICY)
    assert monitor.section_timeout("trainer", "update_actor") == 900.0
    monitor.observe(beat("trainer:0", 1.0, finished=(SectionTime("update_actor", 1, 0.0, 2.0),)))
    assert monitor.section_timeout("trainer", "update_actor") == 10.0
    monitor.observe(beat("trainer:0", 1.5, finished=(SectionTime("update_actor", 2, 0.0, 0.1),)))
    assert monitor.section_timeout("trainer", "update_actor") == 10.0  # the longest stays


def slow_run(monitor: HealthMonitor, factor: float, steps: int = 4) -> None:
    for step in range(1, steps + 1):
        for rank, d in enumerate((0.2, 0.21, 0.2 * factor)):
            monitor.observe(beat(f"trainer:{rank}", step, step=step,
                                 finished=(SectionTime("update_actor", step, step, d),)))


def test_a_rank_three_times_slower_is_a_straggler_with_its_score():
    monitor = HealthMonitor(POLICY)
    slow_run(monitor, 3.0)
    [slow] = monitor.check(4.5)
    assert (slow.worker, slow.kind, slow.section) == ("trainer:2", Health.STRAGGLER, "update_actor")
    assert slow.score == pytest.approx(0.21 / 0.6, rel=1e-6)
    assert monitor.check(4.6) == []


def test_equal_ranks_and_tiny_sections_make_no_straggler():
    monitor = HealthMonitor(POLICY)
    slow_run(monitor, 1.1)
    assert monitor.check(5.0) == []
    tiny = HealthMonitor(POLICY)
    for step in range(1, 5):
        for rank, d in enumerate((0.002, 0.006)):  # 3x, but within timer noise
            tiny.observe(beat(f"trainer:{rank}", step, step=step,
                              finished=(SectionTime("compute_log_prob", step, step, d),)))
    assert tiny.check(5.0) == []


def incident(worker: str, kind: Health, culprit: bool = True, score: float = 1.0) -> WorkerIncident:
    return WorkerIncident(worker=worker, kind=kind, step=3, detected_s=1.0, since_s=0.5, culprit=culprit,
                          score=score)


@pytest.mark.parametrize(("worker", "kind", "culprit", "expected"), [
    ("trainer:1", Health.HUNG, True, RecoveryKind.KILL),
    ("trainer:0", Health.HUNG, False, RecoveryKind.REPORT),
    ("trainer:1", Health.DEAD, True, RecoveryKind.REBUILD),
    ("rollout:0/engine", Health.HUNG, True, RecoveryKind.KILL),
    ("controller:0", Health.HUNG, True, RecoveryKind.REPORT),  # the job itself, and the monitor's process
    ("rollout:0/engine", Health.DEAD, True, RecoveryKind.REPLACE),
    ("rollout:1", Health.DEAD, True, RecoveryKind.REPLACE),
    ("agent_loop:0", Health.DEAD, True, RecoveryKind.ABORT),
    ("trainer:1", Health.STRAGGLER, True, RecoveryKind.REPORT),
])
def test_recovery_by_role(worker, kind, culprit, expected):
    assert RecoveryPolicy().decide(incident(worker, kind, culprit)).kind is expected


def test_eviction_is_opt_in_and_recoveries_are_bounded():
    assert RecoveryPolicy(evict=True).decide(incident("rollout:1", Health.STRAGGLER, score=0.4)).kind \
        is RecoveryKind.REPLACE
    policy = RecoveryPolicy(max_recoveries=1)
    assert policy.decide(incident("trainer:1", Health.DEAD)).kind is RecoveryKind.REBUILD
    aborted = policy.decide(incident("rollout:0", Health.DEAD))
    assert aborted.kind is RecoveryKind.ABORT and "max_recoveries" in aborted.reason


def test_resume_takes_the_newest_checkpoint_that_verifies():
    candidates = [CheckpointCandidate(4, "/c/global_step_4", ("actor/model_world_size_1_rank_0.pt: checksum",)),
                  CheckpointCandidate(2, "/c/global_step_2"), CheckpointCandidate(1, "/c/global_step_1")]
    assert newest_good(candidates).step == 2
    assert newest_good(candidates[:1]) is None


@pytest.mark.parametrize("text", ["kill:trainer:1@3.update_actor+0.5", "stop:trainer:0@4.update_actor",
                                  "kill:rollout:0.engine@2.generate+1", "slow:trainer:1@2x3",
                                  "corrupt:checkpoint@4"])
def test_fault_grammar_round_trips(text):
    assert format_fault(parse_fault(text)) == text


def test_faults_parse_into_specs_and_bad_ones_say_the_format():
    assert parse_faults("kill:rollout:0.engine@2.generate+1; slow:trainer:1@2x3") == (
        FaultSpec("kill", "rollout:0/engine", 2, "generate", 1.0), FaultSpec("slow", "trainer:1", 2, factor=3.0))
    for bad, says in (("kill:trainer@3", "names no rank"), ("slow:trainer:1@2", "needs a factor"),
                      ("explode:trainer:1@2", "ACTION one of"), ("corrupt:trainer:1@2", "corrupt takes")):
        with pytest.raises(ValueError, match=says):
            parse_fault(bad)


@pytest.mark.parametrize("option", ["chaos", "faults"])
def test_a_jobs_config_cannot_turn_fault_injection_on(option):
    """Faults are a test's or a benchmark's plugin (the chaos tool), not an option of production
    resilience: the old options are refused by name."""
    with pytest.raises(ConfigError, match=f"resilience.{option}"):
        build_config([Setting("resilience.enable", True, "test"), Setting(f"resilience.{option}", "x", "test")])


def test_hooks_through_the_host():
    config = build_config([Setting("resilience.enable", True, "test")])
    hook = build_plugin_manager(config).hook
    settings = hook.rlweave_resilience_settings()
    assert settings.heartbeat_s == 0.5
    keys = {r.key for r in verl_requirements(gathered(hook.rlweave_needs()))}
    assert keys == {"trainer.use_v1", "trainer.v1.trainer_mode", "actor_rollout_ref.actor.strategy"}
    hook.rlweave_heartbeat(beat=beat("trainer:0", 1.0))
    hook.rlweave_heartbeat(beat=Heartbeat("trainer:0", 1.5, alive=False))
    [[dead]] = hook.rlweave_health_check(now_s=1.6)
    assert hook.rlweave_incident(incident=dead).kind is RecoveryKind.REBUILD
    assert hook.rlweave_resume_checkpoint(candidates=[CheckpointCandidate(1, "/x")]).step == 1


def test_verl_settings_that_resilience_cannot_run_with_are_refused_with_the_fix():
    from rlweave.plugins.resilience.plugin import NEEDS
    from rlweave.requirements import problems

    requirements = verl_requirements(NEEDS)
    assert problems(requirements, {}, "cmd") == []  # verl's defaults: v1, sync, FSDP
    [found] = problems(requirements, {"trainer.v1.trainer_mode": "colocate_async"}, "cmd")
    assert "set trainer.v1.trainer_mode=sync" in found



def test_resilience_and_stream_generation_together_name_both_plugins_needs_in_one_message():
    """Both enabled through the real config and host: the one message names each plugin's own
    requirement of verl's trainer mode (as the plugins declare them, not copies)."""
    from rlweave.requirements import problems

    config = build_config([Setting("resilience.enable", True, "test"),
                           Setting("stream_generation.enable", True, "test")])
    requirements = verl_requirements(gathered(build_plugin_manager(config).hook.rlweave_needs()))
    [conflict] = [p for p in problems(requirements, {}, "cmd") if "trainer.v1.trainer_mode" in p]
    assert "cannot run together" in conflict
    assert "rlweave.resilience needs trainer.v1.trainer_mode in {sync}" in conflict
    assert "rlweave.stream_generation needs trainer.v1.trainer_mode in {rlweave_stream}" in conflict
