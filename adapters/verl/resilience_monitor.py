"""The resilience monitor of a verl job: two threads in the trainer's process (verl's TaskRunner).

It receives every worker's UDP heartbeat (:mod:`rlweave.adapters.heartbeat`), hands each to
``rlweave_heartbeat``, and every ``check_s`` asks ``rlweave_health_check`` what is wrong and
``rlweave_incident`` what to do. It applies what is its to apply: ``kill`` ends a hung worker's
process, and the "stop" half of a recovery (every trainer rank for ``rebuild``, the replica's
processes for ``replace``), so that the trainer, blocked in a call to those workers, gets an
error at once instead of waiting for a collective's timeout. The trainer takes the incidents it
applies (replace, rebuild, abort) with :meth:`ResilienceMonitor.take`, a method call.

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

The chaos tool's faults are injected here, because this is where every worker's pid and
progress meet: at the step and section a fault names, SIGKILL or SIGSTOP its process, or tell
it (in the reply to its beat) to run ``factor`` times slower. ``rlweave chaos inject`` and
``status`` reach a running job's monitor over the same UDP socket as the beats, at the address
the job leaves in Ray's internal KV (which is also how senders find it).

What monitoring costs is counted where it is spent: the CPU time of the monitor's own threads,
and each sender's, reported in its beats (:meth:`ResilienceMonitor.costs`).
"""

from __future__ import annotations

import os
import select
import signal
import socket
import threading
import time
from dataclasses import asdict
from typing import Any

import psutil
import ray

from rlweave.adapters.heartbeat import HeartbeatReceiver
from rlweave.host import get_host
from rlweave.types import FaultSpec, Health, Heartbeat, RecoveryKind, SectionTime, WorkerIncident

CONTROLLER = "controller:0"
KV_PREFIX = "rlweave/resilience/monitor/"


def kv_key(job_id: str) -> bytes:
    return f"{KV_PREFIX}{job_id}".encode()


def monitor_address(job_id: str) -> str | None:
    """The monitor's UDP address for this Ray job, once it runs (``None`` before)."""
    from ray.experimental.internal_kv import _internal_kv_get, _internal_kv_initialized

    if not _internal_kv_initialized():
        return None
    value = _internal_kv_get(kv_key(job_id))
    return value.decode() if value else None


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


class ResilienceMonitor:
    """See the module docstring. One per job, started by the resilient trainer."""

    def __init__(self, job_id: str, faults: list[FaultSpec], check_s: float, host_ip: str | None = None) -> None:
        self.hook = get_host().hook
        self.host = socket.gethostname()
        self.receiver = HeartbeatReceiver(host_ip or ray.util.get_node_ip_address())
        self.job_id = job_id
        if host_ip is None:  # a job's monitor; a test's has no Ray
            from ray.experimental.internal_kv import _internal_kv_put

            _internal_kv_put(kv_key(job_id), self.receiver.address.encode(), overwrite=True)
        self.check_s = check_s
        self.lock = threading.Lock()
        self.workers: dict[str, dict[str, Any]] = {}  # name -> last beat, plus "origin"
        self.exited: set[tuple[str, int]] = set()
        self.job_step, self.job_section = 0, ""
        self.log: list[dict[str, Any]] = []  # incidents and what was done, for the trainer and the bench
        self.taken = 0
        self.faults = list(faults)
        self.fired: list[dict[str, Any]] = []
        self.firing: set[int] = set()  # fault indexes fired or being fired (two threads fire)
        self.armed: dict[int, float] = {}  # fault index -> when it fires
        self.slow: dict[str, float] = {}  # worker -> factor
        self.counters: dict[str, int] = {}
        self.sender_cpu_s: dict[tuple[str, int], float] = {}  # (worker, pid) -> its sender's CPU so far
        self.thread_cpu_s: dict[str, float] = {}  # the monitor's threads' CPU so far
        self.running = True
        for target in (self._receive_forever, self._check_forever):
            threading.Thread(target=target, daemon=True, name=f"rlweave-{target.__name__}").start()

    # ------------------------------------------------------------------ the trainer's (and chaos') API

    def address(self) -> str:
        return self.receiver.address

    def logged(self) -> int:
        """How many incidents have been logged (taken or not)."""
        with self.lock:
            return len(self.log)

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

    def take(self) -> list[dict[str, Any]]:
        """The incidents (with the monitor's decision) not handed to the trainer before."""
        with self.lock:
            new, self.taken = self.log[self.taken:], len(self.log)
        return new

    def status(self) -> dict[str, Any]:
        with self.lock:
            return {"job_step": self.job_step, "job_section": self.job_section,
                    "workers": {n: {k: w.get(k) for k in ("pid", "host", "section", "step")}
                                for n, w in self.workers.items()},
                    "incidents": list(self.log), "faults": list(self.fired), "counters": dict(self.counters)}

    def inject(self, fault: dict[str, Any]) -> None:
        """Add a fault (``rlweave chaos`` on a running job)."""
        with self.lock:
            self.faults.append(FaultSpec(**fault))

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

    def kill_workers(self, names: list[str], why: str) -> list[str]:
        """Retire and SIGKILL the processes of ``names`` (this node's; others through Ray);
        returns those ended."""
        return [w["worker"] for w in self.retire(names) if self._signal(w, signal.SIGKILL)]

    def stop(self) -> None:
        self.running = False
        self.receiver.close()  # the receiving thread's wait ends with it
        if ray.is_initialized():
            from ray.experimental.internal_kv import _internal_kv_del, _internal_kv_initialized

            if _internal_kv_initialized():
                _internal_kv_del(kv_key(self.job_id))

    # ------------------------------------------------------------------ beats

    def _receive_forever(self) -> None:
        while self.running:
            got = self.receiver.receive()
            self._count_cpu("receive")
            if got is None:
                continue
            message, origin = got
            try:
                if "chaos" in message:
                    self._on_chaos(message, origin)
                else:
                    self._on_message(message, origin)
            except Exception as error:  # a malformed beat must not stop the monitor
                print(f"rlweave resilience monitor: dropped a beat ({type(error).__name__}: {error})")

    def _count_cpu(self, thread: str) -> None:
        """This thread's CPU so far (read in the thread itself)."""
        with self.lock:
            self.thread_cpu_s[thread] = time.thread_time()

    def _on_chaos(self, m: dict[str, Any], origin: tuple[str, int]) -> None:
        """``rlweave chaos`` on a running job: ``inject`` a fault, or the monitor's ``status``."""
        if m["chaos"] == "inject":
            self.inject(m["fault"])
            self.receiver.reply(origin, {"injected": m["fault"]})
        elif m["chaos"] == "status":
            status = self.status()
            status["incidents"] = status["incidents"][-20:]  # a datagram's worth
            self.receiver.reply(origin, status)

    def _on_message(self, m: dict[str, Any], origin: tuple[str, int]) -> None:
        now = time.time()
        name = m["worker"]
        with self.lock:
            if (name, m["pid"]) in self.exited:
                return  # a process already ended or being ended: its last words change nothing
            if name == CONTROLLER:
                self.job_step, self.job_section = max(self.job_step, m["step"]), m["section"]
            step = m["step"] if m["step"] >= 0 else self.job_step
            self.workers[name] = {**m, "step": step, "origin": origin, "seen_s": now}
            for key, value in m.get("counters", {}).items():
                self.counters[key] = self.counters.get(key, 0) + value
            self.sender_cpu_s[(name, m["pid"])] = float(m.get("cpu_s", 0.0))
            reply = {"slow": self.slow[name]} if name in self.slow else None
        finished = tuple(SectionTime(**s) for s in m.get("finished", ()))
        self.hook.rlweave_heartbeat(beat=Heartbeat(
            worker=name, time_s=now, pid=m["pid"], host=m["host"], seq=m["seq"], step=step,
            section=m["section"], section_s=m["section_s"], collective=m.get("collective", ""),
            finished=finished))
        for report in m.get("reports", ()):
            self._exit(report["worker"], report.get("pid", 0), report.get("detail", "reported dead"))
        if reply is not None:
            self.receiver.reply(origin, reply)
        self._arm_faults(now)
        self._fire_due_faults(now)  # a fault without a delay fires on the beat that arms it

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
                self._decide(incident)
        self._fire_due_faults(time.time())

    def _decide(self, incident: WorkerIncident) -> None:
        action = self.hook.rlweave_incident(incident=incident)
        done = ""
        if action is not None and action.kind is RecoveryKind.KILL:
            done = "killed" if self._kill(incident.worker, signal.SIGKILL, action.reason) else "kill failed"
        elif action is not None and action.kind is RecoveryKind.REBUILD:
            group = [n for n in self._names() if n.startswith("trainer:")]
            done = f"stopped {', '.join(self.kill_workers(group, 'rebuild'))}"
        elif action is not None and action.kind is RecoveryKind.REPLACE:
            replica = incident.worker.split("/", 1)[0]
            done = f"stopped {', '.join(self.kill_workers([n for n in self._names() if n.split('/')[0] == replica], 'replace'))}"
        entry = {"incident": _plain(asdict(incident)), "action": action.kind.value if action else None,
                 "reason": action.reason if action else "", "done": done, "fault_s": self._fault_time(incident)}
        print(f"rlweave resilience: {incident.kind.value} {incident.worker} (step {incident.step}, "
              f"{incident.section or 'no section'}): {incident.detail} -> {entry['action']} {done}".rstrip())
        with self.lock:
            self.log.append(entry)

    def _names(self) -> list[str]:
        with self.lock:
            return list(self.workers)

    def _kill(self, name: str, sig: signal.Signals, why: str) -> bool:
        with self.lock:
            w = self.workers.get(name)
        return w is not None and self._signal(w, sig)

    def _signal(self, w: dict[str, Any], sig: signal.Signals) -> bool:
        """Send ``sig`` to a worker's process: this node's directly, another node's (SIGKILL
        only) through Ray by its actor's name."""
        if w["host"] == self.host:
            if w["pid"] == os.getpid():
                print(f"rlweave resilience monitor: not signalling {w['worker']}: it is this process (the job's)")
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
            try:
                ray.kill(ray.get_actor(w["actor"]), no_restart=True)
                return True
            except ValueError:
                return False
        return False

    # ------------------------------------------------------------------ chaos

    def _target_in(self, fault: FaultSpec) -> bool:
        """Whether the fault's section is running: a rollout worker's is its replica server's
        (``generate``: requests in flight on that replica); a trainer rank's is its own; another
        worker's is its own or the controller's stage."""
        if not fault.section:
            return True
        if fault.worker.startswith("rollout:"):
            names = [fault.worker.split("/", 1)[0]]
        elif fault.worker.startswith("trainer:"):
            names = [fault.worker]  # a trainer rank times its own sections: fire inside one
        else:
            names = [fault.worker, CONTROLLER]
        return any(self.workers.get(n, {}).get("section") == fault.section for n in names)

    def _arm_faults(self, now: float) -> None:
        with self.lock:
            for index, fault in enumerate(self.faults):
                if index in self.armed or fault.action == "corrupt":
                    continue
                if fault.worker in self.workers and self.job_step >= fault.step and self._target_in(fault):
                    self.armed[index] = now + fault.delay_s

    def _fire_due_faults(self, now: float) -> None:
        with self.lock:
            due = [(i, self.faults[i]) for i, at in self.armed.items() if at <= now and i not in self.firing]
            self.firing.update(i for i, _ in due)
        for index, fault in due:
            if fault.action == "slow":
                with self.lock:
                    self.slow[fault.worker] = fault.factor
                ok = True
            else:
                ok = self._kill(fault.worker, signal.SIGKILL if fault.action == "kill" else signal.SIGSTOP, "chaos")
            record = {"index": index, "fault": asdict(fault), "time_s": time.time(), "ok": ok,
                      "pid": self.workers.get(fault.worker, {}).get("pid", 0), "step": self.job_step}
            print(f"rlweave chaos: {fault.action} {fault.worker} at step {self.job_step} "
                  f"({'done' if ok else 'failed'})")
            with self.lock:
                self.fired.append(record)

    def _fault_time(self, incident: WorkerIncident) -> float:
        """When a fault was injected into this worker (or its replica), 0 when none was."""
        replica = incident.worker.split("/", 1)[0]
        times = [f["time_s"] for f in self.fired if f["fault"]["worker"].split("/", 1)[0] == replica
                 and f["fault"]["action"] in ("kill", "stop", "slow") and f["time_s"] <= incident.detected_s]
        return max(times, default=0.0)


def _plain(d: dict[str, Any]) -> dict[str, Any]:
    return {k: (v.value if isinstance(v, Health) else v) for k, v in d.items()}


def start_monitor(job_id: str, faults: tuple[FaultSpec, ...], check_s: float) -> ResilienceMonitor:
    """Start this job's monitor in the caller's process (the trainer's); it listens at once."""
    return ResilienceMonitor(job_id, list(faults), check_s)
