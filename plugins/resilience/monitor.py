"""MegaScale's health monitor over heartbeats and progress marks: healthy, straggler, hung, dead.

Every worker (a trainer rank, a rollout replica, its engine, an agent-loop worker) beats every
``heartbeat_s`` from a thread of its own and says which section of which step it is in. The
monitor decides, on its own clock:

1. **dead**: the adapter saw the process exit (``Heartbeat.alive`` False): known at once.
2. **hung, silent**: no beat for longer than the group's heartbeat timeout. The timeout is
   calibrated as nvidia-resiliency-ext calibrates it: ``safety_factor`` times the longest gap
   seen between two beats of the group once training runs (start-up gaps are not counted),
   within ``[min_timeout_s, max_timeout_s]``; ``initial_timeout_s`` until
   ``calibration_beats`` gaps have been seen.
3. **hung, stuck**: still beating, but in one section for longer than that section's timeout:
   ``safety_factor`` times the longest the section has taken on any worker of the group, at
   least ``section_floor_s`` (``initial_section_timeout_s`` before it has finished once).
4. **straggler**: a section's typical time on a worker (median over the last
   ``straggler_window`` steps) against the median over the group's workers. The score is
   reference / own, as in nvidia-resiliency-ext's straggler detector (1 = typical, 0.5 = twice
   as slow); below ``straggler_threshold`` the worker is a straggler. A worker is scored once it
   has ``straggler_min_samples`` timings of the section, and sections whose reference is under
   ``straggler_min_s`` are not scored at all (their noise is larger than their signal).

Hang localisation (MegaScale's "the ranks that log nothing are the faulty ones"): among the
hung workers of a group, those that went silent are the culprits, the first to stop first;
when none is silent, those behind on (step, last collective) are. The others are reported with
``culprit=False``: they wait on the culprit.

Each incident is returned once by :meth:`HealthMonitor.check`; a worker that recovers (beats
again, or its straggler score comes back) can be reported again later.
"""

from __future__ import annotations

import statistics
from collections import defaultdict, deque
from dataclasses import dataclass, field

from rlweave.types import Health, Heartbeat, SectionTime, WorkerIncident


@dataclass(frozen=True)
class MonitorPolicy:
    heartbeat_s: float = 0.5
    safety_factor: float = 5.0
    min_timeout_s: float = 3.0
    max_timeout_s: float = 60.0
    initial_timeout_s: float = 60.0
    calibration_beats: int = 20
    section_floor_s: float = 10.0
    initial_section_timeout_s: float = 900.0
    # Sections in which a worker may stay silent (checkpoint I/O can hold the GIL, and
    # nvidia-resiliency-ext suspends heartbeats there too): judged by the section timeout only.
    quiet_sections: tuple[str, ...] = ("save_checkpoint", "load_checkpoint")
    straggler_threshold: float = 0.75
    straggler_window: int = 5
    straggler_min_samples: int = 3
    straggler_min_s: float = 0.1


@dataclass
class _Worker:
    """What the monitor knows of one worker."""

    name: str
    group: str
    last_s: float
    pid: int = 0
    host: str = ""
    step: int = -1
    section: str = ""
    section_since_s: float = 0.0
    collective: str = ""
    alive: bool = True
    exit_s: float = 0.0
    detail: str = ""


def _collective_seq(collective: str) -> int:
    """``"all_reduce#42"`` -> 42 (-1 when none is known)."""
    _, _, seq = collective.rpartition("#")
    return int(seq) if seq.isdigit() else -1


@dataclass
class HealthMonitor:
    """The monitor's state. Feed it with :meth:`observe`; ask it with :meth:`check`."""

    policy: MonitorPolicy = field(default_factory=MonitorPolicy)

    def __post_init__(self) -> None:
        self.workers: dict[str, _Worker] = {}
        self.training = False  # a worker has reported a step: start-up is over
        # group -> (beat gaps seen in training, the longest): a count and a running maximum, so
        # that a check costs the same in a job's tenth hour as in its first minute
        self.gaps: dict[str, tuple[int, float]] = {}
        self.longest: dict[tuple[str, str], float] = {}  # (group, section) -> longest duration
        self.durations: dict[tuple[str, str], dict[str, deque[float]]] = defaultdict(dict)
        self.reported: dict[tuple[str, Health], WorkerIncident] = {}
        self.retired: set[tuple[str, int]] = set()

    # ------------------------------------------------------------------ input

    def observe(self, beat: Heartbeat) -> None:
        w = self.workers.get(beat.worker)
        if beat.retired:
            self.retired.add((beat.worker, beat.pid))
            if w is not None and (not beat.pid or beat.pid == w.pid):
                self._forget(w.name)
                del self.workers[w.name]
            return
        if (beat.worker, beat.pid) in self.retired:
            return
        if w is not None and beat.pid and w.pid and beat.pid != w.pid:
            if not beat.alive:
                return  # the exit of a process this name no longer stands for
            self._forget(w.name)  # a new process under the old name (a replaced worker)
            w = None
        if w is None:
            w = self.workers[beat.worker] = _Worker(beat.worker, beat.group, beat.time_s, pid=beat.pid)
        elif (beat.alive and self.training and beat.time_s > w.last_s
              and (w.name, Health.HUNG) not in self.reported):
            seen, longest = self.gaps.get(w.group, (0, 0.0))  # (a hung worker's silence is no sample)
            self.gaps[w.group] = (seen + 1, max(longest, beat.time_s - w.last_s))
        if not beat.alive:
            w.alive, w.exit_s, w.detail, w.step = False, beat.time_s, beat.detail, max(w.step, beat.step)
            return
        if not w.alive:  # beating again after an exit was reported under this pid: start afresh
            self._forget(w.name)
            w = self.workers[beat.worker] = _Worker(beat.worker, beat.group, beat.time_s, pid=beat.pid)
        w.last_s = max(w.last_s, beat.time_s)
        w.pid, w.host, w.collective = beat.pid, beat.host, beat.collective
        if beat.step > w.step or beat.section != w.section:
            w.section_since_s = beat.time_s - beat.section_s
        w.step, w.section = max(w.step, beat.step), beat.section
        self.training = self.training or beat.step >= 1
        for done in beat.finished:
            self._finished(w, done)
        self.reported.pop((w.name, Health.HUNG), None)  # beating again: a later hang is new

    def _finished(self, w: _Worker, done: SectionTime) -> None:
        key = (w.group, done.section)
        self.longest[key] = max(self.longest.get(key, 0.0), done.duration_s)
        window = self.durations[key].setdefault(w.name, deque(maxlen=self.policy.straggler_window))
        window.append(done.duration_s)

    def _forget(self, name: str) -> None:
        for per_worker in self.durations.values():
            per_worker.pop(name, None)
        for kind in Health:
            self.reported.pop((name, kind), None)

    # ------------------------------------------------------------------ timeouts

    def heartbeat_timeout(self, group: str) -> float:
        p = self.policy
        seen, longest = self.gaps.get(group, (0, 0.0))
        if seen < p.calibration_beats:
            return p.initial_timeout_s
        return min(p.max_timeout_s, max(p.min_timeout_s, p.safety_factor * longest))

    def section_timeout(self, group: str, section: str) -> float:
        p = self.policy
        longest = self.longest.get((group, section))
        if longest is None:
            return p.initial_section_timeout_s
        return max(p.section_floor_s, p.safety_factor * longest)

    # ------------------------------------------------------------------ decisions

    def straggler_scores(self) -> dict[tuple[str, str], dict[str, float]]:
        """(group, section) -> worker -> score, for sections with at least two workers that
        have ``straggler_min_samples`` timings each and a reference above ``straggler_min_s``."""
        p = self.policy
        out = {}
        for key, per_worker in self.durations.items():
            typical = {w: statistics.median(d) for w, d in per_worker.items()
                       if len(d) >= p.straggler_min_samples and self.workers.get(w, None) is not None
                       and self.workers[w].alive}
            if len(typical) < 2:
                continue
            reference = statistics.median(typical.values())
            if reference < p.straggler_min_s:
                continue
            out[key] = {w: reference / t for w, t in typical.items()}
        return out

    def check(self, now_s: float) -> list[WorkerIncident]:
        """Incidents first seen since the previous call: the dead, then the hung (culprits
        first), then the stragglers."""
        found = self._dead(now_s) + self._hung(now_s) + self._stragglers(now_s)
        new = [i for i in found if (i.worker, i.kind) not in self.reported]
        for incident in new:
            self.reported[(incident.worker, incident.kind)] = incident
        return new

    def _incident(self, w: _Worker, kind: Health, now_s: float, since_s: float, section: str | None = None,
                  **extra: object) -> WorkerIncident:
        return WorkerIncident(worker=w.name, kind=kind, step=w.step, detected_s=now_s, since_s=since_s,
                              section=w.section if section is None else section, collective=w.collective,
                              pid=w.pid, host=w.host, **extra)

    def _dead(self, now_s: float) -> list[WorkerIncident]:
        return [self._incident(w, Health.DEAD, now_s, w.exit_s, detail=w.detail or "process exited")
                for w in self.workers.values() if not w.alive]

    def _hung(self, now_s: float) -> list[WorkerIncident]:
        by_group: dict[str, list[tuple[_Worker, bool, str]]] = defaultdict(list)
        for w in self.workers.values():
            if not w.alive:
                continue
            silence = now_s - w.last_s
            in_section = now_s - w.section_since_s if w.section else 0.0
            section_limit = self.section_timeout(w.group, w.section) if w.section else float("inf")
            quiet = w.section in self.policy.quiet_sections
            if not quiet and silence > self.heartbeat_timeout(w.group):
                by_group[w.group].append((w, True, f"silent for {silence:.1f}s (timeout "
                                                    f"{self.heartbeat_timeout(w.group):.1f}s)"))
            elif in_section > section_limit:
                by_group[w.group].append((w, False, f"in {w.section} for {in_section:.1f}s "
                                                     f"(timeout {section_limit:.1f}s)"))
        out = []
        for group, hung in by_group.items():
            culprits = self._culprits(group, hung)
            for w, silent, why in sorted(hung, key=lambda h: (h[0].name not in culprits, h[0].last_s)):
                culprit = w.name in culprits
                since = w.last_s if silent else w.section_since_s
                detail = why if culprit else f"{why}; waits on {', '.join(sorted(culprits))}"
                out.append(self._incident(w, Health.HUNG, now_s, since, culprit=culprit, detail=detail))
        return out

    def _culprits(self, group: str, hung: list[tuple[_Worker, bool, str]]) -> set[str]:
        """The silent workers; else those behind on (step, collective) among the group's."""
        silent = {w.name for w, is_silent, _ in hung if is_silent}
        if silent:
            return silent
        peers = [w for w in self.workers.values() if w.group == group and w.alive]
        progress = {w.name: (w.step, _collective_seq(w.collective)) for w in peers}
        behind = min(progress.values())
        return {w.name for w, _, _ in hung if progress[w.name] == behind}

    def _stragglers(self, now_s: float) -> list[WorkerIncident]:
        threshold = self.policy.straggler_threshold
        out, slow_now = [], set()
        for (group, section), scores in sorted(self.straggler_scores().items()):
            for name, score in sorted(scores.items()):
                if score >= threshold:
                    continue
                slow_now.add(name)
                w = self.workers[name]
                out.append(self._incident(w, Health.STRAGGLER, now_s, now_s, section=section, score=score,
                                          detail=f"{section} takes {1 / score:.2f}x the median of {group}"))
        for name, kind in list(self.reported):  # back to typical: a later slowdown is new
            if kind is Health.STRAGGLER and name not in slow_now:
                del self.reported[(name, kind)]
        return out
