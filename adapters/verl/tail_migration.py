"""RLHFuse's long-tail migration applied to verl's rollout replicas, through verl's own partial
rollout: the machinery verl uses to pause replicas for a weight push and to hand hybrid
replicas back to training.

A plugin's :class:`~rlweave.types.MigrationPlan` names source and destination instances (verl:
replica server addresses, the request balancer's server ids) and a threshold. When at most
that many of the step's samples are still generating, :class:`TailMigration`:

1. takes every server but the destinations out of verl's request balancer
   (``GlobalRequestLoadBalancer.remove_servers``): a request resubmitted now goes to a
   destination, the least loaded first (its sticky entry to a removed server is dropped);
2. aborts what the sources run (``abort_all_requests``, verl's partial-rollout pause), so each
   of their requests returns with the tokens it has;
3. and :class:`~rlweave.adapters.verl.resuming_client.ResumingLLMServerClient`, the agent
   loops' client, resubmits each at once with its prompt and generated tokens and the rest of
   its token budget: the destination re-prefills them and decodes on (the same tokens under
   greedy decoding).

When the step's last sample is in, the servers rejoin the balancer and the sources resume.
Where the plan says inference waits (``MigrationPlan.inference_waits``), the trainer takes no
dynamic batch but the step's last until the migration has come: the samples that finished
before it are inferred on the devices it frees, not beside the sources' generation.

Which instances share the trainer's devices, and so slow down its inference while they decode,
is read from the Ray actors: their node and accelerator ids, and on verl's CPU platform their
cores (``RLWEAVE_CPU_PIN_DEVICES=1`` gives each logical device one core).
"""

from __future__ import annotations

import asyncio
import logging
import os
from typing import Any

import ray
from verl.utils.ray_utils import auto_await

from rlweave.types import MigrationPlan, RolloutInstance

logger = logging.getLogger(__name__)
logger.setLevel(logging.INFO)  # what it decides belongs in the run's log, as verl's own INFO lines


def _placement(_actor: Any) -> tuple[str, tuple[str, ...], tuple[int, ...]]:
    """Run inside a Ray actor: its node, accelerator ids and allowed cores."""
    context = ray.get_runtime_context()
    gpus = tuple(str(g) for g in context.get_accelerator_ids().get("GPU", []))
    return context.get_node_id(), gpus, tuple(sorted(os.sched_getaffinity(0)))


def _devices(actors: list[Any]) -> set[tuple[str, str]]:
    """The devices of ``actors``: (node, core) pairs on verl's CPU platform, (node, GPU) else."""
    on_cpu = os.environ.get("VERL_PLATFORM", "").lower() == "cpu"
    devices = set()
    for node, gpus, cores in ray.get([a.__ray_call__.remote(_placement) for a in actors]):
        devices |= {(node, str(c)) for c in cores} if on_cpu else {(node, g) for g in gpus}
    return devices


class TailMigration:
    """Applies one step's :class:`MigrationPlan` to ``manager``'s replicas (see the module
    docstring). ``trainer_workers``: the Ray actors of the trainer's inference stage."""

    def __init__(self, manager: Any, trainer_workers: list[Any]) -> None:
        self._balancer = manager.global_load_balancer
        self._replicas = {r.server_address: r for r in manager.get_replicas()}
        trainer = _devices(trainer_workers)
        slots = int(manager.rollout_config.max_num_seqs)
        self.instances = tuple(
            RolloutInstance(address, bool(_devices(replica.workers) & trainer), slots)
            for address, replica in self._replicas.items())
        self._plan: MigrationPlan | None = None
        self._removed: list[str] = []
        self.migrated = 0  # requests the sources were running when they were aborted

    def start_step(self, plan: MigrationPlan | None) -> None:
        unknown = set(plan.sources + plan.destinations) - set(self._replicas) if plan else set()
        if unknown:
            raise ValueError(f"rlweave_migration_plan named instances that are not this trainer's replicas: "
                             f"{sorted(unknown)} (instances: {sorted(self._replicas)})")
        self._plan, self.migrated = plan, 0

    @property
    def migrated_this_step(self) -> bool:
        return bool(self._removed)

    @property
    def pending_threshold(self) -> int | None:
        """The threshold of a plan not applied yet this step (``None``: nothing to apply)."""
        return self._plan.threshold if self._plan and not self._removed else None

    @property
    def holds_inference(self) -> bool:
        """Whether the trainer holds finished samples' inference now: the plan waits for the
        devices its migration frees, and the migration has not come yet."""
        return bool(self._plan and self._plan.inference_waits and not self._removed)

    def migrate(self) -> None:
        """Move the sources' unfinished samples to the destinations now."""
        plan = self._plan
        self._removed = [s for s in self._replicas if s not in plan.destinations]
        ray.get(self._balancer.remove_servers.remote(self._removed))
        results = _abort([self._replicas[s] for s in plan.sources])
        self.migrated = sum(r.get("aborted_count", 0) for per_replica in results for r in per_replica or ())
        logger.info("rlweave stage fusion: migrated %d requests from %s to %s", self.migrated,
                    list(plan.sources), list(plan.destinations))

    def end_step(self) -> None:
        """The step's last sample is in: the removed servers rejoin, the sources resume."""
        if not self._removed:
            return
        _resume([self._replicas[s] for s in self._plan.sources])
        ray.get(self._balancer.add_servers.remote({s: self._replicas[s].server_handle for s in self._removed}))
        self._removed = []


@auto_await
async def _abort(replicas: list[Any]) -> list[Any]:
    return await asyncio.gather(*[_abort_replica(r) for r in replicas])


async def _abort_replica(replica: Any) -> list[dict]:
    """Each of the replica's servers' abort report (``aborted_count``, ``request_ids``)."""
    return list(await asyncio.gather(*[s.abort_all_requests.remote() for s in replica.servers]))


@auto_await
async def _resume(replicas: list[Any]) -> None:
    await asyncio.gather(*[r.resume_generation() for r in replicas])
