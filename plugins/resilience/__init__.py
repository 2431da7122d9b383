"""Resilience (MegaScale, NSDI'24): heartbeats, straggler and hang detection, recovery by role,
two-stage checkpoints.

Pure parts, no framework imported:

- :mod:`.monitor`: :class:`~.monitor.HealthMonitor`, healthy / straggler / hung / dead from
  heartbeats and progress marks, timeouts calibrated per section from the intervals observed,
  straggler scores against the median rank, hang localisation;
- :mod:`.policy`: :class:`~.policy.RecoveryPolicy`, what to do by role (kill the hung culprit,
  replace a rollout replica, rebuild a trainer group, report a straggler);
- :mod:`.checkpoints`: which persisted checkpoint to resume (the newest that verifies);
- :mod:`.heatmap`: the per-rank straggler heat-map;
- :mod:`.plugin`: the hook implementations.

The verl adapter is :mod:`rlweave.adapters.verl.resilience` (the trainer's recovery, the
host-memory snapshots, the monitor); heartbeat senders are
:mod:`rlweave.adapters.heartbeat`. Faults are injected by the chaos tool, a plugin of tests and
benchmarks (:mod:`rlweave.benchmarks.resilience_chaos`).
"""
