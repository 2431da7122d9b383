"""StreamRL's stream generation as a verl v1 trainer mode: ``trainer.v1.trainer_mode=rlweave_stream``.

verl's ``sync`` mode waits for the whole batch, polling TransferQueue every 2 s, then runs every
stage on it. Here the trainer takes the step's GRPO groups as they finish, in dynamic batches
(StreamRL's dynamic-batch pipelining: every group ready when the trainer is free, in whole PPO
mini-batches), and runs reward, old log-probs, reference, values and advantages on each while
the rest are still generating. Fewer, larger batches when generation is ahead keep the
per-call cost of verl's workers down; small ones when it is behind keep the trainer busy.

- ``on_policy``: the optimizer steps wait until the step's last group is in, then run over the
  whole batch as verl's sync mode runs them (one per ``ppo_mini_batch_size``). Every old
  log-prob is therefore the generating weights', and the rollout weights never change within a
  step.
- ``async``: the next ``max_staleness`` batches are in flight while a step trains, so the engine
  never waits for the trainer. At the step's end requests in flight are paused (verl's partial
  rollout), weights are pushed, and generation resumes. A group whose generation started more
  than ``max_staleness`` versions ago is dropped and replaced (verl's off-policy ``drop``).

The data plane is verl's own TransferQueue: the agent-loop workers write each trajectory there
and tag its group ``finished``; :class:`StreamReplayBuffer` only watches the tags (every
``poll_s`` instead of verl's fixed 2 s), fires ``rlweave_sample_finished`` for the length
ranker, hands out complete groups exactly once, and counts staleness. Prompts are submitted in
the order of ``rlweave_dispatch_order`` (predicted long tail first).

The engines must keep their weights and KV cache while the trainer runs (they are not put to
sleep): on a machine where training needs the rollout's memory, use separate rollout devices.

Rollout pool (StreamRL's disaggregation), chosen with verl's own settings: by default the
engines are verl's hybrid replicas, colocated with the trainer ranks. With
``actor_rollout_ref.hybrid_engine=False`` they are standalone replicas on their own devices
(``actor_rollout_ref.rollout.nnodes`` x ``n_gpus_per_node``, as in verl's ``separate_async``),
and weights reach them through ``actor_rollout_ref.rollout.checkpoint_engine`` (a backend that
crosses devices, e.g. rlweave's ``gloo`` on CPU), which pauses requests in flight for the push
and resumes them after.
"""

from __future__ import annotations

import time
from collections import Counter, defaultdict, deque
from typing import Any

import numpy as np
from omegaconf import OmegaConf
from transfer_queue import KVBatchMeta
from verl.checkpoint_engine import CheckpointEngineManager
from verl.trainer.ppo.v1.replay_buffer import ReplayBufferAsync
from verl.trainer.ppo.v1.trainer_base import PPOTrainer, register_trainer
from verl.trainer.ppo.v1.utils import MetricsAggregator
from verl.utils.config import omega_conf_to_dataclass
from verl.utils.debug import marked_timer
from verl.workers.rollout.llm_server import FullyAsyncLLMServerClient, LLMServerManager

from rlweave.config import StreamGenerationConfig
from rlweave.host import get_host
from rlweave.types import PromptInfo, SampleRecord

TRAINER_MODE = "rlweave_stream"
METRIC = "rlweave/stream"


class StreamReplayBuffer(ReplayBufferAsync):
    """verl's replay buffer over TransferQueue, watched as a stream.

    It keeps verl's group bookkeeping (a group is sampleable once every session of its prompt
    has finished) and verl's staleness ``drop``; it adds the hook calls, an exactly-once ledger
    and the per-step stream statistics.
    """

    def __init__(self, *args: Any, poll_s: float, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.poll_interval = poll_s
        self._announced: set[str] = set()  # groups whose samples reached rlweave_sample_finished
        self._delivered: set[str] = set()  # trajectory keys handed to the trainer
        self.step_stats: Counter[str] = Counter()
        self.staleness: Counter[int] = Counter()

    def _sync_metadata_from_transfer_queue(self) -> None:
        super()._sync_metadata_from_transfer_queue()
        new = self.finished_keys["train"] - self._announced
        if not new:
            return
        self._announced |= new
        hook = get_host().hook
        for key, tag in self.partitions["train"].items():
            uid = key.split("_")[0]
            if uid in new:
                hook.rlweave_sample_finished(sample=SampleRecord(
                    sample_id=key, group_id=uid, prompt_len=int(tag.get("prompt_len", 0)),
                    response_len=int(tag.get("response_len", 0)),
                    weight_version=self.prompt_global_steps["train"].get(uid, 0)))

    def take(self, global_steps: int, multiple: int, most: int) -> tuple[KVBatchMeta, dict]:
        """StreamRL's dynamic batch: every complete group ready now, oldest first, in a whole
        multiple of ``multiple`` groups (at least one, waiting for it) and at most ``most``."""
        ready, metrics = self.wait_for_sampleable(global_steps, "train", multiple)
        count = min(len(ready) // multiple * multiple, most)
        uids, snapshot, _ = self._select_prompt_uids("train", ready, count)
        batch = self._materialize_batch("train", uids, snapshot)
        self._deliver(batch, global_steps)
        self.step_stats["dynamic_batches"] += 1
        return batch, metrics

    def sample(self, global_steps: int, partition_id: str, batch_size: int) -> tuple[KVBatchMeta, dict]:
        batch, metrics = super().sample(global_steps, partition_id, batch_size)
        if partition_id == "train":
            self._deliver(batch, global_steps)
        return batch, metrics

    def _deliver(self, batch: KVBatchMeta, global_steps: int) -> None:
        repeated = self._delivered.intersection(batch.keys)
        if repeated:
            raise RuntimeError(f"rlweave stream: trajectories handed to the trainer twice: {sorted(repeated)[:4]}")
        self._delivered.update(batch.keys)
        for tag in batch.tags:
            # Weights a sample started generating with; verl tags it under partial rollout, and
            # otherwise the prompt's submission step is the version it was generated with.
            started = tag.get("min_global_steps")
            version = int(started) if started is not None else int(tag.get("global_steps", global_steps))
            self.staleness[max(0, global_steps - 1 - version)] += 1
        groups = {k.split("_")[0] for k in batch.keys}
        self.step_stats["samples"] += len(batch.keys)
        self.step_stats["groups"] += len(groups)
        self._announced -= groups

    def pop_step_metrics(self) -> dict[str, float]:
        """This step's stream statistics as verl metrics; resets them."""
        metrics = {f"{METRIC}/{k}": float(v) for k, v in self.step_stats.items()}
        for lag, count in self.staleness.items():
            metrics[f"{METRIC}/staleness_{lag}"] = float(count)
        metrics[f"{METRIC}/staleness_max"] = float(max(self.staleness, default=0))
        self.step_stats.clear()
        self.staleness.clear()
        return metrics


@register_trainer(TRAINER_MODE)
class RlweaveStreamTrainer(PPOTrainer):
    """verl's PPO trainer, fed by stream generation (see the module docstring)."""

    def __init__(self, config: Any) -> None:
        self.stream: StreamGenerationConfig = get_host().config.stream_generation
        # Read by verl's PPOTrainer._setup: False gives the trainer ranks no rollout replica.
        self._enable_hybrid_replicas = bool(config.actor_rollout_ref.get("hybrid_engine", True))
        if not self._enable_hybrid_replicas:
            _check_standalone_pool(config)
        super().__init__(config)
        self._per_step = self.config.data.train_batch_size
        self._minibatch = self.config.actor_rollout_ref.actor.ppo_mini_batch_size
        self._group = self.config.actor_rollout_ref.rollout.n
        if self._per_step % self._minibatch:
            raise ValueError(f"rlweave stream: data.train_batch_size={self._per_step} must be a multiple of "
                             f"actor_rollout_ref.actor.ppo_mini_batch_size={self._minibatch} (groups per "
                             f"streamed mini-batch)")
        samples = self._minibatch * self._group
        for key in ("actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu",
                    "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu"):
            micro = OmegaConf.select(self.config, key)
            if micro and samples % micro:
                raise ValueError(f"rlweave stream: {key}={micro} must divide the {samples} samples of a streamed "
                                 f"mini-batch (ppo_mini_batch_size x rollout.n)")

    @property
    def _async(self) -> bool:
        return self.stream.mode == "async"

    def _build_replay_buffer(self) -> StreamReplayBuffer:
        sampler = self.config.trainer.v1.sampler
        return StreamReplayBuffer(
            trainer_mode=self.trainer_mode, trainer_config={},
            max_off_policy_threshold=self.stream.max_staleness + 1 if self._async else 1,
            max_off_policy_strategy="drop", sampler_kwargs=sampler.sampler_kwargs,
            refill_fn=self._add_prompts_to_generate, poll_s=self.stream.poll_s)

    def _setup(self) -> None:
        """verl's setup; with the hybrid engine off, then the standalone rollout pool and the
        checkpoint engine that pushes weights to it (verl's base sets up neither)."""
        super()._setup()
        if self._enable_hybrid_replicas:
            return
        self.llm_server_manager = LLMServerManager.create(config=self.config)
        self.checkpoint_manager = CheckpointEngineManager(
            config=omega_conf_to_dataclass(self.config.actor_rollout_ref.rollout.checkpoint_engine),
            actor_wg=self.actor_rollout_wg, replicas=self.llm_server_manager.get_replicas())

    def _get_n_gpus_for_throughput(self) -> int:
        """verl's per-device throughput metrics count the standalone rollout devices too."""
        rollout = self.config.actor_rollout_ref.rollout
        standalone = 0 if self._enable_hybrid_replicas else rollout.nnodes * rollout.n_gpus_per_node
        return super()._get_n_gpus_for_throughput() + standalone

    def get_llm_client(self) -> Any:
        if self._async:  # requests paused for a weight push resume where they stopped
            return self.llm_server_manager.get_client(client_cls=FullyAsyncLLMServerClient)
        return super().get_llm_client()

    def _submit_batch_to_rollout(self, batch: Any) -> int:
        """Submit in the order of ``rlweave_dispatch_order`` (the predicted long tail first)."""
        uids = [str(u) for u in batch["uid"]]
        infos = [PromptInfo(prompt_id=_prompt_identity(batch, i), prompt_len=_prompt_chars(batch, i),
                            group_id=uids[i]) for i in range(len(uids))]
        order = get_host().hook.rlweave_dispatch_order(prompts=infos)
        if order is not None:
            # A batch that spans an epoch boundary holds a prompt twice: its id then comes twice.
            positions: dict[str, deque[int]] = defaultdict(deque)
            for i, info in enumerate(infos):
                positions[info.prompt_id].append(i)
            if Counter(order) != Counter(info.prompt_id for info in infos):
                raise RuntimeError("rlweave_dispatch_order must return the batch's prompt ids, each as often "
                                   "as it occurs in the batch")
            batch = batch[np.array([positions[p].popleft() for p in order])]
        return super()._submit_batch_to_rollout(batch)

    # -- verl's trainer callbacks -------------------------------------------------------------

    def on_init_end(self) -> None:
        self.checkpoint_manager.update_weights(self.global_steps)

    def on_train_begin(self) -> None:
        if self._async:  # steps t+1 .. t+k generate while step t trains
            self._add_prompts_to_generate(self.stream.max_staleness * self._per_step)

    def on_sample_end(self) -> None:
        """The engines keep generating (and keep their memory) while the trainer trains."""

    def on_step_end(self) -> None:
        # A standalone pool's checkpoint engine pauses and resumes requests in flight itself;
        # verl's colocated ("naive") one does not.
        pause = self._async and self._enable_hybrid_replicas
        with marked_timer("update_weights", self.timing_raw, color="red"):
            if pause:
                self.checkpoint_manager.abort_replicas()
            self.checkpoint_manager.update_weights(self.global_steps)
            if pause:
                self.checkpoint_manager.resume_generation_replicas()

    # -- one step -------------------------------------------------------------------------------

    def step(self, metrics: dict, timing_raw: dict) -> KVBatchMeta:
        """Take the step's groups as they finish, in dynamic batches (whole PPO mini-batches,
        as many as are ready), prepare each while the rest generate, then make verl's optimizer
        steps over the whole batch (one per PPO mini-batch, as in verl's sync mode)."""
        start = time.perf_counter()
        self._add_batch_to_generate()
        aggregator = MetricsAggregator()
        keys: list[str] = []
        tags: list[dict] = []
        while len(keys) < self._per_step * self._group:
            part_metrics: dict = {}
            with marked_timer("gen", timing_raw, color="red"):
                part, off_policy = self.replay_buffer.take(self.global_steps, self._minibatch,
                                                           self._per_step - len(keys) // self._group)
            part_metrics.update(off_policy)
            part.extra_info["temperature"] = self.config.actor_rollout_ref.rollout.temperature
            part = self._prepare(part, part_metrics, timing_raw)
            keys += part.keys
            tags += part.tags
            aggregator.add_step_metrics(part_metrics, sample_count=len(part.keys))
        generated = time.perf_counter() - start
        batch = KVBatchMeta(partition_id="train", keys=keys, tags=tags)  # the updates set their extra_info
        update_metrics: dict = {}
        if self.use_critic:
            with marked_timer("update_critic", timing_raw, color="pink"):
                batch = self._update_critic(batch, metrics=update_metrics)
        if self.config.trainer.critic_warmup <= self.global_steps:
            with marked_timer("update_actor", timing_raw, color="red"):
                batch = self._update_actor(batch, metrics=update_metrics)
        aggregator.add_step_metrics(update_metrics, sample_count=len(keys))
        metrics.update(aggregator.get_aggregated_metrics())
        metrics.update(self.replay_buffer.pop_step_metrics())
        metrics[f"{METRIC}/after_last_sample_s"] = time.perf_counter() - start - generated
        return batch

    def _prepare(self, batch: KVBatchMeta, metrics: dict, timing_raw: dict) -> KVBatchMeta:
        """Every stage before the optimizer steps, on one dynamic batch (verl's methods)."""
        if self.reward_loop_manager.reward_loop_worker_handles is None:
            with marked_timer("reward", timing_raw, color="yellow"):
                batch = self._compute_reward_colocate(batch, metrics=metrics)
        batch = self._balance_batch(batch, metrics=metrics)
        with marked_timer("old_log_prob", timing_raw, color="blue"):
            batch = self._compute_old_log_prob(batch, metrics=metrics)
        if self.use_reference_policy:
            with marked_timer("ref", timing_raw, color="olive"):
                batch = self._compute_ref_log_prob(batch, metrics=metrics)
        if self.use_critic:
            with marked_timer("values", timing_raw, color="cyan"):
                batch = self._compute_values(batch, metrics=metrics)
        with marked_timer("adv", timing_raw, color="brown"):
            return self._compute_advantage(batch, metrics=metrics)


def _check_standalone_pool(config: Any) -> None:
    """What a standalone rollout pool needs, checked before verl starts any worker."""
    rollout = config.actor_rollout_ref.rollout
    if rollout.nnodes < 1 or rollout.n_gpus_per_node < 1:
        raise ValueError(f"rlweave stream with actor_rollout_ref.hybrid_engine=False runs rollout on its own devices: "
                         f"set actor_rollout_ref.rollout.nnodes and n_gpus_per_node >= 1 (got {rollout.nnodes} "
                         f"and {rollout.n_gpus_per_node})")
    if rollout.checkpoint_engine.backend == "naive":
        raise ValueError("rlweave stream with actor_rollout_ref.hybrid_engine=False pushes weights to other devices, "
                         "which verl's 'naive' checkpoint engine cannot: set actor_rollout_ref.rollout.checkpoint_engine."
                         "backend (on CPU: backend=gloo and custom_backend_module="
                         "rlweave.adapters.verl.gloo_checkpoint_engine)")


def _prompt_chars(batch: Any, i: int) -> int:
    """Prompt length in characters: the trainer submits chat messages, tokenized later by the
    agent loop, and the ranker only needs a monotone proxy."""
    return sum(len(str(m.get("content", ""))) for m in batch["raw_prompt"][i])


def _prompt_identity(batch: Any, i: int) -> str:
    """A prompt's identity across epochs (verl's ``uid`` is new at every fetch): the dataset
    row's index (verl's dataset sets it from ``extra_info.index``), else the prompt's text."""
    if "index" in batch.keys():
        return f"index={int(batch['index'][i])}"
    return "text=" + "\n".join(str(m.get("content", "")) for m in batch["raw_prompt"][i])
