"""verl's workers with resilience's section timers and host snapshots (the rollout client that
resubmits a dead replica's requests is :mod:`.resuming_client`'s, with ``wait_s``).

- :class:`ResilientActorRolloutRefWorker`: verl's hybrid worker (a trainer rank), each of whose
  entry points (``update_actor``, ``compute_log_prob``, ``update_weights``, checkpoint save and
  load) runs as a heartbeat section, timed by a monotonic clock without synchronising anything;
  a registered plugin's ``worker_extension`` may hold a section open (a test's chaos tool: its
  ``slow`` fault; none in a production job). One registered method more:
  forget the rollout server handle after the replica was replaced.
- :class:`ResilientTrainingWorker`: verl's critic worker, timed the same way.
- Both snapshot their model into host memory (:mod:`.host_snapshot`) at the end of an update
  whose batch asks for it (``extra_info[SNAPSHOT_REQUEST]``, set by the resilient trainer), in
  the same call: no Ray call, barrier or serialisation of its own on the step's path. One
  registered method restores a rebuilt rank from it.
"""

from __future__ import annotations

import asyncio
import functools
import inspect
import time
from collections.abc import Callable
from contextlib import nullcontext
from typing import Any, Protocol

import torch
from verl.single_controller.base.decorator import Dispatch, register
from verl.workers.engine_workers import ActorRolloutRefWorker, TrainingWorker

from rlweave.adapters import heartbeat
from rlweave.adapters.verl.host_snapshot import HostSnapshots
from rlweave.host import get_host

ACTOR_SECTIONS = ("compute_log_prob", "compute_ref_log_prob", "update_actor", "update_weights",
                  "save_checkpoint", "load_checkpoint")
CRITIC_SECTIONS = ("train_mini_batch", "infer_batch", "save_checkpoint", "load_checkpoint")
SNAPSHOT_REQUEST = "rlweave_host_snapshot"  # {"folder", "step"} in an update's extra_info
SNAPSHOT_US = "snapshot_us"  # a counter: microseconds spent in host snapshots, summed over ranks


def collectives_issued() -> str:
    """How many collectives this process has issued on its process groups (torch counts them per
    group): ranks in step agree, and the one behind in a hung group is the one that stopped."""
    import torch.distributed as dist

    if not dist.is_initialized():
        return ""
    groups = list(dist.distributed_c10d._world.pg_map)
    return f"collectives#{sum(g._get_sequence_number_for_group() for g in groups)}"


class SectionExtension(Protocol):
    """A registered plugin's side in this worker's timed sections, made by its
    ``worker_extension(sender)``: a test's chaos tool, whose ``slow`` fault keeps a section open
    longer. A production job registers none, and a section then runs as it is."""

    def hold_s(self, section: str, duration_s: float) -> float:
        """Seconds to keep ``section`` open after it took ``duration_s``."""
        ...


@functools.cache
def _section_extensions() -> tuple[SectionExtension, ...]:
    sender = heartbeat.current()
    plugins = get_host().pm.get_plugins()
    return tuple(p.worker_extension(sender) for p in plugins if callable(getattr(p, "worker_extension", None)))


def _hold_s(section: str, duration_s: float) -> float:
    return max((e.hold_s(section, duration_s) for e in _section_extensions()), default=0.0)


def _sender() -> heartbeat.HeartbeatSender | None:
    sender = heartbeat.current()
    if sender is not None and sender.collective_probe is None:
        sender.collective_probe = collectives_issued
        _section_extensions()  # made with the first section, so they hear every answer after it
    return sender


def timed(method: Callable[..., Any], name: str) -> Callable[..., Any]:
    """``method`` run as heartbeat section ``name`` (held open as a registered extension asks)."""

    if inspect.iscoroutinefunction(method):
        @functools.wraps(method)
        async def run_async(*args: Any, **kwargs: Any) -> Any:
            sender = _sender()
            if sender is None:
                return await method(*args, **kwargs)
            with sender.section(name):
                start = time.monotonic()
                result = await method(*args, **kwargs)
                hold = _hold_s(name, time.monotonic() - start)
                if hold > 0:
                    await asyncio.sleep(hold)
            return result

        return run_async

    @functools.wraps(method)
    def run(*args: Any, **kwargs: Any) -> Any:
        sender = _sender()
        if sender is None:
            return method(*args, **kwargs)
        with sender.section(name):
            start = time.monotonic()
            result = method(*args, **kwargs)
            hold = _hold_s(name, time.monotonic() - start)
            if hold > 0:
                time.sleep(hold)
        return result

    return run


def time_sections(worker: object, names: tuple[str, ...], prefix: str = "") -> None:
    for name in names:
        method = getattr(worker, name, None)
        if method is not None:
            setattr(worker, name, timed(method, prefix + name))


def _pop_request(data: Any) -> dict[str, Any] | None:
    """The trainer's snapshot request riding on an update's batch (verl's ``KVBatchMeta``, or the
    ``TensorDict`` it becomes), taken off so that verl never sees it."""
    extra = getattr(data, "extra_info", None)
    if isinstance(extra, dict):
        return extra.pop(SNAPSHOT_REQUEST, None)
    from verl.utils import tensordict_utils as tu

    return tu.pop(data, key=SNAPSHOT_REQUEST, default=None) if SNAPSHOT_REQUEST in data.keys() else None


def _checked(engine: Any) -> Any:
    if not (isinstance(getattr(engine, "module", None), torch.nn.Module)
            and isinstance(getattr(engine, "optimizer", None), torch.optim.Optimizer)):
        raise RuntimeError(f"rlweave resilience: host snapshots need an engine with one torch module and optimizer "
                           f"(verl's FSDP engine); {type(engine).__name__} has not. Run this job without "
                           f"+rlweave.resilience.enable, or with verl's FSDP strategy")
    return engine


class _Snapshots:
    """A worker's host snapshots, one :class:`HostSnapshots` per folder it was asked to use."""

    def __init__(self, engine_of: Callable[[], Any]) -> None:
        self.engine_of = engine_of
        self.folders: dict[str, HostSnapshots] = {}

    def _at(self, folder: str) -> HostSnapshots:
        if folder not in self.folders:
            rank = torch.distributed.get_rank() if torch.distributed.is_initialized() else 0
            self.folders[folder] = HostSnapshots(folder, rank)
        return self.folders[folder]

    def after(self, update: Callable[..., Any]) -> Callable[..., Any]:
        """``update``, followed by a snapshot of the state it produced when its batch asks."""

        @functools.wraps(update)
        def run(data: Any, *args: Any, **kwargs: Any) -> Any:
            request = _pop_request(data)
            result = update(data, *args, **kwargs)
            if request is not None:
                self.save(request["folder"], request["step"])
            return result

        return run

    def save(self, folder: str, step: int) -> None:
        from verl.utils.checkpoint.checkpoint_manager import BaseCheckpointManager

        engine, sender = _checked(self.engine_of()), _sender()
        start = time.perf_counter()
        with sender.section("snapshot") if sender is not None else nullcontext():
            self._at(folder).save(step, engine.module, engine.optimizer, getattr(engine, "lr_scheduler", None),
                                  BaseCheckpointManager.get_rng_state())
        if sender is not None:
            sender.count(SNAPSHOT_US, int((time.perf_counter() - start) * 1e6), beat=False)

    def restore(self, folder: str, step: int) -> None:
        from verl.utils.checkpoint.checkpoint_manager import BaseCheckpointManager

        engine = _checked(self.engine_of())
        rng = self._at(folder).restore(step, engine.module, engine.optimizer, getattr(engine, "lr_scheduler", None))
        BaseCheckpointManager.load_rng_state(rng)


class ResilientActorRolloutRefWorker(ActorRolloutRefWorker):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        time_sections(self, ACTOR_SECTIONS)
        self._rlweave_snapshots = _Snapshots(lambda: self.actor.engine)
        self.update_actor = self._rlweave_snapshots.after(self.update_actor)

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def rlweave_restore_host_snapshot(self, folder: str, step: int) -> None:
        self._rlweave_snapshots.restore(folder, step)

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def rlweave_forget_rollout_server(self) -> None:
        """The replica was replaced: look its server up again by name at the next use."""
        if self.rollout is not None and hasattr(self.rollout, "server_handle"):
            self.rollout.server_handle = None


class ResilientTrainingWorker(TrainingWorker):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        time_sections(self, CRITIC_SECTIONS, prefix="critic.")
        self._rlweave_snapshots = _Snapshots(lambda: self.engine)
        self.train_mini_batch = self._rlweave_snapshots.after(self.train_mini_batch)

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def rlweave_restore_host_snapshot(self, folder: str, step: int) -> None:
        self._rlweave_snapshots.restore(folder, step)
