"""Rank bodies for the fused-executor tests (module level, so spawned processes import them)."""

from __future__ import annotations

from rlweave.adapters.torch_pipeline.executor import FusedPipelineExecutor
from rlweave.adapters.torch_pipeline.placement import Placement, ScheduleRefused
from rlweave.adapters.torch_pipeline.stages import HIDDEN, Stage, TinyModel, make_batches

BATCH, SEQ = 2, 8
ACTOR_SEED, CRITIC_SEED, ACTOR_DATA, CRITIC_DATA = 1, 2, 10, 20


def models(actor_pp: int, critic_pp: int) -> tuple[TinyModel, TinyModel]:
    """One decoder layer per stage."""
    return (TinyModel(actor_pp, value_head=False, seed=ACTOR_SEED),
            TinyModel(critic_pp, value_head=True, seed=CRITIC_SEED))


def data(actor_mb: int, critic_mb_total: int) -> dict:
    return {"actor": make_batches(actor_mb, BATCH, SEQ, ACTOR_DATA),
            "critic": make_batches(critic_mb_total, BATCH, SEQ, CRITIC_DATA)}


def fused_step(rank: int, world: int, critic_pp: int, actor_mb: int, critic_mb: int,
               orders: list) -> dict:
    """Run one fused step; return this rank's gradients by the whole model's parameter names,
    or the refusal message."""
    placement = Placement(world, critic_pp, actor_mb, critic_mb)
    actor_model, critic_model = models(world, critic_pp)
    critic_stage = critic_pp - 1 - rank % critic_pp
    executor = FusedPipelineExecutor(placement, Stage(actor_model, rank, world),
                                     Stage(critic_model, critic_stage, critic_pp), (BATCH, SEQ, HIDDEN))
    try:
        executor.step(orders, data(actor_mb, critic_mb * world // critic_pp))
    except ScheduleRefused as refused:
        return {"refused": str(refused)}
    executor.reduce_critic_grads()
    return {name: {n: p.grad for n, p in model.named_parameters() if p.grad is not None}
            for name, model in (("actor", actor_model), ("critic", critic_model))}
