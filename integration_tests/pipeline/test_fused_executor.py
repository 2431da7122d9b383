"""The fused actor–critic schedule runs on real pipeline stages (tiny Llama actor, value-head
critic, gloo CPU processes exchanging activations point to point) and gives both models the
gradients of training each alone; an order that violates a dependency is refused before it runs."""

from __future__ import annotations

import pytest
import torch

from fused_worker import data, fused_step, models
from rlweave.adapters.torch_pipeline.launch import run_world
from rlweave.adapters.torch_pipeline.stages import reference_loss
from rlweave.plugins.stage_fusion.baselines import greedy
from rlweave.plugins.stage_fusion.problem import FusedPipelineProblem
from rlweave.plugins.stage_fusion.schedule import Evaluator

ACTOR_MB, CRITIC_MB = 3, 2  # critic: per replica


def reference_grads(actor_pp: int, critic_pp: int) -> dict:
    """Each model trained alone on the same micro-batches, no pipeline."""
    critic_total = CRITIC_MB * actor_pp // critic_pp
    batches = data(ACTOR_MB, critic_total)
    grads = {}
    for name, model, count in zip(("actor", "critic"), models(actor_pp, critic_pp), (ACTOR_MB, critic_total)):
        for batch in batches[name]:
            reference_loss(model, batch, count).backward()
        grads[name] = {n: p.grad for n, p in model.named_parameters() if p.grad is not None}
    return grads


def fused_orders(actor_pp: int, critic_pp: int) -> list:
    problem = FusedPipelineProblem.uniform(actor_pp, critic_pp, ACTOR_MB, CRITIC_MB, 1, 1)
    evaluator = Evaluator(problem)
    return evaluator.expand(greedy(problem)).to_json()


@pytest.mark.timeout(300)
@pytest.mark.parametrize("actor_pp, critic_pp", [(2, 2), (2, 1), (4, 4), (4, 2)])
def test_fused_gradients_equal_training_each_model_alone(actor_pp, critic_pp):
    orders = fused_orders(actor_pp, critic_pp)
    ranks = run_world(actor_pp, fused_step, critic_pp, ACTOR_MB, CRITIC_MB, orders, timeout_s=240)
    want = reference_grads(actor_pp, critic_pp)
    for model in ("actor", "critic"):
        seen = set()
        for rank in ranks:
            for name, grad in rank[model].items():
                torch.testing.assert_close(grad, want[model][name], rtol=1e-5, atol=1e-7)
                seen.add(name)
        assert seen == set(want[model])  # every parameter was trained on some rank


@pytest.mark.timeout(120)
def test_order_violating_a_dependency_is_refused_before_it_runs():
    orders = fused_orders(2, 2)
    last = orders[1]  # rank 1: actor's last stage; its backward of micro-batch 0 moved first
    entry = ["actor", 0, 1, "B"]
    last.remove(entry)
    last.insert(0, entry)
    ranks = run_world(2, fused_step, 2, ACTOR_MB, CRITIC_MB, orders, timeout_s=60)
    for rank in ranks:
        assert rank["refused"].startswith("refusing the schedule: rank 1 orders ('actor', 0, 1, 'B')")
