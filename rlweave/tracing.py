"""One span/event recorder for every plugin and adapter, across processes.

Each process buffers its events and a daemon thread appends them every ``FLUSH_INTERVAL_S``
(and at exit) to ``<dir>/<process>-<pid>.jsonl``: a process that Ray kills, which runs no exit
handler, loses at most the last interval's events. :func:`load_events` merges a directory.
Times are wall-clock microseconds so processes line up. Exports: Chrome/Perfetto trace JSON and a
per-worker timeline PNG with each worker's busy and idle (bubble) fractions.

When tracing is off, :meth:`Tracer.span` and :meth:`Tracer.instant` return after one check.
"""

from __future__ import annotations

import atexit
import json
import os
import threading
import time
import zlib
from collections import deque
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

FLUSH_INTERVAL_S = 0.5
# One encoder for every flush: json.dumps with an argument builds a new one per call, which
# costs about half of a small event's encoding.
_ENCODER = json.JSONEncoder(default=str)


def now_us() -> float:
    return time.time_ns() / 1000.0


class Tracer:
    """Process-wide recorder. Use the module-level :data:`tracer`."""

    def __init__(self) -> None:
        self.enabled = False
        self.directory: Path | None = None
        self.process_name = "main"
        # Recording runs on hot paths (every vLLM engine iteration): a deque takes appends without
        # a lock (the flusher pops from the other end), and the pid is read once per process, not
        # by a system call per event.
        self._buffer: deque[dict[str, Any]] = deque()
        self._pid = os.getpid()
        self._write_lock = threading.Lock()  # one flush at a time, so lines never interleave
        self._flusher: threading.Thread | None = None
        self._atexit_registered = False

    def configure(self, directory: str | os.PathLike, process_name: str | None = None) -> None:
        """Start recording into ``directory`` (created if needed)."""
        self.directory = Path(directory).resolve()
        self.directory.mkdir(parents=True, exist_ok=True)
        if process_name:
            self.process_name = process_name
        self.enabled = True
        if self._flusher is None:
            self._start_flusher()
        if not self._atexit_registered:
            atexit.register(self.flush)
            self._atexit_registered = True

    def disable(self) -> None:
        self.flush()
        self.enabled = False

    @contextmanager
    def span(self, name: str, worker: str, /, **args: Any) -> Iterator[None]:
        """Record the enclosed block as a span on ``worker``'s lane."""
        if not self.enabled:
            yield
            return
        start = now_us()
        try:
            yield
        finally:
            self.record_span(name, worker, start, now_us(), **args)

    def record_span(
        self, name: str, worker: str, start_us: float, end_us: float, /, **args: Any
    ) -> None:
        """Record a span measured elsewhere (e.g. by a framework's own timer)."""
        if self.enabled:
            self._add({"name": name, "ph": "X", "ts": start_us, "dur": end_us - start_us,
                       "worker": worker, "args": args})

    def instant(self, name: str, worker: str, /, **args: Any) -> None:
        if self.enabled:
            self._add({"name": name, "ph": "i", "ts": now_us(), "worker": worker, "args": args})

    def _add(self, event: dict[str, Any]) -> None:
        event["pid"] = self._pid
        event["process"] = self.process_name
        self._buffer.append(event)

    def _start_flusher(self) -> None:
        self._flusher = threading.Thread(target=self._flush_periodically, name="rlweave-trace-flush", daemon=True)
        self._flusher.start()

    def _after_fork_in_child(self) -> None:
        """A forked child (vLLM's engine core may be one) has none of the parent's threads, and
        its lock may have been taken by one of them at the fork: a new lock, its own pid, a new
        flusher."""
        self._write_lock = threading.Lock()
        self._pid = os.getpid()
        if self._flusher is not None:
            self._start_flusher()

    def _flush_periodically(self) -> None:
        while True:
            time.sleep(FLUSH_INTERVAL_S)
            self.flush()

    def flush(self) -> Path | None:
        """Append buffered events to this process's file; returns the file."""
        if self.directory is None:
            return None
        path = self.directory / f"{self.process_name}-{os.getpid()}.jsonl"
        with self._write_lock:
            buffer = self._buffer
            events = [buffer.popleft() for _ in range(len(buffer))]  # appends may go on meanwhile
            if events:
                with path.open("a") as f:
                    f.writelines(_ENCODER.encode(e) + "\n" for e in events)
        return path


tracer = Tracer()
os.register_at_fork(after_in_child=tracer._after_fork_in_child)


def load_events(directory: str | os.PathLike) -> list[dict[str, Any]]:
    """All events recorded into ``directory`` by every process, sorted by time."""
    events = []
    for path in sorted(Path(directory).glob("*.jsonl")):
        with path.open() as f:
            events.extend(json.loads(line) for line in f if line.strip())
    return sorted(events, key=lambda e: e["ts"])


def _lane_id(worker: str) -> int:
    return zlib.crc32(worker.encode()) & 0x7FFFFFFF


def write_chrome_trace(events: Sequence[dict[str, Any]], path: str | os.PathLike) -> Path:
    """Chrome trace-event JSON (opens in Perfetto / chrome://tracing); one lane per worker."""
    out: list[dict[str, Any]] = []
    named: set[tuple[int, str]] = set()
    for e in events:
        tid = _lane_id(e["worker"])
        if (e["pid"], e["worker"]) not in named:
            named.add((e["pid"], e["worker"]))
            out.append({"name": "thread_name", "ph": "M", "pid": e["pid"], "tid": tid,
                        "args": {"name": e["worker"]}})
            out.append({"name": "process_name", "ph": "M", "pid": e["pid"], "tid": tid,
                        "args": {"name": f"{e['process']} ({e['pid']})"}})
        record = {k: e[k] for k in ("name", "ph", "ts", "pid", "args")} | {"tid": tid, "cat": "rlweave"}
        if e["ph"] == "X":
            record["dur"] = e["dur"]
        else:
            record["s"] = "t"
        out.append(record)
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"traceEvents": out, "displayTimeUnit": "ms"}))
    return path


@dataclass(frozen=True)
class LaneSummary:
    worker: str
    busy_s: float
    busy_fraction: float  # busy time / the whole trace's wall span; 1 - this is the bubble


def _union_length(intervals: list[tuple[float, float]]) -> float:
    total, end = 0.0, float("-inf")
    for a, b in sorted(intervals):
        if b > end:
            total += b - max(a, end)
            end = b
    return total


def lane_summaries(events: Sequence[dict[str, Any]],
                   cut: Sequence[tuple[float, float]] = ()) -> list[LaneSummary]:
    """Busy fraction of each worker over the trace's span (overlapping spans count once), less
    the ``cut`` intervals (µs, spanning no span: see :func:`idle_gaps`)."""
    spans = [e for e in events if e["ph"] == "X"]
    if not spans:
        return []
    t0 = min(e["ts"] for e in spans)
    t1 = max(e["ts"] + e["dur"] for e in spans)
    wall = max(t1 - t0 - sum(b - a for a, b in cut), 1e-9)
    lanes: dict[str, list[tuple[float, float]]] = {}
    for e in spans:
        lanes.setdefault(e["worker"], []).append((e["ts"], e["ts"] + e["dur"]))
    return [
        LaneSummary(w, _union_length(iv) / 1e6, _union_length(iv) / wall)
        for w, iv in sorted(lanes.items())
    ]


def idle_gaps(spans: Sequence[dict[str, Any]], longer_than: float = 0.1) -> list[tuple[float, float]]:
    """(start, end) in µs of each stretch with no span on any lane longer than ``longer_than``
    of the trace's span and than 2 s: start-up before the first step, typically (engines
    loading, the first weight sync done), which would otherwise take most of a timeline."""
    if not spans:
        return []
    intervals = sorted((e["ts"], e["ts"] + e["dur"]) for e in spans)
    total = max(b for _, b in intervals) - intervals[0][0]
    floor = max(longer_than * total, 2e6)
    gaps, end = [], intervals[0][1]
    for a, b in intervals[1:]:
        if a - end > floor:
            gaps.append((end, a))
        end = max(end, b)
    return gaps


class _CutAxis:
    """Maps trace time (µs) to drawn seconds with each cut gap drawn ``width_s`` wide."""

    def __init__(self, t0: float, gaps: Sequence[tuple[float, float]], width_s: float) -> None:
        self.t0, self.gaps, self.width_s = t0, list(gaps), width_s

    def x(self, t: float) -> float:
        removed = sum((b - a) / 1e6 - self.width_s for a, b in self.gaps if b <= t)
        return (t - self.t0) / 1e6 - removed

    def seconds(self, x: float) -> float:
        """The inverse on drawn stretches: seconds since ``t0`` (for the tick labels)."""
        for a, b in self.gaps:
            if x <= self.x(a):
                break
            x += (b - a) / 1e6 - self.width_s
        return x


def _gap_kind(spans: Sequence[dict[str, Any]], start: float) -> str:
    """"start-up" for a gap that only a few spans (at most a tenth) precede, else "idle"."""
    before = sum(1 for e in spans if e["ts"] + e["dur"] <= start)
    return "start-up" if before <= 0.1 * len(spans) else "idle"


def write_timeline_png(events: Sequence[dict[str, Any]], path: str | os.PathLike, title: str) -> Path:
    """One row per worker, one coloured bar per span (colour = span name), busy % per row.

    Stretches with no span on any lane (:func:`idle_gaps`, start-up mostly) are cut: drawn as a
    narrow hatched break labelled with their length, left out of the busy shares, and said so
    under the axis; tick labels keep the true seconds since the first span."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import FuncFormatter

    spans = [e for e in events if e["ph"] == "X"]
    gaps = idle_gaps(spans)
    summaries = lane_summaries(spans, gaps)
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig, ax = plt.subplots(figsize=(11, 1.4 + 0.5 * max(len(summaries), 1)))
    xlabel = "seconds since the first span"
    if spans:
        t0 = min(e["ts"] for e in spans)
        drawn = (max(e["ts"] + e["dur"] for e in spans) - t0) / 1e6 - sum(b - a for a, b in gaps) / 1e6
        axis = _CutAxis(t0, gaps, width_s=0.03 * drawn)
        names = sorted({e["name"] for e in spans})
        colours = {n: plt.cm.tab10(i % 10) for i, n in enumerate(names)}
        for row, lane in enumerate(summaries):
            mine = [e for e in spans if e["worker"] == lane.worker]
            bars = [(axis.x(e["ts"]), axis.x(e["ts"] + e["dur"]) - axis.x(e["ts"])) for e in mine]
            ax.broken_barh(bars, (row - 0.4, 0.8), facecolors=[colours[e["name"]] for e in mine])
        for a, b in gaps:
            left = axis.x(a)
            ax.axvspan(left, left + axis.width_s, facecolor="0.94", hatch="//", edgecolor="0.7", lw=0)
            ax.text(left + axis.width_s / 2, (len(summaries) - 1) / 2, f"{_gap_kind(spans, a)}: "
                    f"{(b - a) / 1e6:.1f} s, not drawn", rotation=90, ha="center", va="center",
                    fontsize=7, color="0.25", bbox={"facecolor": "white", "edgecolor": "none", "pad": 1})
        ax.xaxis.set_major_formatter(FuncFormatter(lambda x, _: f"{axis.seconds(x):.0f}"))
        ax.set_yticks(range(len(summaries)),
                      [f"{s.worker}  busy {s.busy_fraction:.0%}" for s in summaries])
        handles = [plt.Rectangle((0, 0), 1, 1, color=colours[n]) for n in names]
        ax.legend(handles, names, loc="upper left", bbox_to_anchor=(1.01, 1), fontsize=8)
        if gaps:
            xlabel += (f"; {sum(b - a for a, b in gaps) / 1e6:.1f} s with no span on any lane cut out "
                       "(hatched), and left out of the busy shares")
    ax.set_xlabel(xlabel, fontsize=8)
    ax.set_title(title)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def export(directory: str | os.PathLike, out: str | os.PathLike) -> tuple[Path, Path, list[LaneSummary]]:
    """A trace folder as ``out/trace.json`` (Perfetto) and ``out/timeline.png``, and its lanes'
    busy shares (start-up cut, as the PNG shows them)."""
    events = load_events(directory)
    if not events:
        raise FileNotFoundError(f"no rlweave trace in {directory} (*.jsonl, written with "
                                f"+rlweave.tracing.enable=true +rlweave.tracing.dir={directory})")
    spans = [e for e in events if e["ph"] == "X"]
    out = Path(out)
    chrome = write_chrome_trace(events, out / "trace.json")
    png = write_timeline_png(events, out / "timeline.png", f"rlweave trace: {Path(directory).name}")
    return chrome, png, lane_summaries(spans, idle_gaps(spans))
