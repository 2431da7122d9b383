"""verl's synchronous trainer, made to survive its faults (MegaScale's recovery, by RL role).

:func:`resilient` subclasses verl's ``sync`` trainer; the subclass attaches :meth:`Resilience.around`
to the trainer's one stage seam (:mod:`.trainer`) and only adds, around verl's own methods:

- **monitoring**: the job's monitor (:mod:`.resilience_monitor`, threads in this process) and
  the controller's heartbeat, one section per stage;
- **stage 1 checkpoint**: each trainer rank copies its model and optimizer state into host
  memory at the end of the step's update, in the same call (:mod:`.host_snapshot`; the
  :class:`~.checkpoint_store.CheckpointStore` holds both stages);
- **trainer recovery**: a stage that fails because a trainer rank died (or was killed as the
  culprit of a hang) makes the trainer stop the whole worker group, build a new one in the same
  placement groups, restore the newest host snapshot and run the step again
  on the samples it had already generated, kept in TransferQueue: at most the step in flight is
  redone, and no sample is generated again;
- **rollout recovery**: while generation waits for its samples, a replica that died (its engine
  or its server) is replaced by a fresh one of the same rank, the weights of the current version
  pushed to it, and the load balancer told; verl's requests that were on it are resubmitted by
  :class:`~.resuming_client.ResumingLLMServerClient` (with ``wait_s``), so the step completes with every
  sample, none twice;
- **stage 2 checkpoint**: at verl's ``save_freq``, verl's own checkpoint of every rank written
  to host memory (:mod:`.checkpoints`, through the store) and persisted from there in the background in verl's
  layout, atomically, with a manifest of checksums; on resume, the newest checkpoint that
  verifies is loaded (and a rebuild before the next host snapshot restores from it).

What to do is always the plugin's answer to ``rlweave_incident``, asked in one place for the
monitor's incidents and the trainer's failed calls alike (:mod:`.resilience_recovery`); what
was done goes to ``rlweave_recovery_done``. Per-step figures join verl's metrics under ``rlweave/resilience/``.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import copy
import os
import threading
import time
import uuid
import zlib
from collections.abc import Callable, Iterator
from contextlib import contextmanager, nullcontext
from functools import partial
from pathlib import Path
from typing import Any

import ray
from verl.single_controller.ray import RayWorkerGroup, create_colocated_worker_cls
from verl.trainer.ppo.utils import Role
from verl.utils.config import omega_conf_to_dataclass
from verl.workers.engine_workers import ActorRolloutRefWorker, TrainingWorker
from verl.workers.utils.losses import value_loss

from rlweave.adapters import heartbeat
from rlweave.adapters.verl.checkpoint_store import CheckpointStore
from rlweave.adapters.verl.resilience_monitor import CONTROLLER, ResilienceMonitor, start_monitor
from rlweave.adapters.verl.resilience_recovery import (
    MONITOR_GRACE_S,
    IncidentDesk,
    RecoveryExecutor,
    TrainerGroupLost,
    trainer_incident,
)
from rlweave.adapters.verl.resilient_workers import (
    SNAPSHOT_US,
    ResilientActorRolloutRefWorker,
    ResilientTrainingWorker,
)
from rlweave.adapters.verl.resuming_client import RESUBMITTED, ResumingLLMServerClient
from rlweave.adapters.verl.trainer import with_seam
from rlweave.host import get_host
from rlweave.types import (
    Health,
    RecoveryAction,
    RecoveryKind,
    RecoveryRecord,
    Stage,
    StageContext,
    WorkerIncident,
)

METRIC = "rlweave/resilience"
SNAPSHOTTED = {Stage.UPDATE_ACTOR: "actor", Stage.UPDATE_CRITIC: str(Role.Critic)}  # update stage -> its model
POLL_S = 0.25


class Resilience:
    """The resilient trainer's state and recovery, apart from verl's trainer namespace."""

    def __init__(self, trainer: Any) -> None:
        self.trainer = trainer
        self.hook = get_host().hook
        self.settings = self.hook.rlweave_resilience_settings()
        self.job_id = ray.get_runtime_context().get_job_id()
        self.snapshots = Path(self.settings.snapshot_dir) / f"job-{self.job_id}-{uuid.uuid4().hex[:8]}"
        self.replay: Any = None
        self.replay_next = False
        self.pending_replace: dict[int, WorkerIncident] = {}
        self.pending_rebuild: WorkerIncident | None = None
        self.lock = threading.RLock()
        self.last_rebuild_s = 0.0
        self.replaced_pids: set[int] = set()  # trainer processes that a rebuild replaced
        self.last_replace_s: dict[int, float] = {}
        self.update_weights: Callable[..., Any] = lambda *a, **k: None  # verl's, unguarded
        self.step_figures: dict[str, float] = {}
        self.store: CheckpointStore | None = None  # from start()
        self.monitor: ResilienceMonitor | None = None
        self.desk: IncidentDesk | None = None
        self.sender: heartbeat.HeartbeatSender | None = None
        self.submitted: dict[str, str] = {}  # uid -> dataset index, of the prompts of this step
        self.cpu_seen: dict[str, float] = {}  # monitoring's CPU totals at the last step's end

    # ------------------------------------------------------------------ the samples ledger

    def submitted_prompts(self, batch: Any) -> None:
        uids = [str(u) for u in list(batch["uid"])]
        index = batch["index"] if "index" in batch.keys() else uids
        indexes = [str(i) for i in (index.tolist() if hasattr(index, "tolist") else list(index))]
        self.submitted.update(zip(uids, indexes, strict=True))

    def ledger(self, trained: Any) -> dict[str, float]:
        """Whether the step trained exactly the prompts it submitted, each with all its samples:
        groups lost or added (a failed group that verl refilled with another prompt), distinct
        samples and samples trained twice (a key met again), and a digest of the prompts (their
        dataset indexes; a CRC32, exact as a float), equal between two runs that trained the same
        prompts."""
        groups: dict[str, set[str]] = {}
        trained_keys = 0
        for key, tag in zip(trained.keys, trained.tags, strict=True):
            if not tag.get("is_padding", False):
                groups.setdefault(key.split("_", 1)[0], set()).add(key)
                trained_keys += 1
        submitted, self.submitted = self.submitted, {}
        indexes = sorted(submitted.get(uid, uid) for uid in groups)
        distinct = sum(len(keys) for keys in groups.values())
        return {"samples": float(distinct), "duplicate_samples": float(trained_keys - distinct),
                "lost_groups": float(len(set(submitted) - set(groups))),
                "extra_groups": float(len(set(groups) - set(submitted))),
                "prompts_digest": float(zlib.crc32(",".join(indexes).encode()))}

    # ------------------------------------------------------------------ start and stop

    def start(self) -> None:
        self.monitor = start_monitor(self.job_id, self.settings.check_s)
        self.desk = IncidentDesk(self.hook, self.monitor, RecoveryExecutor(self.monitor))
        self.sender = heartbeat.start(self.monitor.address(), CONTROLLER, self.settings.heartbeat_s,
                                      channel=self.monitor.sender_channel())
        self.store = CheckpointStore(self.trainer, self.settings, self.hook, self.snapshots, self.step_figures)

    def close(self) -> None:
        if self.store is not None:
            self.store.close()
        if self.desk is not None:
            self.desk.stop()
        if self.monitor is not None:
            status = self.monitor.status()
            self.monitor.stop()
            print(f"rlweave resilience: {len(status['incidents'])} incident(s); workers that beat: "
                  f"{', '.join(sorted(status['workers']))}")

    # ------------------------------------------------------------------ the controller's sections

    def section(self, name: str) -> Any:
        return self.sender.section(name) if self.sender is not None else nullcontext()

    # ------------------------------------------------------------------ incidents

    def poll(self) -> None:
        """Take the monitor's incidents the desk decided since the last poll, and keep those
        whose second half is the trainer's (replace, rebuild, abort) for the safe point."""
        for incident, action in self.desk.take():
            if action is None or action.kind not in (RecoveryKind.REPLACE, RecoveryKind.REBUILD, RecoveryKind.ABORT):
                if incident.kind is Health.STRAGGLER:
                    self.count("stragglers")
                continue
            self._apply_later(incident, action)

    def _apply_later(self, incident: WorkerIncident, action: RecoveryAction) -> None:
        if incident.role == "trainer" and (incident.pid in self.replaced_pids or incident.since_s < self.last_rebuild_s):
            return  # a process a rebuild replaced (its exit may be logged after the trainer saw it)
        replica = int(incident.worker.split(":")[1].split("/")[0]) if incident.role == "rollout" else -1
        if incident.role == "rollout" and incident.since_s < self.last_replace_s.get(replica, 0.0):
            return
        if action.kind is RecoveryKind.ABORT:
            raise RuntimeError(f"rlweave resilience: {incident.worker} {incident.kind.value} "
                               f"({incident.detail}); giving up: {action.reason}")
        if action.kind is RecoveryKind.REPLACE:
            self.pending_replace[replica] = incident
        elif action.kind is RecoveryKind.REBUILD:
            self.pending_rebuild = self.pending_rebuild or incident

    def safe_point(self, in_generation: bool = False) -> None:
        """Between worker calls: apply what is pending. A trainer rebuild waits until no
        generation is running (it must not push weights into engines mid-request)."""
        self.poll()
        for replica in sorted(self.pending_replace):
            self.replace(replica, self.pending_replace.pop(replica))
        if self.pending_rebuild is not None and not in_generation:
            raise TrainerGroupLost(f"{self.pending_rebuild.worker} {self.pending_rebuild.kind.value}")

    def worker_failure(self, error: BaseException) -> WorkerIncident | None:
        """The incident behind ``error`` if a trainer worker's failure explains it, else None."""
        self.poll()
        if self.pending_rebuild is not None:
            incident, self.pending_rebuild = self.pending_rebuild, None
            return incident
        direct = isinstance(error, (ray.exceptions.RayActorError, TrainerGroupLost))
        if self.pending_replace and not direct:
            return None  # a worker's call into a dead replica: the replacement answers it
        incident = trainer_incident(error, self._rank_of(error), self.trainer.global_steps, time.time())
        if incident is None:
            return None
        monitors = self._monitors_rebuild(MONITOR_GRACE_S)
        if monitors is not None:  # the monitor saw the death itself: its incident, asked once
            return monitors
        action = self.desk.handle(incident)  # the same question, asked once, as the monitor's incidents
        if action is None or action.kind is not RecoveryKind.REBUILD:
            return None
        return incident

    def _monitors_rebuild(self, grace_s: float) -> WorkerIncident | None:
        """The rebuild the monitor's own incident decided, if one comes within ``grace_s``."""
        deadline = time.monotonic() + grace_s
        while self.pending_rebuild is None and time.monotonic() < deadline:
            time.sleep(0.02)
            self.poll()
        incident, self.pending_rebuild = self.pending_rebuild, None
        return incident

    def _rank_of(self, error: BaseException) -> str:
        actor_id = getattr(error, "actor_id", None)
        for rank, worker in enumerate(self.trainer.actor_rollout_wg.workers):
            if actor_id is not None and worker._actor_id.hex() == str(actor_id):
                return str(rank)
        return "?"

    # ------------------------------------------------------------------ trainer recovery

    def rebuild(self, incident: WorkerIncident) -> None:
        """Stop the trainer worker group, build it anew, restore the newest snapshot."""
        action = RecoveryAction(RecoveryKind.REBUILD, incident.detail)
        start, phases = time.time(), Phases()
        t = self.trainer
        print(f"rlweave resilience: rebuilding the trainer worker group ({incident.worker} "
              f"{incident.kind.value}); restoring the snapshot of step {self.store.snapshot_step}")
        self.last_rebuild_s = start
        self.replaced_pids |= self.monitor.pids("trainer:")
        names = [f"trainer:{rank}" for rank in range(t.actor_rollout_wg.world_size)]
        self.monitor.retire(names)
        with phases("stop"):
            old = {w._actor_id: w for wg in self._worker_groups() for w in wg.workers}
            for worker in old.values():
                ray.kill(worker, no_restart=True)
            _wait_dead(list(old.values()))
        build_worker_groups(t, phases)
        self.desk.rebuilt(time.time())
        t.llm_server_manager.worker_group = t.actor_rollout_wg
        for replica in t.llm_server_manager.get_replicas():
            size = replica.world_size
            replica.workers = t.actor_rollout_wg.workers[size * replica.replica_rank: size * (replica.replica_rank + 1)]
        t.checkpoint_manager.actor_wg = t.actor_rollout_wg
        with phases("restore"):
            if self.store.snapshot_step >= 0:
                self.store.restore()
        self.safe_point(in_generation=True)  # replicas found dead meanwhile are replaced first
        with phases("weights"):
            self.update_weights(max(t.global_steps - 1, 0))
        self.count("recoveries")
        self.count("steps_redone")
        self._done(incident, action, start, phases)

    def _worker_groups(self) -> list[RayWorkerGroup]:
        t = self.trainer
        groups = [t.actor_rollout_wg]
        groups += [t.critic_wg] if t.use_critic else []
        groups += [t.ref_policy_wg] if t.use_reference_policy and not t.ref_in_actor else []
        return groups

    # ------------------------------------------------------------------ rollout recovery

    def replace(self, replica_rank: int, incident: WorkerIncident) -> None:
        """A fresh rollout replica in place of ``replica_rank``, weights re-synced."""
        with self.lock:
            start, phases = time.time(), Phases()
            t = self.trainer
            manager = t.llm_server_manager
            old = manager.rollout_replicas[replica_rank]
            balancer = manager.global_load_balancer
            self.last_replace_s[replica_rank] = start
            ray.get(balancer.remove_servers.remote([old.server_address]))
            self.monitor.retire([f"rollout:{replica_rank}", f"rollout:{replica_rank}/engine"])
            with phases("stop"):
                for server in old.servers:
                    ray.kill(server, no_restart=True)
                _wait_dead(old.servers)
            print(f"rlweave resilience: replacing rollout replica {replica_rank} ({incident.worker} "
                  f"{incident.kind.value})")
            with phases("start"):
                new = manager.rollout_replica_class(replica_rank=replica_rank, config=manager.rollout_config,
                                                    model_config=manager.model_config,
                                                    gpus_per_node=manager.rollout_config.n_gpus_per_node)
                asyncio.run(new.init_hybrid(t.actor_rollout_wg))
            manager.rollout_replicas[replica_rank] = new  # the checkpoint engine shares this list
            manager.server_handles[replica_rank] = new.server_handle
            manager.server_addresses[replica_rank] = new.server_address
            t.actor_rollout_wg.rlweave_forget_rollout_server()
            with phases("weights"):
                self.update_weights(max(t.global_steps - 1, 0))
            ray.get(balancer.add_servers.remote({new.server_address: new.server_handle}))
            self.count("recoveries")
            self._done(incident, RecoveryAction(RecoveryKind.REPLACE, incident.detail), start, phases)

    def _done(self, incident: WorkerIncident, action: RecoveryAction, start: float, phases: Phases) -> None:
        status = self.monitor.status()
        record = RecoveryRecord(incident=incident, action=action, start_s=start, end_s=time.time(),
                                fault_s=self.monitor.cause_s(incident),
                                steps_redone=int(action.kind is RecoveryKind.REBUILD),
                                requests_resubmitted=status["counters"].get(RESUBMITTED, 0),
                                detail=str(phases))
        print(f"rlweave resilience: {action.kind.value} done in {record.end_s - record.start_s:.1f} s ({phases})")
        self.hook.rlweave_recovery_done(record=record)
        self.step_figures[f"{action.kind.value}_s"] = record.end_s - record.start_s

    # ------------------------------------------------------------------ figures

    def count(self, key: str) -> None:
        self.step_figures[key] = self.step_figures.get(key, 0.0) + 1

    def metrics(self) -> dict[str, float]:
        """The step's figures, the monitor's counts, and what monitoring cost since the last step
        in CPU seconds: the monitor's threads (``monitor_cpu_s``) and every worker's heartbeat
        sender (``heartbeat_cpu_s``)."""
        figures, self.step_figures = self.step_figures, {}
        figures["incidents"] = float(self.monitor.logged())
        figures["dropped"] = float(self.monitor.dropped())  # datagrams refused: forged, replayed, junk
        figures[RESUBMITTED] = float(self.monitor.counters.get(RESUBMITTED, 0))
        cpu = {**self.monitor.costs(), "snapshots": self.monitor.counters.get(SNAPSHOT_US, 0) / 1e6}
        for figure, key in (("monitor_cpu_s", "monitor"), ("heartbeat_cpu_s", "heartbeats"),
                            ("snapshot_s", "snapshots")):
            figures[figure] = cpu.get(key, 0.0) - self.cpu_seen.get(key, 0.0)
        figures["snapshot_s"] /= self.trainer.actor_rollout_wg.world_size  # the ranks snapshot in parallel
        self.cpu_seen = cpu
        return {f"{METRIC}/{k}": v for k, v in figures.items()}

    # ------------------------------------------------------------------ around the trainer's stages

    def around(self, context: StageContext, batch: Any, run: Callable[[], Any]) -> Any:
        """What the trainer's seam runs around a stage: generation watched for lost replicas,
        the weight sync guarded, any other stage after the pending recoveries, as a section of
        the controller's; an update stage also takes its model's host snapshot."""
        if context.stage is Stage.GENERATE:
            return self.generate(run)
        if context.stage is Stage.WEIGHT_SYNC:
            return self.guarded(run, context.stage.value)
        self.safe_point()
        model = SNAPSHOTTED.get(context.stage)
        with self.section(context.stage.value), \
                (self.store.snapshot_after(model, context.step, batch) if model else nullcontext()):
            return run()

    def guarded(self, call: Callable[..., Any], section: str, *args: Any, **kwargs: Any) -> Any:
        """A worker call outside a step's stage methods (weight sync, sleeping the replicas):
        pending recoveries first, and a trainer failure recovered from the newest snapshot."""
        while True:
            try:
                self.safe_point()
                with self.section(section):
                    return call(*args, **kwargs)
            except Exception as error:
                incident = self.worker_failure(error)
                if incident is None:
                    if self.pending_replace:
                        continue  # a replica died under the call: replaced at the loop's safe point
                    raise
                self.rebuild(incident)

    # ------------------------------------------------------------------ generation

    def generate(self, sample: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        """verl's replay-buffer sample (generation), watched: replicas are replaced while it
        waits. After a trainer recovery, the step's batch sampled before is handed out again."""
        if self.replay_next and self.replay is not None:
            self.replay_next = False
            return copy.deepcopy(self.replay)
        pool = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="rlweave-generate")
        future = pool.submit(sample, *args, **kwargs)
        try:
            with self.section("generate"):
                while True:
                    try:
                        result = future.result(timeout=POLL_S)
                        break
                    except concurrent.futures.TimeoutError:
                        self.safe_point(in_generation=True)
        finally:
            pool.shutdown(wait=False)
        self.replay = copy.deepcopy(result)
        return result


class Phases(dict[str, float]):
    """Where a recovery's time went, phase by phase (``stop 1.2 s, spawn 6.0 s, ...``), so
    that the log, the trace and the benchmark say what to make faster."""

    @contextmanager
    def __call__(self, name: str) -> Iterator[None]:
        start = time.perf_counter()
        try:
            yield
        finally:
            self[name] = self.get(name, 0.0) + time.perf_counter() - start

    def __str__(self) -> str:
        return ", ".join(f"{name} {seconds:.1f} s" for name, seconds in self.items())


def _wait_dead(actors: list[Any], timeout_s: float = 60.0) -> None:
    """Until Ray reports each actor dead (its placement-group bundle and its name are free)."""
    deadline = time.monotonic() + timeout_s
    for actor in actors:
        while time.monotonic() < deadline:
            try:
                ray.get(actor.__ray_ready__.remote(), timeout=5)
            except (ray.exceptions.RayActorError, ray.exceptions.GetTimeoutError):
                break
            time.sleep(0.1)


def build_worker_groups(t: Any, phases: Phases) -> None:
    """verl's ``_setup`` steps 3-6 again: the colocated worker groups in the same resource
    pools, their models initialised (verl 0.9's code, which builds them only once)."""
    wg_kwargs = {"device_name": t.config.trainer.device}
    all_wg = {}
    with phases("spawn"):
        for resource_pool, class_dict in t.resource_pool_to_cls.items():
            if not class_dict:
                continue
            worker_dict_cls = create_colocated_worker_cls(class_dict=class_dict)
            wg = RayWorkerGroup(resource_pool=resource_pool, ray_cls_with_init=worker_dict_cls, **wg_kwargs)
            all_wg.update(wg.spawn(prefix_set=class_dict.keys()))
    if t.use_critic:
        critic_cfg = omega_conf_to_dataclass(t.config.critic)
        t.critic_wg = all_wg[str(Role.Critic)]
        t.critic_wg.reset()
        t.critic_wg.set_loss_fn(partial(value_loss, config=critic_cfg))
    for role in (Role.Actor, Role.ActorRolloutRef, Role.ActorRollout):
        if str(role) in all_wg:
            actor_role = role
            break
    t.actor_rollout_wg = all_wg[str(actor_role)]
    with phases("init"):
        t.actor_rollout_wg.init_model()
    if t.use_reference_policy and not t.ref_in_actor:
        if actor_role == Role.Actor:
            t.ref_policy_wg = all_wg[str(Role.RefPolicy)]
            with phases("init"):
                t.ref_policy_wg.init_model()
        else:
            t.ref_policy_wg = t.actor_rollout_wg
    if t.ref_in_actor:
        t.ref_policy_wg = t.actor_rollout_wg


class _ResilientTrainer:
    """Mixed in front of verl's ``sync`` trainer; see the module docstring."""

    def _init_resource_pool_mgr(self) -> None:
        super()._init_resource_pool_mgr()
        for role, cls in list(self.role_worker_mapping.items()):
            inner = getattr(cls, "__ray_actor_class__", cls)
            if inner is ActorRolloutRefWorker:
                self.role_worker_mapping[role] = ray.remote(ResilientActorRolloutRefWorker)
            elif inner is TrainingWorker:
                self.role_worker_mapping[role] = ray.remote(ResilientTrainingWorker)

    def _setup(self) -> None:
        r = self._resilience = Resilience(self)
        r.start()
        super()._setup()
        r.update_weights = self.checkpoint_manager.update_weights.__wrapped__  # verl's own, past the seam
        self.rlweave_attach(r.around)
        self.checkpoint_manager.sleep_replicas = partial(r.guarded, self.checkpoint_manager.sleep_replicas,
                                                         "sleep_replicas")

    def get_llm_client(self) -> Any:
        return self.llm_server_manager.get_client(client_cls=ResumingLLMServerClient,
                                                  wait_s=self._resilience.settings.recovery_timeout_s)

    def on_step_begin(self) -> None:
        if self._resilience.sender is not None:
            self._resilience.sender.set_step(self.global_steps)
        super().on_step_begin()

    def _step_once(self, metrics: dict, timing_raw: dict, sample_batch_size: int) -> Any:
        r = self._resilience
        while True:
            try:
                batch = super()._step_once(metrics, timing_raw, sample_batch_size)
                if self.global_steps % r.settings.snapshot_every == 0:
                    r.store.snapshot_step = self.global_steps  # every update of the step snapshot its model
                break
            except Exception as error:
                incident = r.worker_failure(error)
                if incident is None:
                    raise
                if r.store.snapshot_step < self.global_steps - 1:
                    raise RuntimeError(f"rlweave resilience: {incident.worker} failed in step {self.global_steps}, "
                                       f"but the newest snapshot is of step {r.store.snapshot_step} (snapshot_every="
                                       f"{r.settings.snapshot_every}): the steps between cannot be redone") from error
                r.rebuild(incident)
                r.replay_next = True
        r.step_figures.update(r.ledger(batch))
        metrics.update(r.metrics())
        return batch

    def _submit_batch_to_rollout(self, batch: Any) -> int:
        self._resilience.submitted_prompts(batch)
        return super()._submit_batch_to_rollout(batch)

    def _save_checkpoint(self) -> None:
        r = self._resilience
        with r.section("stage"):
            r.store.stage(self.global_steps)
        r.store.persist_async(self.global_steps)
        folder = os.path.join(self.config.trainer.default_local_dir, f"global_step_{self.global_steps}")
        self.checkpoint_callback.on_save(trainer=self, global_step=self.global_steps, checkpoint_dir=folder,
                                         async_save=True)

    def _load_checkpoint(self) -> None:
        self.global_steps = 0
        if not self._resilience.store.load_verified():
            super()._load_checkpoint()

    def _load_checkpoint_from_verl(self) -> None:
        super()._load_checkpoint()

    def fit(self, agent_loop_manager: Any) -> None:
        try:
            super().fit(agent_loop_manager)
        finally:
            self._resilience.close()


def resilient(cls: type) -> type:
    """``cls`` (verl's sync trainer) with the stage seam and :class:`_ResilientTrainer` in front
    (idempotent)."""
    if issubclass(cls, _ResilientTrainer):
        return cls
    return type(f"Resilient{cls.__name__}", (_ResilientTrainer, with_seam(cls)), {"__module__": __name__})
