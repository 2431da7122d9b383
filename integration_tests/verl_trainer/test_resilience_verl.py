"""Resilience (MegaScale) in verl's real ``main_ppo``: faults injected into a run, each detected,
recovered, and the run's samples and metrics those of a run without faults.

Two verl runs (about five minutes of CI). The first trains four steps with two trainer ranks
(so two rollout replicas) and four faults: the straggler (rank 1 five times slower from step
1), at step 3 a rollout engine killed mid-generation and then trainer rank 1 SIGKILLed
mid-update, at step 4 rank 0 SIGSTOPped mid-update (a hang). It persists checkpoints at steps 2
and 4. The newest is then corrupted, and the second run resumes: it must skip it for step 2's,
train steps 3 and 4 again without a fault, and produce the first run's metrics for them (the
runs are deterministic: greedy samples and verl's deterministic FSDP), so the faulty steps
trained the same prompts with the same samples as a run without faults. The second run is
also the clean run that must raise no incident, and a production one: the chaos tool (a plugin
the first run registers through its environment) absent, so its monitor takes no fault from the
network. Both runs' heartbeats are sealed with their job's key:
a datagram the monitor refused would show in ``dropped``.
"""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from rlweave.adapters.verl import checkpoints as ckpt
from rlweave.benchmarks.resilience_chaos import chaos_env
from rlweave.benchmarks.verl_runs import RunSetup, VerlJob, VerlRun, run_verl
from rlweave.tracing import load_events

DETERMINISTIC = ("actor_rollout_ref.rollout.top_k=1",
                 "actor_rollout_ref.actor.fsdp_config.full_determinism=True",
                 "algorithm.adv_estimator=reinforce_plus_plus")
# The rollout engine dies as soon as its replica has a request in flight (its server says so).
# A rank is scored once it has three timings of a section: slowed from step 1, rank 1 has them
# for update_weights (start, steps 1 and 2) at step 2's end, long before step 3 replaces it. From
# step 2 it had them only when step 3's timings came, racing the kill that ends step 3's evidence.
# Five times slower, not three: with two ranks rank 1 scores under 0.75 while rank 0's own time
# stays under 2.5x rank 1's (three: 1.5x, a margin a loaded machine can eat; seen: 1.17x).
FAULTS = ("slow:trainer:1@1x5;kill:rollout:0.engine@3.generate;kill:trainer:1@3.update_actor;"
          "stop:trainer:0@4.update_actor")
RESILIENCE = ("+rlweave.resilience.enable=true",)
# To float noise: two ranks' gradients are reduced in an order the batch's arrival sets (seen:
# grad_norm 9e-5 relative). pg_loss is left out: of whitened advantages it is a sum near 1e-8,
# noise of the same order, so neither a relative nor an absolute tolerance judges it.
CLOSE = ("critic/score/mean", "critic/advantages/max", "actor/grad_norm", "response_length/mean")
# Exactly: the prompts trained (a CRC32 of their dataset indexes, exact as a float) and the samples.
EXACT = ("rlweave/resilience/prompts_digest", "rlweave/resilience/samples", "rlweave/resilience/duplicate_samples")
SAMPLES_PER_STEP = 8
M = "rlweave/resilience/"


def incidents(run: VerlRun) -> list[dict]:
    return [e["args"] for e in load_events(run.trace_dir) if e["name"] == "incident"]


def spans(run: VerlRun, name: str) -> list[dict]:
    return [e for e in load_events(run.trace_dir) if e["name"] == name and e["ph"] == "X"]


@pytest.fixture(scope="module")
def faulty(tmp_path_factory) -> VerlRun:
    with pytest.MonkeyPatch.context() as env:  # the chaos tool: a plugin this run alone registers
        for key, value in chaos_env(FAULTS).items():
            env.setenv(key, value)
        return run_verl(VerlJob("grpo", steps=4, save_freq=2, ranks=2, extra=DETERMINISTIC + RESILIENCE),
                        tmp_path_factory.mktemp("faulty"), RunSetup(timeout_s=1100))


@pytest.fixture(scope="module")
def resumed(faulty, tmp_path_factory) -> VerlRun:
    """The same job resumed after its newest checkpoint was corrupted (``rlweave chaos corrupt``)."""
    from rlweave.adapters.verl.chaos import corrupt_newest

    corrupt_newest(faulty.checkpoint_dir)
    work = tmp_path_factory.mktemp("resumed")
    job = VerlJob("grpo", steps=4, ranks=2,
                  extra=DETERMINISTIC + RESILIENCE + (f"trainer.default_local_dir={faulty.checkpoint_dir}",))
    return run_verl(job, work, RunSetup(timeout_s=900))


@pytest.mark.timeout(1200)
def test_every_fault_is_detected_and_recovered_and_the_run_finishes(faulty):
    assert faulty.returncode == 0, faulty.log[-6000:]
    assert sorted(faulty.steps) == [1, 2, 3, 4]
    seen = {(i["worker"], i["kind"], i["action"]) for i in incidents(faulty)}
    assert ("rollout:0/engine", "dead", "replace") in seen, seen
    assert ("trainer:1", "dead", "rebuild") in seen, seen
    assert ("trainer:0", "hung", "kill") in seen, seen  # the stopped rank, localised as the culprit
    slow = [i for i in incidents(faulty) if i["kind"] == "straggler"]
    assert slow and {i["worker"] for i in slow} == {"trainer:1"}, slow  # rank 0 is never one
    # Two ranks: the median rank is their mean, so five times slower scores 3/5 (the threshold is 0.75).
    assert all(i["score"] < 0.75 and i["action"] == "report" for i in slow), slow

    recoveries = spans(faulty, "recovery")
    assert sorted(r["args"]["action"] for r in recoveries) == ["rebuild", "rebuild", "replace"]
    detections = {r["args"]["worker"]: r for r in spans(faulty, "detection")}
    crash = detections["trainer:1"]["dur"] / 1e6
    hang = detections["trainer:0"]["dur"] / 1e6
    # Bounds of the monitor's own rules, not of this machine's speed: a crash is seen within a few
    # checks; a hang within the calibrated heartbeat timeout, not the uncalibrated 60 s.
    assert crash < 5.0, crash
    assert hang < 30.0, hang


@pytest.mark.timeout(1200)
def test_no_sample_is_lost_or_trained_twice(faulty):
    for step, metrics in faulty.steps.items():
        assert metrics[M + "samples"] == SAMPLES_PER_STEP, step
        assert metrics[M + "lost_groups"] == 0 and metrics[M + "extra_groups"] == 0, step
        assert metrics[M + "duplicate_samples"] == 0, step
        assert metrics[M + "dropped"] == 0, step  # every sealed beat was accepted
    # at most the step in flight redone, per trainer fault: one rebuild each, from the host
    # snapshot the ranks took at the end of the step before (not from step 2's staged checkpoint)
    assert sum(m.get(M + "steps_redone", 0.0) for m in faulty.steps.values()) == 2
    assert "actor restored from its host snapshot of step 2" in faulty.log
    assert "actor restored from its host snapshot of step 3" in faulty.log
    assert sum(m[M + "snapshot_s"] for m in faulty.steps.values()) > 0  # the ranks' own timing came back
    # the engine died mid-generation: its requests were resubmitted to the replaced replica
    assert faulty.steps[3][M + "requests_resubmitted"] >= 1


@pytest.mark.timeout(1200)
def test_checkpoints_are_persisted_in_verls_layout_for_its_own_resume(faulty):
    from verl.utils.checkpoint.checkpoint_manager import find_latest_ckpt_path

    latest = Path(find_latest_ckpt_path(str(faulty.checkpoint_dir)))
    assert latest.name == "global_step_4"
    manifest = ckpt.read_manifest(latest)
    assert manifest is not None and ckpt.quick_problems(latest, manifest) == []
    assert {"data.pt", "actor/model_world_size_2_rank_1.pt", "actor/optim_world_size_2_rank_0.pt"} <= set(manifest["files"])


@pytest.mark.timeout(1200)
def test_a_corrupt_checkpoint_is_skipped_and_the_faulty_steps_equal_a_clean_run(faulty, resumed):
    assert resumed.returncode == 0, resumed.log[-6000:]
    assert sorted(resumed.steps) == [3, 4]
    assert "skipped checkpoint" in resumed.log and "resuming from step 2" in resumed.log
    # The newest passed the size check and was chosen, failed its checksums while being read, and
    # the choice was made again without it.
    first, choice = [e["args"] for e in load_events(resumed.trace_dir) if e["name"] == "checkpoint_resume"]
    assert first["chosen"].endswith("global_step_4") and choice["chosen"].endswith("global_step_2")
    assert [k for k in choice["skipped"] if k.endswith("global_step_4")], choice
    # No false positive: the clean run raised no incident.
    assert incidents(resumed) == [] and resumed.steps[4][M + "incidents"] == 0
    assert all(m[M + "dropped"] == 0 for m in resumed.steps.values())
    for step in (3, 4):
        for key in EXACT:
            assert faulty.steps[step][key] == resumed.steps[step][key], (step, key)
        for key in CLOSE:
            got, want = faulty.steps[step][key], resumed.steps[step][key]
            assert math.isclose(got, want, rel_tol=1e-3), (step, key, got, want)
