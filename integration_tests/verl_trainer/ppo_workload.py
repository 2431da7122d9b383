"""The PPO workload that the sync run, the fused run and the resumed run share, so that their
steps can be compared: one prompt set, one critic, greedy samples of spread-out forced lengths.

PPO with a critic (GAE) and a reference model (KL loss) carries every inference stage verl has.
One optimizer step over the whole batch makes a step's result independent of the order its
samples arrive in, so a run that streams or reorders them is comparable to float tolerance.
"""

from __future__ import annotations

import json
from pathlib import Path

from rlweave.benchmarks.verl_runs import VerlRun

SAMPLES = 8
COMMON = (f"data.train_batch_size={SAMPLES}", "actor_rollout_ref.rollout.n=1",
          f"actor_rollout_ref.actor.ppo_mini_batch_size={SAMPLES}", f"critic.ppo_mini_batch_size={SAMPLES}",
          # Reproducible on CPU: verl seeds vLLM's sampling only under rollout.full_determinism,
          # which needs Triton's GPU backend, so the rollout samples the top-1 token (greedy
          # whatever the RNG, temperature 1 keeping the trainer's log-probs well-conditioned),
          # and training takes verl's deterministic FSDP switch.
          "actor_rollout_ref.rollout.top_k=1", "actor_rollout_ref.actor.fsdp_config.full_determinism=True",
          # Inference one sample at a time, so that the fused run infers each as it finishes.
          "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=1",
          "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=1",
          "data.max_response_length=72", "actor_rollout_ref.rollout.max_model_len=168")
# Lengths spread out: when the step's shortest sample finishes, each replica still generates the
# rest of its share, whichever samples verl's balancer gave it.
LENGTHS = [12, 20, 28, 36, 44, 52, 60, 68] * 2
# rlweave's single-turn agent loop (verl's, with rlweave's reports around the turn), which the
# rollout plugins and stage fusion's migration go through; verl knows it only while rlweave is on.
RLWEAVE_AGENT_LOOP = ("actor_rollout_ref.rollout.agent.default_agent_loop=rlweave_single_turn",)
# Heddle (agentic_rollout) on verl's request path: rlweave's request load balancer (through
# verl's own factory), rlweave's agent loop, vLLM's priority scheduling of the priorities it sets;
# FastServe (preemptive_serving) ordering vLLM's engine iterations, composed with those priorities.
SCHEDULING_PLUGINS = ("+rlweave.agentic_rollout.enable=true", "actor_rollout_ref.rollout.scheduling_policy=priority",
                      "+rlweave.preemptive_serving.enable=true")
ROLLOUT_PLUGINS = (*SCHEDULING_PLUGINS, *RLWEAVE_AGENT_LOOP)


def ppo_extra(workdir: Path, critic: Path) -> tuple[str, ...]:
    """The overrides of one run of the workload, its rollouts dumped under ``workdir``."""
    return (*COMMON, f"critic.model.path={critic}", dump_rollouts(workdir))


def dump_rollouts(workdir: Path) -> str:
    """verl's own override that writes each step's trained samples to ``workdir/rollouts``."""
    return f"trainer.rollout_data_dir={workdir / 'rollouts'}"


def rollout_dump(run: VerlRun, step: int) -> list[tuple[str, str, float]]:
    """The samples verl trained on in ``step`` (prompt, response, reward), sorted: what verl's
    ``rollout_data_dir`` dump holds, independent of rlweave's own counters."""
    path = run.checkpoint_dir.parent / "rollouts" / f"{step}.jsonl"
    assert path.is_file(), f"verl wrote no rollout dump for step {step} at {path}"
    rows = [json.loads(line) for line in path.open()]
    return sorted((r["input"], r["output"], r["score"]) for r in rows)
