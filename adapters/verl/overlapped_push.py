"""A weight push to a standalone rollout pool that overlaps the trainer's next step.

verl's ``CheckpointEngineManager.update_weights`` holds the trainer for the whole push: it
aborts the requests in flight (waiting for every request the engine has queued to be admitted),
frees the KV cache, builds the transfer group on both sides, broadcasts, and resumes; only then
does the trainer submit the next prompts, which reach the engines a dispatch latency later.
StreamRL's async mode overlaps the transfer with the next training step instead. Here:

1. :meth:`OverlappedPush.stage_and_pause` (the trainer waits): the actor workers stage the new
   weights in Ray's object store (rlweave's gloo engine, ``stage_next``), and the replicas close
   their submission gate and abort the requests in flight (verl's partial rollout resubmits
   them). From here on a request that reaches a replica is parked until it resumes, so
   whatever the trainer submits now is generated with the new weights.
2. The trainer submits the next prompts: they travel to the replicas while the weights load.
   On-policy the trainer closes the gates (:meth:`OverlappedPush.close_gate`) and submits them
   earlier still, as soon as the step's last sample is in, while it prepares and trains on the
   last mini-batch.
3. :meth:`OverlappedPush.load_and_resume` (in a background thread, touching only the rollout):
   free the KV cache, load the staged weights, restore the cache, resume; the parked requests
   start at once. The trainer is meanwhile on its next step; the next push, a validation, or
   the trainer's next wait for samples first makes sure this one has finished (and raises what
   it raised).

The actor side only stages: every call the rollout side makes afterwards goes to rollout
workers, so none queues behind the trainer's next update on the actor workers.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import ray
from verl.checkpoint_engine import CheckpointEngineManager
from verl.checkpoint_engine.base import _worker_cls
from verl.single_controller.ray import RayClassWithInitArgs, RayWorkerGroup

from rlweave.adapters.verl.cpu.gloo_checkpoint_engine import STAGED_KEY


class OverlappedPush:
    """Pushes through ``manager``'s actor worker group and replicas (see the module docstring).
    Needs rlweave's gloo checkpoint engine, the one that can stage."""

    def __init__(self, manager: CheckpointEngineManager,
                 around: Callable[[Callable[[], None]], Any] = lambda run: run()) -> None:
        self.manager = manager
        self._around = around  # wraps the rollout side's work (the trainer traces it)
        workers = [w for replica in manager.replicas for w in replica.workers]
        self._rollout = RayWorkerGroup(worker_handles=workers, ray_cls_with_init=RayClassWithInitArgs(cls=_worker_cls))
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="rlweave-weight-push")
        self._pending: Future[Any] | None = None
        self._gate_closed = False  # by close_gate, ahead of the next stage_and_pause
        self.background_s = 0.0  # how long the last finished push's rollout side took
        self.resumed_at = 0.0  # perf_counter when the last push resumed generation

    def close_gate(self) -> None:
        """Close the replicas' submission gates now (aborting what they run): from here on a
        request is parked until the next push has loaded its weights. On-policy, the trainer
        closes them when the step's last sample is in, so that the next step's prompts travel to
        the replicas while it still trains (they would start no earlier anyway)."""
        self.wait()
        self.manager.abort_replicas()
        self._gate_closed = True

    def stage_and_pause(self, global_steps: int) -> Any:
        """Stage the trainer's weights and close the replicas' gates (if not closed already);
        returns the staged weights."""
        self.wait()
        actor = self.manager.actor_wg
        # One call after the other: the workers are async actors, which may reorder one caller's calls.
        ray.get(actor.execute_checkpoint_engine(["stage_next"] * actor.world_size))
        results = ray.get(actor.update_weights(global_steps=global_steps, mode=self.manager.backend))
        staged = [r[STAGED_KEY] for r in results if isinstance(r, dict) and STAGED_KEY in r]
        if len(staged) != 1:
            raise RuntimeError(f"rlweave's overlapped weight push needs actor_rollout_ref.rollout.checkpoint_engine."
                               f"backend=gloo (rlweave's engine, which stages weights); {len(staged)} actor ranks "
                               f"staged weights, expected exactly one")
        if not self._gate_closed:
            self.manager.abort_replicas()
        self._gate_closed = False
        return staged[0]

    def load_and_resume(self, global_steps: int, staged: Any, background: bool = True) -> None:
        """Load ``staged`` into every replica and resume it, in the background unless told not to."""
        self._pending = self._executor.submit(self._around, lambda: self._load_and_resume(global_steps, staged))
        if not background:
            self.wait()

    def wait(self) -> None:
        """Block until the pending push has finished; raises what it raised."""
        if self._pending is not None:
            pending, self._pending = self._pending, None
            pending.result()

    def raise_if_failed(self) -> None:
        """Raise the pending push's error, if it has failed (a trainer waiting for samples would
        otherwise wait for replicas that never resume)."""
        if self._pending is not None and self._pending.done() and self._pending.exception() is not None:
            self.wait()

    def _load_and_resume(self, global_steps: int, staged: Any) -> None:
        start = time.perf_counter()
        self.manager.release_kv_cache_replicas()
        rollout = self._rollout
        workers = rollout.world_size
        ray.get(rollout.execute_checkpoint_engine(["receive_staged"] * workers, [staged] * workers))
        ray.get(rollout.update_weights(global_steps=global_steps))
        self.manager.resume_kv_cache_replicas()
        self.manager.resume_generation_replicas()
        self.resumed_at = time.perf_counter()
        self.background_s = self.resumed_at - start
