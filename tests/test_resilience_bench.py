"""``rlweave bench resilience``'s reading of runs and its report, on synthetic runs (the runs
themselves are verl's, in the benchmark)."""

from __future__ import annotations

import argparse

from rlweave.benchmarks import resilience as bench


def span(name: str, lane: str, start: float, dur: float, **args) -> dict:
    return {"name": name, "ph": "X", "ts": start * 1e6, "dur": dur * 1e6, "worker": lane, "args": args}


def instant(name: str, lane: str, t: float, **args) -> dict:
    return {"name": name, "ph": "i", "ts": t * 1e6, "worker": lane, "args": args}


def faults_campaign() -> bench.Campaign:
    c = bench.Campaign("rlweave-faults", first_step_start=0.0)
    c.step_ends = [(10.0 * s, s) for s in range(1, 8)]
    c.events = [
        span("detection", "resilience", 20.0, 0.2, worker="rollout:0/engine", action="replace"),
        span("recovery", "resilience", 20.3, 40.0, worker="rollout:0/engine", action="replace"),
        span("detection", "resilience", 41.0, 4.0, worker="rollout:1/engine", action="replace"),
        span("recovery", "resilience", 45.1, 30.0, worker="rollout:1/engine", action="replace"),
        span("detection", "resilience", 52.0, 0.3, worker="trainer:1", action="rebuild"),
        span("recovery", "resilience", 52.4, 5.0, worker="trainer:1", action="rebuild"),
        span("detection", "resilience", 61.0, 3.5, worker="trainer:0", action="rebuild"),
        span("recovery", "resilience", 64.6, 4.0, worker="trainer:0", action="rebuild"),
        instant("incident", "resilience", 25.0, worker="trainer:1", kind="straggler", score=0.66, action="report"),
    ] + [span("update_actor", f"trainer:{r}", 10.0 * s, 0.2 * (3 if r else 1), section=True, step=s)
         for s in range(1, 4) for r in (0, 1)]
    c.steps = {s: {"rlweave/resilience/lost_groups": 0.0, "rlweave/resilience/steps_redone": float(s in (5, 6)),
                   "rlweave/resilience/requests_resubmitted": 6.0} for s in range(1, 8)}
    return c


def test_detection_and_recovery_are_read_per_fault_from_the_trace():
    found = bench.rlweave_faults(faults_campaign())
    assert found["rollout_crash"]["detection_s"] == 0.2 and found["trainer_hang"]["detection_s"] == 3.5
    # recovery: from detection to the next completed step after the recovery ended
    assert found["trainer_crash"]["recovery_s"] == 60.0 - 52.3
    assert found["straggler"] == {"detected": True, "worker": "trainer:1", "score": 0.66, "action": "report"}
    assert bench.ledger(faults_campaign())["steps_redone"] == 2


def test_verls_path_is_read_from_its_exits_and_relaunches():
    c = bench.Campaign("verl", launches=[0.0, 50.0], exits=[(31.0, 1)],
                       step_ends=[(10.0, 1), (20.0, 2), (70.0, 1), (80.0, 2), (90.0, 3)],
                       faults=[{"kind": "trainer_crash", "action": "kill", "time_s": 30.0}])
    [crash] = bench.verl_faults(c)
    assert crash["died_s"] == 1.0 and crash["recovery_s"] == 60.0 and crash["steps_redone"] == 2


def test_the_report_has_the_issues_headline_and_survives_missing_parts(tmp_path):
    overhead = {"step_s": {"on": [2.6, 2.7], "off": [2.6, 2.65], "on_ckpt": [2.9, 2.9], "off_ckpt": [2.8, 2.8]},
                "overhead_fraction": 0.01, "spread": [0.0, 0.02], "false_positives": 0, "steps": 10, "pairs": 2,
                "save_freq": 5, "fractions": {k: {"median": m, "spread": [m, m]} for k, m in (
                    ("overhead", 0.01), ("checkpoints", 0.07), ("overhead_with_checkpoints", 0.036), ("both", 0.1))},
                "cpu": bench._cpu_cost({"rlweave/resilience/monitor_cpu_s": 0.012, "timing_s/step": 2.5,
                                        "rlweave/resilience/heartbeat_cpu_s": 0.003,
                                        "rlweave/resilience/snapshot_s": 0.01})}
    verl = bench.Campaign("ettr-verl", first_step_start=0.0, step_ends=[(3.0 * s, s) for s in range(1, 60)])
    ours = bench.Campaign("ettr-rlweave", first_step_start=0.0, step_ends=[(3.0 * s, s) for s in range(1, 90)])
    ettr = {"rlweave": {"campaign": ours, "ettr": 0.93, "ettr_spread": [0.9, 0.96], "clean_step_s": [2.6, 2.7],
                        "steps": 89, "faults": 2},
            "verl": {"campaign": verl, "ettr": 0.6, "ettr_spread": [0.58, 0.62], "clean_step_s": [2.7, 2.65],
                     "steps": 59, "faults": 2},
            "fault_every_s": 120.0, "window_s": 360.0, "clean_step_s": [2.6, 2.7, 2.65], "clean_steps": 6}
    results = {"faults": {"campaign": faults_campaign(), "faults": bench.rlweave_faults(faults_campaign()),
                          "ledger": bench.ledger(faults_campaign()), "finished": list(range(1, 8))},
               "overhead": overhead, "ettr": ettr}
    result = bench.report(results, {"verl": "RuntimeError: boom"}, argparse.Namespace(quick=True))
    h = result.headline
    assert set(h) == {"crash_detection_s", "hang_detection_s", "recovery_s", "lost_samples", "lost_steps",
                      "false_positives", "overhead_fraction", "checkpoint_fraction",
                      "overhead_with_checkpoints_fraction", "overhead_cpu_bound_fraction", "ettr", "verl_ettr"}
    assert h["overhead_cpu_bound_fraction"] == 0.01  # (12 + 3 + 10 ms) of a 2.5 s step
    assert h["checkpoint_fraction"] == 0.07 and h["overhead_with_checkpoints_fraction"] == 0.036
    assert any(row[0] == "with save_freq=5 on both sides" for row in result.rows)
    assert h["crash_detection_s"] == 0.3 and h["hang_detection_s"] == 4.0 and h["lost_samples"] == 0
    assert result.details["errors"] == {"verl": "RuntimeError: boom"}
    png = bench.plot(result, tmp_path / "resilience.png")
    assert png.exists() and (tmp_path / "resilience-heatmap.png").exists()
    empty = bench.report({}, {"faults": "x"}, argparse.Namespace(quick=True))
    assert empty.headline["ettr"] is None


def test_the_step_watch_reads_only_what_the_trace_appended(tmp_path):
    import json

    watch = bench.StepWatch(tmp_path)
    watch.poll()
    assert watch.step_ends == [] and watch.first_step_start == 0.0
    path = tmp_path / "TaskRunner-1.jsonl"
    lines = [{"name": "generate", "ph": "X", "ts": 5e6, "dur": 1.0, "args": {}},
             {"name": "step_end", "ph": "i", "ts": 9e6, "args": {"step": 1}}]
    path.write_text("".join(json.dumps(e) + "\n" for e in lines) + '{"name": "step_e')  # a line being written
    watch.poll()
    assert watch.step_ends == [(9.0, 1)] and watch.first_step_start == 5.0
    with path.open("a") as f:
        f.write('nd", "ph": "i", "ts": 12000000.0, "args": {"step": 2}}\n')
    watch.poll()
    assert watch.step_ends == [(9.0, 1), (12.0, 2)]
