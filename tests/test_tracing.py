from __future__ import annotations

import json
import signal
import subprocess
import sys
import threading

from rlweave.tracing import (
    Tracer,
    idle_gaps,
    lane_summaries,
    load_events,
    write_chrome_trace,
    write_timeline_png,
)


def test_spans_round_trip_through_files_and_exports(tmp_path):
    tracer = Tracer()
    tracer.configure(tmp_path / "t", process_name="driver")
    tracer.record_span("generate", "actor", 0.0, 2e6, step=1)
    tracer.record_span("update_actor", "actor", 3e6, 4e6)
    tracer.record_span("generate", "rollout", 0.0, 4e6)
    tracer.instant("step_end", "trainer", step=1)
    tracer.flush()
    events = load_events(tmp_path / "t")
    assert [e["name"] for e in events if e["ph"] == "X"] == ["generate", "generate", "update_actor"]

    lanes = {lane.worker: lane for lane in lane_summaries(events)}
    assert lanes["actor"].busy_fraction == 0.75  # 3 of 4 seconds
    assert lanes["rollout"].busy_fraction == 1.0

    chrome = json.loads(write_chrome_trace(events, tmp_path / "trace.json").read_text())
    phases = {e["ph"] for e in chrome["traceEvents"]}
    assert {"M", "X", "i"} <= phases
    png = write_timeline_png(events, tmp_path / "timeline.png", "test")
    assert png.read_bytes()[:4] == b"\x89PNG"


def test_overlapping_spans_count_once():
    events = [{"name": "a", "ph": "X", "ts": 0.0, "dur": 2.0, "worker": "w"},
              {"name": "b", "ph": "X", "ts": 1.0, "dur": 2.0, "worker": "w"},
              {"name": "c", "ph": "X", "ts": 0.0, "dur": 4.0, "worker": "v"}]
    lanes = {lane.worker: lane.busy_fraction for lane in lane_summaries(events)}
    assert lanes == {"v": 1.0, "w": 0.75}


def test_disabled_tracer_records_nothing(tmp_path):
    tracer = Tracer()
    with tracer.span("x", "w"):
        pass
    tracer.instant("y", "w")
    assert tracer.flush() is None


def test_a_killed_process_keeps_the_spans_older_than_the_flush_interval(tmp_path):
    """Ray stops workers with SIGKILL, which runs no exit handler: the flush thread must have
    written a span recorded one interval before, with no further event to trigger a flush."""
    script = (f"import os, signal, time\n"
              f"from rlweave.tracing import FLUSH_INTERVAL_S, tracer\n"
              f"tracer.configure({str(tmp_path)!r}, process_name='worker')\n"
              f"tracer.record_span('iteration', 'engine', 0.0, 1.0)\n"
              f"time.sleep(3 * FLUSH_INTERVAL_S)\n"
              f"os.kill(os.getpid(), signal.SIGKILL)\n")
    result = subprocess.run([sys.executable, "-c", script], check=False)
    assert result.returncode == -signal.SIGKILL
    assert [e["name"] for e in load_events(tmp_path)] == ["iteration"]


def test_a_forked_child_flushes_on_its_own(tmp_path):
    script = (f"import os, signal, time\n"
              f"from rlweave.tracing import FLUSH_INTERVAL_S, load_events, tracer\n"
              f"tracer.configure({str(tmp_path)!r}, process_name='parent')\n"
              f"pid = os.fork()\n"
              f"if pid == 0:\n"
              f"    tracer.record_span('iteration', 'engine', 0.0, 1.0, me=os.getpid())\n"
              f"    time.sleep(3 * FLUSH_INTERVAL_S)\n"
              f"    os.kill(os.getpid(), signal.SIGKILL)\n"
              f"os.waitpid(pid, 0)\n")
    subprocess.run([sys.executable, "-c", script], check=True)
    events = load_events(tmp_path)
    assert [e["name"] for e in events] == ["iteration"]
    assert events[0]["pid"] == events[0]["args"]["me"]  # the child's pid (the tracer keeps one)


def test_events_recorded_while_another_thread_flushes_are_all_written(tmp_path):
    """The engine thread records without a lock while the flusher drains the buffer."""
    tracer = Tracer()
    tracer.configure(tmp_path, process_name="engine")
    recorded = 20_000

    def record() -> None:
        for i in range(recorded):
            tracer.record_span("iteration", "engine", float(i), i + 1.0)

    thread = threading.Thread(target=record)
    thread.start()
    while thread.is_alive():
        tracer.flush()
    tracer.flush()
    assert sorted(e["ts"] for e in load_events(tmp_path)) == [float(i) for i in range(recorded)]


def test_a_start_up_stretch_with_no_span_is_cut_from_the_timeline_and_the_busy_shares(tmp_path):
    """An initial weight sync, 16 s of engines starting with no span, then steady steps."""
    s = 1e6
    events = [{"name": "weight_sync", "ph": "X", "ts": 0.0, "dur": 2 * s, "worker": "rollout"}]
    for step in range(10):
        start = (18 + 3 * step) * s
        events += [{"name": "generate", "ph": "X", "ts": start, "dur": 2 * s, "worker": "rollout"},
                   {"name": "update_actor", "ph": "X", "ts": start + 2 * s, "dur": s, "worker": "actor"}]
    assert idle_gaps(events) == [(2 * s, 18 * s)]
    assert idle_gaps(events[1:]) == []  # steady steps alone have no gap to cut
    cut = {lane.worker: lane.busy_fraction for lane in lane_summaries(events, idle_gaps(events))}
    assert cut == {"actor": 10 / 32, "rollout": 22 / 32}  # 32 s drawn: 2 s, then steps from 18 s to 48 s
    png = write_timeline_png(events, tmp_path / "timeline.png", "test")
    assert png.read_bytes()[:4] == b"\x89PNG"


def test_rlweave_trace_exports_a_folder_and_names_the_fix_for_an_empty_one(tmp_path, capsys):
    from rlweave.cli import main

    tracer = Tracer()
    tracer.configure(tmp_path / "t", process_name="driver")
    tracer.record_span("generate", "rollout", 0.0, 2e6)
    tracer.flush()
    assert main(["trace", str(tmp_path / "t")]) == 0
    assert (tmp_path / "t" / "trace.json").is_file() and (tmp_path / "t" / "timeline.png").is_file()
    assert main(["trace", str(tmp_path / "empty")]) == 2
    assert "+rlweave.tracing.enable=true" in capsys.readouterr().err
