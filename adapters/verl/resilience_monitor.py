"""The resilience monitor of a verl job: two threads in the trainer's process (verl's TaskRunner).

It receives every worker's UDP heartbeat (:mod:`rlweave.adapters.heartbeat`), hands each to
``rlweave_heartbeat``, and every ``check_s`` asks ``rlweave_health_check`` what is wrong. It only
detects: each incident found is queued, typed (:class:`~rlweave.types.WorkerIncident`), on
:attr:`ResilienceMonitor.incidents`. What to do about it is decided in one place, the trainer's
(:mod:`.resilience_recovery`), which also signals processes through the monitor
(:meth:`ResilienceMonitor.signal_worker`, :meth:`ResilienceMonitor.kill_workers`): the monitor
is the one that knows which process is the job's.

Why in the trainer's process and not an actor of its own: the monitor needs nothing from Ray
but a process that lives as long as the job, and the trainer's is that process (when it dies,
the job is over). An actor of its own cost an idle Ray worker's CPU (7-14 ms a second on the
CPU rig, as much as the monitor's own work) and a Ray call for every question the trainer
asked. Its threads wait on a socket and a timer, so they take the GIL only to do their work, and
the interpreter's switch interval (5 ms) lets them run while the trainer computes.

It also sees processes exit: it holds a pidfd of every worker on this node and waits on them
between checks, so a crash is reported the moment the kernel ends the process, at no cost while
nothing happens (polling each process's state five times a second cost more than all the rest of
the monitor's work). A worker on another node is judged by its heartbeats alone.

Who it listens to (see docs/resilience.md, "Security"): datagrams sealed with the job's key
(:mod:`rlweave.adapters.heartbeat_channel`), which it draws at start and leaves, with its
address, in Ray's internal KV, where the job's workers find both; it binds the one address they
need (:func:`bind_address`). Whom it signals: a process on this node only if the kernel says it
descends from this job's raylet and started when it did at its first beat (:class:`JobProcesses`);
on another node, only a verl worker actor of this Ray job, through Ray. Its worker table is
bounded, and what it refuses is counted (:meth:`ResilienceMonitor.drops`).

A test or a benchmark may extend the monitor (:class:`MonitorExtension`; the chaos tool,
:mod:`rlweave.benchmarks.resilience_chaos`, is one): a plugin registered in the job's host
that has a ``monitor_extension`` attribute. A production job registers none: its monitor never
replies to a datagram and answers no request (it drops and counts them, ``unanswered_request``).

What monitoring costs is counted where it is spent: the CPU time of the monitor's own threads,
and each sender's, reported in its beats (:meth:`ResilienceMonitor.costs`).
"""

from __future__ import annotations

import json
import os
import queue
import select
import signal
import socket
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any, Protocol

import psutil
import ray

from rlweave.adapters.heartbeat import HeartbeatReceiver, Received
from rlweave.adapters.heartbeat_channel import Channel
from rlweave.host import get_host
from rlweave.types import Health, Heartbeat, SectionTime, WorkerIncident

CONTROLLER = "controller:0"
KV_PREFIX = "rlweave/resilience/monitor/"
MAX_WORKERS = 1024  # worker names the table holds (a verl job has a few per GPU)
REFUSALS = ("unanswered_request", "malformed_beat", "too_many_workers", "foreign_pid", "pid_gone")
NOT_ATTACKS = ("pid_gone",)  # a worker that ended before its first beat was read: no one's fault
BEAT_FIELDS = {"worker": str, "pid": int, "host": str, "seq": int, "step": int, "section": str,
               "section_s": (int, float)}


def kv_key(job_id: str) -> bytes:
    return f"{KV_PREFIX}{job_id}".encode()


def monitor_contact(job_id: str) -> dict[str, Any] | None:
    """How to reach this Ray job's monitor once it runs (``None`` before): ``address``,
    ``key`` (the channel's secret, hex) and the ``extensions`` whose requests it answers."""
    from ray.experimental.internal_kv import _internal_kv_get, _internal_kv_initialized

    if not _internal_kv_initialized():
        return None
    value = _internal_kv_get(kv_key(job_id))
    return json.loads(value) if value else None


def bind_address() -> str:
    """The one address the job's workers need: loopback when the Ray cluster is this node
    alone, else the node's address in the cluster (the one Ray itself uses); never every
    interface."""
    alive = [n for n in ray.nodes() if n.get("Alive")]
    return "127.0.0.1" if len(alive) <= 1 else ray.util.get_node_ip_address()


def raylet_above(pid: int) -> int | None:
    """The pid of the raylet above process ``pid``: one per node of a Ray cluster, and a verl
    job started by ``main_ppo`` has a cluster of its own."""
    try:
        for parent in psutil.Process(pid).parents():
            if Path(parent.cmdline()[0] if parent.cmdline() else "").name == "raylet":
                return parent.pid
    except (psutil.NoSuchProcess, psutil.ZombieProcess, psutil.AccessDenied):
        pass
    return None


class JobProcesses:
    """This job's processes on this node, known by what no datagram can forge: the kernel's
    parentage (below ``root``, this node's raylet of the job's cluster) and start time (the one a
    pid had when admitted; a pid reused by another process has another)."""

    def __init__(self, root: int) -> None:
        self.root = root
        self.started: dict[int, float] = {}  # admitted pid -> its start time

    def admit(self, pid: int) -> str | None:
        """Why ``pid`` is refused (``foreign_pid``: not this process nor one below ``root``;
        ``pid_gone``: no such process), or ``None``, and it is remembered with its start time."""
        if pid in self.started:
            return None
        if not psutil.pid_exists(pid):
            return "pid_gone"
        start = self._start_if_ours(pid)
        if start is None:
            return "foreign_pid"
        self.started[pid] = start
        return None

    def still_ours(self, pid: int) -> bool:
        """Whether ``pid`` is the very process admitted (same start time, still below ``root``)."""
        return pid in self.started and self._start_if_ours(pid) == self.started[pid]

    def forget(self, pid: int) -> None:
        self.started.pop(pid, None)

    def _start_if_ours(self, pid: int) -> float | None:
        try:
            process = psutil.Process(pid)
            if pid != os.getpid() and self.root not in {p.pid for p in process.parents()}:
                return None
            return process.create_time()
        except (psutil.NoSuchProcess, psutil.ZombieProcess, psutil.AccessDenied, ValueError):
            return None


def _exited(pid: int) -> str | None:
    """Why process ``pid`` (on this host) is gone, or ``None`` while it runs."""
    try:
        status = psutil.Process(pid).status()
    except psutil.NoSuchProcess:
        return "process exited"
    return "process exited (zombie)" if status == psutil.STATUS_ZOMBIE else None


class ExitWatch:
    """The processes of this node's workers, watched for their exit by pidfd (Linux 5.3+): a
    pidfd turns readable when its process ends, zombie or reaped, so :meth:`wait` sleeps until
    one does or the timeout passes. Where pidfds are missing, :meth:`wait` sleeps and each
    process's state is read instead. Used by one thread only (the fds are its own)."""

    def __init__(self) -> None:
        self.poll = select.poll()
        self.fds: dict[tuple[str, int], int] = {}  # (worker, pid) -> pidfd, or -1 where read instead
        self.keys: dict[int, tuple[str, int]] = {}

    def update(self, workers: set[tuple[str, int]]) -> list[tuple[tuple[str, int], str]]:
        """Watch exactly ``workers``; returns those already gone, with why."""
        for key in set(self.fds) - workers:
            self._forget(key)
        gone = []
        for key in workers - set(self.fds):
            try:
                fd = os.pidfd_open(key[1])
            except ProcessLookupError:
                gone.append((key, "process exited"))
                continue
            except (AttributeError, OSError):  # no pidfds here: read the state at each check
                fd = -1
            self.fds[key] = fd
            if fd >= 0:
                self.keys[fd] = key
                self.poll.register(fd, select.POLLIN)
        return gone

    def wait(self, timeout_s: float) -> list[tuple[tuple[str, int], str]]:
        """The watched processes that ended within ``timeout_s`` (at once when one has)."""
        if self.keys:
            ended = [(self.keys[fd], "process exited") for fd, _ in self.poll.poll(timeout_s * 1000)]
        else:
            time.sleep(timeout_s)
            ended = []
        ended += [(key, why) for key, fd in self.fds.items() if fd < 0 and (why := _exited(key[1])) is not None]
        for key, _ in ended:
            self._forget(key)
        return ended

    def _forget(self, key: tuple[str, int]) -> None:
        fd = self.fds.pop(key)
        if fd >= 0:
            self.poll.unregister(fd)
            del self.keys[fd]
            os.close(fd)

    def close(self) -> None:
        for key in list(self.fds):
            self._forget(key)


class MonitorExtension(Protocol):
    """What a test or benchmark adds to a job's monitor (the chaos tool): it answers the sealed
    requests that name it (``{"request": name, ...}``), sees every admitted beat and every
    check, adds to :meth:`ResilienceMonitor.status`, and may say when an incident's cause
    was set off (:meth:`cause_s`; 0 when it set off none)."""

    name: str

    def on_request(self, got: Received) -> None: ...

    def after_beat(self, got: Received, now: float) -> None: ...

    def on_check(self, now: float) -> None: ...

    def status(self) -> dict[str, Any]: ...

    def cause_s(self, incident: WorkerIncident) -> float: ...


def registered_extensions() -> list[Callable[[ResilienceMonitor], MonitorExtension]]:
    """The ``monitor_extension`` of each plugin registered in this process's host: a test's or a
    benchmark's (``RLWEAVE_PLUGIN_MODULES``); none in a production job."""
    plugins = get_host().pm.get_plugins()
    return [p.monitor_extension for p in plugins if callable(getattr(p, "monitor_extension", None))]


class ResilienceMonitor:
    """See the module docstring. One per job, started by the resilient trainer. ``extensions``:
    what makes the monitor's extensions (a test's chaos tool), each given the monitor.
    A test's monitor (``host_ip`` given) has no Ray: its workers are this process's
    descendants unless ``job_root`` says whose."""

    def __init__(self, job_id: str, check_s: float, host_ip: str | None = None, job_root: int | None = None,
                 extensions: Sequence[Callable[[ResilienceMonitor], MonitorExtension]] = ()) -> None:
        self.hook = get_host().hook
        self.host = socket.gethostname()
        self.job_id = job_id
        self.channel = Channel.new(job_id)
        self.receiver = HeartbeatReceiver(host_ip or bind_address(), self.channel)
        self.processes = JobProcesses(job_root or (os.getpid() if host_ip else _this_jobs_raylet()))
        self.check_s = check_s
        self.lock = threading.Lock()
        self.workers: dict[str, dict[str, Any]] = {}  # name -> last beat, plus "origin"
        self.exited: set[tuple[str, int]] = set()
        self.job_step, self.job_section = 0, ""
        self.detected: list[WorkerIncident] = []  # every incident found, for status and the step's figures
        self.incidents: queue.Queue[WorkerIncident] = queue.Queue()  # found, not yet taken by the trainer
        self.counters: dict[str, int] = {}
        self.refused = dict.fromkeys(REFUSALS, 0)  # beats and requests that passed the channel, refused
        self.sender_cpu_s: dict[tuple[str, int], float] = {}  # (worker, pid) -> its sender's CPU so far
        self.thread_cpu_s = {"receive": 0.0, "check": 0.0}  # the monitor's threads' CPU so far (keys fixed)
        self.extensions: dict[str, MonitorExtension] = {}
        for make in extensions:
            extension = make(self)
            self.extensions[extension.name] = extension
        if host_ip is None:  # a job's monitor; a test's has no Ray
            from ray.experimental.internal_kv import _internal_kv_put

            contact = {"address": self.receiver.address, "key": self.channel.key_hex(),
                       "extensions": sorted(self.extensions)}
            _internal_kv_put(kv_key(job_id), json.dumps(contact).encode(), overwrite=True)
        self.running = True
        self.threads = [threading.Thread(target=target, daemon=True, name=f"rlweave-{target.__name__}")
                        for target in (self._receive_forever, self._check_forever)]
        for thread in self.threads:
            thread.start()

    # ------------------------------------------------------------------ the trainer's (and extensions') API

    def address(self) -> str:
        return self.receiver.address

    def sender_channel(self) -> Channel:
        """An end of the job's channel for a sender in this process (the controller's)."""
        return self.channel.peer()

    def logged(self) -> int:
        """How many incidents have been found (taken or not)."""
        with self.lock:
            return len(self.detected)

    def drops(self) -> dict[str, int]:
        """Datagrams not acted on, by reason: the channel's (unsigned, forged, replayed, stale,
        another job's, over the rate, ...) and the monitor's own (a request no extension of this
        job answers, a beat naming a process not this job's, a full worker table, a malformed beat)."""
        return {**self.receiver.drops, **self.refused}

    def dropped(self) -> int:
        """How many datagrams were dropped for a reason that points at someone (not
        :data:`NOT_ATTACKS`): 0 in a job nobody interferes with."""
        return sum(n for reason, n in self.drops().items() if reason not in NOT_ATTACKS)

    def costs(self) -> dict[str, float]:
        """CPU seconds spent on monitoring so far: the monitor's threads (``monitor``) and every
        sender's sends and reads (``heartbeats``; a retired worker's share stays counted)."""
        with self.lock:
            return {"monitor": sum(self.thread_cpu_s.values()), "heartbeats": sum(self.sender_cpu_s.values())}

    def pids(self, prefix: str) -> set[int]:
        """Every process seen under a worker name starting with ``prefix``, running or ended."""
        with self.lock:
            return ({w["pid"] for n, w in self.workers.items() if n.startswith(prefix)}
                    | {pid for n, pid in self.exited if n.startswith(prefix)})

    def names(self) -> list[str]:
        """The workers in the table now."""
        with self.lock:
            return list(self.workers)

    def status(self) -> dict[str, Any]:
        with self.lock:
            status = {"job_step": self.job_step, "job_section": self.job_section,
                      "workers": {n: {k: w.get(k) for k in ("pid", "host", "section", "step")}
                                  for n, w in self.workers.items()},
                      "incidents": [_plain(asdict(i)) for i in self.detected],
                      "counters": dict(self.counters), "dropped": self.drops()}
        for extension in self.extensions.values():
            status.update(extension.status())
        return status

    def cause_s(self, incident: WorkerIncident) -> float:
        """When an extension set off this incident's cause (a test's fault); 0 in production."""
        return max((e.cause_s(incident) for e in self.extensions.values()), default=0.0)

    def retire(self, names: list[str]) -> list[dict[str, Any]]:
        """The processes of ``names`` are being ended on purpose (a recovery replaces them):
        their silence and their exit are no incident. Returns their last beats."""
        with self.lock:
            gone = [self.workers.pop(n) for n in names if n in self.workers]
            self.exited.update((w["worker"], w["pid"]) for w in gone)
        for w in gone:
            self.hook.rlweave_heartbeat(beat=Heartbeat(worker=w["worker"], time_s=time.time(), pid=w["pid"],
                                                       retired=True))
        return gone

    def kill_workers(self, names: list[str]) -> list[str]:
        """Retire and SIGKILL the processes of ``names`` (this node's; others through Ray);
        returns those ended."""
        return [w["worker"] for w in self.retire(names) if self._signal(w, signal.SIGKILL)]

    def signal_worker(self, name: str, sig: signal.Signals) -> bool:
        """Send ``sig`` to worker ``name``'s process if it is one of this job's (see
        :meth:`_signal`); False when it is not, or is gone."""
        with self.lock:
            w = self.workers.get(name)
        return w is not None and self._signal(w, sig)

    def stop(self) -> None:
        """End both threads and wait for them: a check still running after this returns would
        ask the hooks of whoever activated rlweave next (the plugins' state is per process)."""
        self.running = False
        self.receiver.close()  # wakes the receiving thread, which then ends
        for thread in self.threads:
            if thread is not threading.current_thread():
                thread.join(timeout=max(5.0, 4 * self.check_s))
        if ray.is_initialized():
            from ray.experimental.internal_kv import _internal_kv_del, _internal_kv_initialized

            if _internal_kv_initialized():
                _internal_kv_del(kv_key(self.job_id))

    # ------------------------------------------------------------------ beats

    def _receive_forever(self) -> None:
        while self.running:
            got = self.receiver.receive(timeout_s=None)  # asleep until a datagram (or stop) comes
            self._count_cpu("receive")
            if got is None:
                continue
            try:
                if "request" not in got.message:
                    self._on_message(got)
                elif (extension := self.extensions.get(got.message["request"])) is None:
                    self.refused["unanswered_request"] += 1
                else:
                    extension.on_request(got)
            except Exception as error:  # a malformed beat must not stop the monitor
                self.refused["malformed_beat"] += 1
                print(f"rlweave resilience monitor: dropped a beat ({type(error).__name__}: {error})")

    def _count_cpu(self, thread: str) -> None:
        """This thread's CPU so far (read in the thread itself; one key per thread, so that a
        plain store suffices: :meth:`costs` only sums)."""
        self.thread_cpu_s[thread] = time.thread_time()

    def _admitted(self, m: dict[str, Any]) -> bool:
        """Whether a sealed beat may enter the table: well formed, room for a new name, and a
        process on this node that is the job's (the kernel's word, not the beat's)."""
        if not all(isinstance(m.get(k), t) for k, t in BEAT_FIELDS.items()):
            self.refused["malformed_beat"] += 1
            return False
        if m["worker"] not in self.workers and len(self.workers) >= MAX_WORKERS:
            self.refused["too_many_workers"] += 1
            return False
        refusal = self.processes.admit(m["pid"]) if m["host"] == self.host else None
        if refusal is not None:
            self.refused[refusal] += 1
            print(f"rlweave resilience monitor: refused a beat of {m['worker']!r} naming pid {m['pid']}: "
                  f"{'no such process' if refusal == 'pid_gone' else 'not a process of this job'} "
                  f"(the job's are below pid {self.processes.root})")
            return False
        return True

    def _on_message(self, got: Received) -> None:
        m, now = got.message, time.time()
        if (m.get("worker"), m.get("pid")) in self.exited:
            return  # a process already ended or being ended: its last words change nothing
        if not self._admitted(m):
            return
        name = m["worker"]
        with self.lock:
            if name == CONTROLLER:
                self.job_step, self.job_section = max(self.job_step, m["step"]), m["section"]
            step = m["step"] if m["step"] >= 0 else self.job_step
            self.workers[name] = {**m, "step": step, "origin": got.origin, "seen_s": now}
            for key, value in m.get("counters", {}).items():
                self.counters[key] = self.counters.get(key, 0) + value
            self.sender_cpu_s[(name, m["pid"])] = float(m.get("cpu_s", 0.0))
        finished = tuple(SectionTime(**s) for s in m.get("finished", ()))
        self.hook.rlweave_heartbeat(beat=Heartbeat(
            worker=name, time_s=now, pid=m["pid"], host=m["host"], seq=m["seq"], step=step,
            section=m["section"], section_s=m["section_s"], collective=m.get("collective", ""),
            finished=finished))
        for report in m.get("reports", ()):
            self._exit(report["worker"], report.get("pid", 0), report.get("detail", "reported dead"))
        for extension in self.extensions.values():
            extension.after_beat(got, now)

    def _exit(self, name: str, pid: int, detail: str) -> None:
        if (name, pid) in self.exited:
            return
        self.exited.add((name, pid))
        self.hook.rlweave_heartbeat(beat=Heartbeat(worker=name, time_s=time.time(), pid=pid, alive=False,
                                                   step=self.job_step, detail=detail))

    # ------------------------------------------------------------------ checks

    def _check_forever(self) -> None:
        watch = ExitWatch()
        while self.running:
            try:
                for (name, pid), why in watch.wait(self.check_s):
                    self._exit(name, pid, why)
                if not self.running:  # stopped while waiting
                    break
                self._check(watch)
            except Exception as error:
                print(f"rlweave resilience monitor: check failed ({type(error).__name__}: {error})")
            self._count_cpu("check")
        watch.close()

    def _check(self, watch: ExitWatch) -> None:
        with self.lock:
            local = {(n, w["pid"]) for n, w in self.workers.items()
                     if w["host"] == self.host and (n, w["pid"]) not in self.exited}
        for (name, pid), why in watch.update(local):
            self._exit(name, pid, why)
        for incidents in self.hook.rlweave_health_check(now_s=time.time()):
            for incident in incidents:
                with self.lock:
                    self.detected.append(incident)
                self.incidents.put(incident)
        for extension in self.extensions.values():
            extension.on_check(time.time())

    def _signal(self, w: dict[str, Any], sig: signal.Signals) -> bool:
        """Send ``sig`` to a worker's process: this node's directly, if it is still the process
        of this job admitted at its first beat; another node's (SIGKILL only) through Ray, if its
        actor is one of verl's workers in this Ray job."""
        if w["host"] == self.host:
            if w["pid"] == os.getpid():
                print(f"rlweave resilience monitor: not signalling {w['worker']}: it is this process (the job's)")
                return False
            if _exited(w["pid"]) is not None:
                return False  # ended already (a fault, a crash): nothing to signal
            if not self.processes.still_ours(w["pid"]):
                print(f"rlweave resilience monitor: not signalling {w['worker']}: pid {w['pid']} is not the "
                      f"process of this job that beat as it (below pid {self.processes.root})")
                return False
            try:
                os.kill(w["pid"], sig)
            except ProcessLookupError:
                return False
            if sig == signal.SIGKILL:
                try:
                    os.kill(w["pid"], signal.SIGCONT)  # be sure a stopped process runs into it
                except ProcessLookupError:
                    pass
            return True
        if w.get("actor") and sig == signal.SIGKILL:
            from rlweave.adapters.verl.resilience import worker_name

            if worker_name(str(w["actor"]), {}) is None:
                print(f"rlweave resilience monitor: not killing actor {w['actor']!r}: not one of verl's workers")
                return False
            try:
                ray.kill(ray.get_actor(w["actor"]), no_restart=True)
                return True
            except ValueError:
                return False
        return False


def _this_jobs_raylet() -> int:
    root = raylet_above(os.getpid())
    if root is None:
        raise RuntimeError(f"rlweave resilience: no raylet above the trainer's process ({os.getpid()}); the "
                           "monitor signals only processes below this job's raylet, so it cannot run outside "
                           "a Ray worker process")
    return root


def _plain(d: dict[str, Any]) -> dict[str, Any]:
    return {k: (v.value if isinstance(v, Health) else v) for k, v in d.items()}


def start_monitor(job_id: str, check_s: float) -> ResilienceMonitor:
    """Start this job's monitor in the caller's process (the trainer's); it listens at once,
    with the extensions of the plugins registered here (none in production)."""
    return ResilienceMonitor(job_id, check_s, extensions=registered_extensions())
