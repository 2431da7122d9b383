"""Routing-replay-guided MoE load balancing (ReLibra).

With routing replay (R3) the rollout engine records every token's experts and training replays
them, so the exact load of every expert in every micro-batch is known before the step starts.
Two timescales, matched to the network hierarchy:

1. per step, from the loads of all of the step's micro-batches: *expert reordering* across
   ranks and nodes, and *step replicas* copied once and kept for the whole step
   (:func:`rlweave.plugins.replay_balance.planner.plan_step`);
2. per micro-batch and layer, the best token split over the step's layout and *in-node
   replication* of hot experts onto the least-loaded ranks of the same node
   (:func:`...planner.plan_replication`).

Pure numpy: no framework is imported here. What ``bench moe`` compares against (static
placement, EPLB) and its lower bound live with the benchmark (``rlweave.benchmarks.moe_*``).
"""
