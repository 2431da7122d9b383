"""Resilience's checkpoints, both stages (MegaScale's two-stage checkpointing, in verl).

- **Stage 1, host snapshots**: each trainer rank copies its model and optimizer state into host
  memory at the end of an update whose batch asks for it (:meth:`CheckpointStore.snapshot_after`;
  the ranks do it in :mod:`.resilient_workers`), and a rebuilt group is restored from the newest.
- **Stage 2, verl's checkpoint**: at verl's ``save_freq``, verl's own checkpoint of every rank is
  written to host memory (:meth:`~CheckpointStore.stage`) and persisted from there in the
  background in verl's layout, atomically, with a manifest of checksums; on resume, the newest
  checkpoint that verifies is loaded (the ``rlweave_resume_checkpoint`` hook chooses).
"""

from __future__ import annotations

import concurrent.futures
import os
import shutil
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import ray
from omegaconf import open_dict
from verl.trainer.ppo.utils import Role

from rlweave.adapters.verl import checkpoints as ckpt
from rlweave.adapters.verl.resilient_workers import SNAPSHOT_REQUEST
from rlweave.types import CheckpointCandidate, ResilienceSettings


class CheckpointStore:
    """A resilient trainer's snapshots and checkpoints under ``snapshots`` (a folder of its own);
    what each stage took goes to ``figures`` (the step's resilience figures)."""

    def __init__(self, trainer: Any, settings: ResilienceSettings, hook: Any, snapshots: Path,
                 figures: dict[str, float]) -> None:
        self.trainer, self.settings, self.hook = trainer, settings, hook
        self.snapshots, self.figures = snapshots, figures
        self.snapshot_step = -1  # the newest step every trainer model can be restored to
        self.host_steps: dict[str, list[int]] = {}  # model -> the steps its host snapshots hold
        self.staged_step = -1  # the step whose verl checkpoint is staged in host memory
        self.dataloader_states: dict[int, bytes] = {}
        self.pinned: set[int] = set()
        self.hosts: dict[str, Any] = {}
        self.node_ranks: dict[str, list[int]] = {}
        self.persists: list[concurrent.futures.Future] = []
        self.persist_pool = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="rlweave-persist")
        snapshots.mkdir(parents=True, exist_ok=True)

    def close(self) -> None:
        """Wait for the checkpoints being persisted; drop the host copies."""
        for future in self.persists:
            future.result()
        self.persist_pool.shutdown(wait=True)
        shutil.rmtree(self.snapshots, ignore_errors=True)

    # ------------------------------------------------------------------ snapshots (stage 1)

    def snapshot_folder(self, step: int) -> Path:
        return ckpt.step_folder(self.snapshots, step)

    def host_folder(self, model: str) -> Path:
        return self.snapshots / "host" / model

    @contextmanager
    def snapshot_after(self, model: str, step: int, batch: Any) -> Iterator[None]:
        """Around the update of ``model`` that ``batch`` goes to: ask its ranks to snapshot the
        model into host memory at the end of that call (they pop the request before verl reads
        the batch). When the call returns, every rank's snapshot is committed; the two newest
        are kept, so a rank that dies in the next one leaves this one whole."""
        requested = step % self.settings.snapshot_every == 0
        if requested:
            batch.extra_info[SNAPSHOT_REQUEST] = {"folder": str(self.host_folder(model)), "step": step}
        try:
            yield
        finally:
            batch.extra_info.pop(SNAPSHOT_REQUEST, None)
        if requested:
            self.host_steps[model] = [*self.host_steps.get(model, [])[-1:], step]

    def stage(self, step: int) -> None:
        """verl's own checkpoint of every trainer model and the dataloader, written to host memory
        for stage 2 (verl's format is what the persisted checkpoint must be)."""
        t = self.trainer
        start = time.perf_counter()
        folder = self.snapshot_folder(step)
        t.actor_rollout_wg.save_checkpoint(str(folder / "actor"), None, step, max_ckpt_to_keep=None)
        if t.use_critic:
            t.critic_wg.save_checkpoint(str(folder / str(Role.Critic)), None, step, max_ckpt_to_keep=None)
        self.dataloader_states[step] = ckpt.serialized_dataloader(t.train_dataloader.state_dict())
        self.staged_step = step
        self.figures["stage_s"] = time.perf_counter() - start
        keep = {step} | self.pinned
        for old in ckpt.persisted_steps(self.snapshots):
            if old not in keep:
                shutil.rmtree(self.snapshot_folder(old), ignore_errors=True)
                self.dataloader_states.pop(old, None)

    def restore(self) -> None:
        """Every trainer model to its state at ``snapshot_step``: from its newest host snapshot
        not past that step (a model that was not updated since, such as the actor during
        ``critic_warmup``, is as it was then), unless verl's staged checkpoint is newer."""
        t = self.trainer
        groups = {"actor": t.actor_rollout_wg, **({str(Role.Critic): t.critic_wg} if t.use_critic else {})}
        for model, wg in groups.items():
            held = [s for s in self.host_steps.get(model, []) if self.staged_step <= s <= self.snapshot_step]
            if held:
                wg.rlweave_restore_host_snapshot(str(self.host_folder(model)), max(held))
                print(f"rlweave resilience: {model} restored from its host snapshot of step {max(held)}")
            elif self.staged_step >= 0:
                wg.load_checkpoint(str(self.snapshot_folder(self.staged_step) / model), None,
                                   del_local_after_load=False)
                print(f"rlweave resilience: {model} restored from verl's checkpoint of step {self.staged_step}")
            # else: never updated up to that step; the rebuilt ranks' initial weights are its state

    # ------------------------------------------------------------------ stage 2

    def _ensure_hosts(self) -> None:
        if self.hosts:
            return
        workers = self.trainer.actor_rollout_wg.workers
        where = ray.get([w.__ray_call__.remote(lambda self: (ray.get_runtime_context().get_node_id(),
                                                             int(os.environ.get("RANK", "0"))))
                         for w in workers])
        self.node_ranks = {}
        for node, rank in where:
            self.node_ranks.setdefault(node, []).append(rank)
        self.hosts = ckpt.start_hosts(self.node_ranks, ray.get_runtime_context().get_node_id())

    def _ranks(self, node: str) -> list[int] | None:
        return None if len(self.node_ranks) == 1 else self.node_ranks[node]

    def persist_async(self, step: int) -> None:
        """Write the snapshot of ``step`` to verl's checkpoint folder in the background."""
        self._ensure_hosts()
        t = self.trainer
        root = Path(t.config.trainer.default_local_dir).absolute()
        root.mkdir(parents=True, exist_ok=True)
        source, partial_dir = self.snapshot_folder(step), root / f"global_step_{step}{ckpt.PARTIAL}"
        shutil.rmtree(partial_dir, ignore_errors=True)
        self.pinned.add(step)
        keep = t.config.trainer.get("max_actor_ckpt_to_keep", None)
        world = t.actor_rollout_wg.world_size
        data = self.dataloader_states[step]

        def write() -> None:
            try:
                start = time.perf_counter()
                parts = ckpt.on_each_host(self.hosts, "persist",
                                          lambda node: (str(source), str(partial_dir), self._ranks(node)))
                files = {k: v for part in parts for k, v in part.items()}
                ckpt.finish_persist(root, step, files, data, world, keep)
                self.figures["persist_s"] = time.perf_counter() - start
            finally:
                self.pinned.discard(step)

        self.persists.append(self.persist_pool.submit(write))

    def load_verified(self) -> bool:
        """verl's resume, from the newest persisted checkpoint that verifies, staged into host
        memory; False when verl would start from scratch."""
        t = self.trainer
        mode = t.config.trainer.resume_mode
        root = Path(t.config.trainer.default_local_dir).absolute()
        if mode == "auto":
            folders = [ckpt.step_folder(root, s) for s in ckpt.newest_first(root)]
        elif mode == "resume_path":
            folders = [Path(t.config.trainer.resume_from_path).absolute()]
        else:
            return False
        if not folders:
            return False
        manifests = {str(f): ckpt.read_manifest(f) for f in folders}
        candidates = [CheckpointCandidate(int(f.name.split("global_step_")[-1]), str(f),
                                          tuple(ckpt.quick_problems(f, manifests[str(f)]))) for f in folders]
        self._ensure_hosts()
        while True:
            chosen = self.hook.rlweave_resume_checkpoint(candidates=candidates)
            if chosen is None:
                raise RuntimeError("rlweave resilience: no persisted checkpoint verifies: " + "; ".join(
                    f"{c.path}: {', '.join(c.problems)}" for c in candidates))
            staged = self.snapshot_folder(chosen.step)
            shutil.rmtree(staged, ignore_errors=True)
            files = (manifests[chosen.path] or {}).get("files")
            problems = [p for part in ckpt.on_each_host(self.hosts, "stage", lambda node: (
                chosen.path, str(staged), files, self._ranks(node))) for p in part]
            if not problems:
                break
            candidates = [CheckpointCandidate(c.step, c.path, tuple(problems)) if c.path == chosen.path else c
                          for c in candidates]
        for skipped in (c for c in candidates if c.problems and c.step > chosen.step):
            print(f"rlweave resilience: skipped checkpoint {skipped.path}: {'; '.join(skipped.problems)}; "
                  f"resuming from step {chosen.step} ({chosen.path}) instead")
        with open_dict(t.config):
            original = (t.config.trainer.resume_mode, t.config.trainer.get("resume_from_path"))
            t.config.trainer.resume_mode, t.config.trainer.resume_from_path = "resume_path", str(staged)
        try:
            t._load_checkpoint_from_verl()
        finally:
            with open_dict(t.config):
                t.config.trainer.resume_mode, t.config.trainer.resume_from_path = original
        self.snapshot_step = self.staged_step = chosen.step
        self.dataloader_states[chosen.step] = (staged / "data.pt").read_bytes()
        self.figures["skipped_checkpoints"] = float(sum(1 for c in candidates if c.problems))
        return True
