"""Routing-replay-guided MoE load balancing (ReLibra).

With routing replay (R3) the rollout engine records every token's experts and training replays
them, so the exact load of every expert in every micro-batch is known before the step starts.
Two timescales, matched to the network hierarchy:

1. per step, *expert reordering* across ranks and nodes from the loads of all of the step's
   micro-batches (:func:`rlweave.plugins.replay_balance.planner.plan_reorder`);
2. per micro-batch and layer, *in-node replication* of hot experts onto the least-loaded ranks
   of the same node, splitting their tokens (:func:`...planner.plan_replication`).

Baselines for comparison live in :mod:`.baselines` (static placement, EPLB).
Pure numpy: no framework is imported here.
"""
