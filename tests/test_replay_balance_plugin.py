"""The replay_balance plugin's hooks and config, through the host as an adapter calls them."""

from __future__ import annotations

import numpy as np
import pytest

from rlweave import host as host_module
from rlweave.config import ConfigError, Setting
from rlweave.plugins.replay_balance.planner import PlanError, home_layout, home_of, static_home
from rlweave.types import ExpertPlacement, ExpertTopology, RoutingTrace


@pytest.fixture
def enabled():
    """Activate the host with replay_balance enabled and the given options (conftest resets it)."""

    def activate(**options):
        settings = [Setting("replay_balance.enable", True, "test")]
        settings += [Setting(f"replay_balance.{k}", v, "test") for k, v in options.items()]
        return host_module.activate(settings, export_env=False)

    return activate


def topology_of(host, experts=8, ep=2, expert_bytes=0):
    return host.hook.rlweave_expert_topology(num_logical_experts=experts, ep_size=ep, expert_bytes=expert_bytes)


def test_topology_defaults_to_one_spare_slot_and_whole_nodes(enabled):
    host = enabled()
    assert host.implements("rlweave_expert_step_placement") and host.implements("rlweave_expert_microbatch_placement")
    assert topology_of(host) == ExpertTopology(8, 1, 2, 5)
    assert topology_of(enabled(ranks_per_node=4, slots_per_rank=3), experts=16, ep=8) == ExpertTopology(16, 2, 4, 3)


def test_bad_settings_are_one_clear_error(enabled):
    with pytest.raises(PlanError, match=r"slots_per_rank=3: .*raise slots_per_rank to at least 4"):
        topology_of(enabled(slots_per_rank=3))
    with pytest.raises(PlanError, match="ranks_per_node=4"):
        topology_of(enabled(ranks_per_node=4), experts=12, ep=6)
    with pytest.raises(ConfigError, match="threshold=0.5 is below 1.0"):
        enabled(threshold=0.5)
    with pytest.raises(ConfigError, match="slots_per_rank=-1"):
        enabled(slots_per_rank=-1)


def skewed_trace(rng, tokens, micro_batches=1, experts=8):
    """Top-2 routing where experts 0 and 1 (rank 0's) take most tokens: [tokens * M, 1, 2]."""
    p = np.full(experts, 1.0)
    p[:2] = 12.0
    ids = np.array([rng.choice(experts, 2, replace=False, p=p / p.sum()) for _ in range(tokens * micro_batches)])
    return RoutingTrace(ids[:, None, :], tuple(np.arange(micro_batches + 1) * tokens))


def static_current(topology):
    p2l, share = home_layout(static_home(topology), topology)
    return ExpertPlacement(p2l[None], share[None])


def test_microbatch_placement_keeps_owners_and_replicates_into_spare_slots(enabled):
    host = enabled()
    topology = topology_of(host, expert_bytes=16_384)
    current = static_current(topology)
    placement = host.hook.rlweave_expert_microbatch_placement(trace=skewed_trace(np.random.default_rng(0), 512),
                                                              topology=topology, current=current)
    p2l, share = placement.physical_to_logical[0], placement.token_share[0]
    homes = np.r_[0:4, 5:9]
    np.testing.assert_array_equal(p2l[homes], current.physical_to_logical[0][homes])
    assert p2l[9] in (0, 1)  # rank 1's spare slot holds a hot expert of rank 0
    np.testing.assert_allclose(np.bincount(p2l[p2l >= 0], weights=share[p2l >= 0], minlength=8), 1.0)


def test_microbatch_placement_keeps_the_steps_replicas(enabled):
    host = enabled(ranks_per_node=4, slots_per_rank=3)  # 4 ranks x (2 homes + 1 spare)
    topology = topology_of(host, ep=4, expert_bytes=16_384)
    layout = np.array([0, 1, -1, 2, 3, 0, 4, 5, -1, 6, 7, -1])  # a step replica of expert 0 on rank 1
    share = np.where(layout >= 0, 1.0, 0.0)
    share[[0, 5]] = 0.5
    current = ExpertPlacement(layout[None], share[None])
    placement = host.hook.rlweave_expert_microbatch_placement(trace=skewed_trace(np.random.default_rng(2), 512),
                                                              topology=topology, current=current)
    p2l = placement.physical_to_logical[0]
    np.testing.assert_array_equal(p2l[layout >= 0], layout[layout >= 0])
    assert np.count_nonzero(p2l == 1) == 2  # the other hot expert got a micro-batch replica


def test_step_placement_moves_owners(enabled):
    host = enabled(ranks_per_node=1, slots_per_rank=4)  # two nodes of one rank, no spare slot: only moves help
    topology = topology_of(host, expert_bytes=16_384)
    trace = skewed_trace(np.random.default_rng(1), 512, micro_batches=2)
    placement = host.hook.rlweave_expert_step_placement(trace=trace, topology=topology,
                                                        current=static_current(topology), group_loads=None)
    p2l = placement.physical_to_logical[0]
    home = home_of(p2l, topology)
    assert home[0] != home[1]  # the two hot experts no longer share a rank
    np.testing.assert_allclose(np.bincount(p2l[p2l >= 0], weights=placement.token_share[0][p2l >= 0]), 1.0)
    # Moving 34 MB experts across nodes does not pay for 1k tokens: the placement stays.
    costly = topology_of(host, expert_bytes=0)
    kept = host.hook.rlweave_expert_step_placement(trace=trace, topology=costly, current=static_current(costly),
                                                   group_loads=None)
    np.testing.assert_array_equal(kept.physical_to_logical, static_current(costly).physical_to_logical)


def test_step_placement_keeps_replicas_of_experts_hot_all_step(enabled):
    """Expert 0 is hot in every micro-batch: one copy kept for the step beats a copy per
    micro-batch, so the step placement holds a replica of it in a spare slot."""
    host = enabled()
    topology = topology_of(host, expert_bytes=16_384_000)
    rng = np.random.default_rng(3)
    ids = np.concatenate([rng.permutation(np.r_[np.zeros(300, int), rng.integers(1, 8, 212)]) for _ in range(4)])
    partner = (ids + 1 + rng.integers(0, 7, ids.size)) % 8  # a distinct second expert
    trace = RoutingTrace(np.stack([ids, partner], axis=1)[:, None, :], tuple(np.arange(5) * 512))
    placement = host.hook.rlweave_expert_step_placement(trace=trace, topology=topology,
                                                        current=static_current(topology), group_loads=None)
    p2l = placement.physical_to_logical[0]
    assert 0 in p2l[[4, 9]]  # a spare slot holds expert 0 for the whole step


def test_home_layout_and_home_of_round_trip():
    topology = ExpertTopology(8, 1, 2, 5)
    home = np.array([1, 0, 0, 1, 1, 0, 0, 1])
    p2l, share = home_layout(home, topology)
    assert p2l.tolist() == [1, 2, 5, 6, -1, 0, 3, 4, 7, -1] and share.sum() == 8
    np.testing.assert_array_equal(home_of(p2l, topology), home)
    with pytest.raises(PlanError, match="every rank 4 experts"):
        home_layout(np.zeros(8, dtype=int), topology)


def test_step_placement_plans_from_the_group_loads_so_every_ep_group_gets_the_same(enabled):
    """Two EP groups of one expert-data-parallel group see different tokens (hot experts on
    different ranks); given the loads summed over the group, both get one plan, the plan of a
    trace with those loads."""
    from rlweave.plugins.replay_balance.loads import expert_loads

    host = enabled(ranks_per_node=1, slots_per_rank=5)
    topology = topology_of(host, expert_bytes=16_384)
    first = skewed_trace(np.random.default_rng(1), 512, micro_batches=2)
    second = RoutingTrace(7 - first.topk_ids, first.microbatch_bounds)  # rank 1's experts hot instead
    both = RoutingTrace(np.concatenate([first.topk_ids[:512], second.topk_ids[:512],
                                        first.topk_ids[512:], second.topk_ids[512:]]), (0, 1024, 2048))
    loads = expert_loads(both.topk_ids, both.microbatch_bounds, 8)
    current = static_current(topology)

    def plan(trace, group_loads):
        return host.hook.rlweave_expert_step_placement(trace=trace, topology=topology, current=current,
                                                       group_loads=group_loads)

    apart = [plan(t, None) for t in (first, second)]
    assert not np.array_equal(apart[0].physical_to_logical, apart[1].physical_to_logical)
    together = [plan(t, loads) for t in (first, second)]
    reference = plan(both, None)
    for placement in together:
        np.testing.assert_array_equal(placement.physical_to_logical, reference.physical_to_logical)
        np.testing.assert_array_equal(placement.token_share, reference.token_share)


def test_verl_jobs_run_replay_balance_on_the_mbridge_path_and_refuse_overlap():
    """In verl, ReLibra runs on the mbridge path with experts one by one and routing replay
    (integration_tests/verl_trainer/test_replay_balance_verl.py), and is refused elsewhere with
    each setting's fix; overlap is refused outright (verl's Megatron engine builds no local TP
    linears with sequence-parallel norms), and doctor reports that."""
    from rlweave.doctor import _requirement_problem
    from rlweave.adapters.verl_needs import verl_requirements
    from rlweave.plugins.overlap.plugin import NEEDS as OVERLAP
    from rlweave.plugins.replay_balance.plugin import NEEDS as BALANCE
    from rlweave.requirements import problems

    megatron = {"actor_rollout_ref.actor.strategy": "megatron", "actor_rollout_ref.actor.megatron.router_replay.mode": "R3"}
    balance = verl_requirements(BALANCE)
    supported = megatron | {"rlweave.replay_balance.enable": "true",
                            "actor_rollout_ref.actor.megatron.vanilla_mbridge": "True",
                            "actor_rollout_ref.actor.megatron.override_transformer_config.moe_grouped_gemm": "False"}
    assert problems(balance, supported, "verl command line") == []
    bridge, grouped = problems(balance, megatron | {"rlweave.replay_balance.enable": "true"}, "verl command line")
    assert bridge.startswith("actor_rollout_ref.actor.megatron.vanilla_mbridge=False (the default)")
    assert "names experts by position" in bridge and bridge.endswith("vanilla_mbridge=True.")
    assert grouped.endswith("set actor_rollout_ref.actor.megatron.override_transformer_config.moe_grouped_gemm=False.")

    overlap = verl_requirements(OVERLAP)
    [message] = problems(overlap, megatron | {"rlweave.overlap.enable": "true"}, "verl command line")
    assert message.endswith("set rlweave.overlap.enable=false.") and "verl 0.9's Megatron engine" in message
    refusal = overlap[-1]  # read before any environment fact
    assert _requirement_problem(refusal, None, gpu=True) == f"refused in a verl job: {refusal.why}"
