"""Resilience for verl jobs (MegaScale), the adapter side: heartbeats in every verl worker, and
verl's synchronous trainer made to survive its faults.

In every verl process it loads in, the verl adapter calls :func:`start_heartbeat`: a Ray
actor whose name says which worker it is (verl names them) beats to the job's monitor, found in
Ray's internal KV with the job's channel key once the trainer has started it. The workers:
trainer ranks (verl's ``WorkerDict``, rank from ``RANK``), rollout replicas
(``vllm_server_<replica>_<node>``; their engine process beats through rlweave's vLLM adapter,
on the channel the server exports to it), agent-loop workers and reward workers.

:func:`install` replaces verl's ``sync`` trainer by its resilient subclass
(:mod:`rlweave.adapters.verl.resilient_trainer`): the monitor, host-memory snapshots,
recovery by role, two-stage checkpoints.
"""

from __future__ import annotations

import os
import re

from rlweave.adapters import heartbeat
from rlweave.host import get_host

# verl's actor names -> (role, how the rank is found)
WORKER_NAMES = (
    (re.compile(r"^vllm_server_(\d+)_(\d+)$"), "rollout"),
    (re.compile(r"WorkerDict_\d+:\d+$"), "trainer"),
    (re.compile(r"^agent_loop_worker_(\d+)_"), "agent_loop"),
    (re.compile(r"^reward_loop_worker_(\d+)$"), "reward"),
)


def worker_name(actor_name: str, environ: dict[str, str]) -> str | None:
    """``"trainer:1"`` for verl's actor ``abcdefWorkerDict_0:1`` (``RANK=1``), and so on;
    ``None`` for a process that is none of verl's workers."""
    for pattern, role in WORKER_NAMES:
        m = pattern.search(actor_name)
        if not m:
            continue
        if role == "trainer":
            return f"trainer:{environ.get('RANK', '0')}"
        if role == "rollout":
            replica, node = m.groups()
            return f"rollout:{replica}" + (f"/node{node}" if node != "0" else "")
        return f"{role}:{m.group(1)}"
    return None


def _resolve() -> tuple[str, str, str, heartbeat.Channel] | str | None:
    import ray

    from rlweave.adapters.verl.resilience_monitor import monitor_contact

    if not ray.is_initialized():
        return None
    context = ray.get_runtime_context()
    if context.get_actor_id() is None:
        return heartbeat.NOT_A_WORKER  # the driver, a task
    actor = context.get_actor_name()
    if actor is None:
        return None
    worker = worker_name(actor, dict(os.environ))
    if worker is None:
        return heartbeat.NOT_A_WORKER
    job = context.get_job_id()
    contact = monitor_contact(job)
    if contact is None:
        return None
    return contact["address"], worker, actor, heartbeat.Channel(job, bytes.fromhex(contact["key"]))


def start_heartbeat() -> None:
    """Beat from this verl process once it knows who it is and where the monitor is (idempotent;
    a no-op unless an enabled plugin answers ``rlweave_resilience_settings``)."""
    settings = get_host().hook.rlweave_resilience_settings()
    if settings is None or heartbeat.current() is not None:
        return
    heartbeat.start_when_known(_resolve, settings.heartbeat_s)


def _resilient_vllm_replica() -> type:
    from rlweave.adapters.verl.resilient_rollout import ResilientvLLMReplica

    return ResilientvLLMReplica


def install() -> None:
    """Replace verl's ``sync`` trainer by the resilient one, and verl's vLLM replica by one whose
    server reports its requests in flight (idempotent)."""
    from verl.trainer.ppo.v1 import trainer_base
    from verl.workers.rollout.replica import RolloutReplicaRegistry

    from rlweave.adapters.verl.resilient_trainer import resilient

    trainer_base.TRAINER_REGISTRY["sync"] = resilient(trainer_base.TRAINER_REGISTRY["sync"])
    RolloutReplicaRegistry.register("vllm", _resilient_vllm_replica)
