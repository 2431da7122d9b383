"""Heartbeats and progress marks over UDP, from any worker process to the resilience monitor.

Framework-free, so that every adapter starts the same sender: a daemon thread per process
sends one small JSON datagram to the monitor's address whenever ``interval_s`` has passed
without one (a section's start, or a count, beats at once and so defers the next), carrying the
worker's identity, its pid and host, the section in progress and the sections finished since
the last beat. UDP because a beat must cost the worker nothing (no connection, no reply to wait
for, nothing to block on when the monitor is slow) and because it needs no framework in the
process: vLLM's engine process has no Ray connection.

Section timers are sync-free: :meth:`HeartbeatSender.section` reads ``time.monotonic`` at the
start and end (a GPU adapter records CUDA events instead and reports them when they complete).

Every datagram, both ways, is sealed with the job's key (:mod:`.heartbeat_channel`): the
receiver drops and counts whatever is unsigned, forged, replayed, stale or another job's, and a
sender reads an answer only from the monitor's address, sealed for it, and hands it to its
``answer_listeners``. A production job has none and its monitor answers no beat: only a
monitor extension answers (a test's chaos tool, whose worker side listens); the sender's thread
sleeps on its socket, so it reads such an answer as it arrives.

What monitoring costs is measured where it is spent: each sender adds up the CPU time of its
sends and reads, in any thread, and reports the total in every beat (``cpu_s``).

Where the monitor is: ``RLWEAVE_MONITOR_ADDR`` (``host:port``) in the environment, with the
channel's job id and key (``RLWEAVE_MONITOR_JOB``, ``RLWEAVE_MONITOR_KEY``), which the sender sets
once it knows them, so that child processes (vLLM's engine) inherit them; and who the process is:
``RLWEAVE_WORKER`` (``role:rank``).
"""

from __future__ import annotations

import os
import select
import socket
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from rlweave.adapters.heartbeat_channel import (
    DROP_REASONS,
    MAGIC,
    MAX_DATAGRAM,
    MONITOR,
    Channel,
    RateLimit,
    Rejected,
    ReplayGuard,
)

MONITOR_ENV = "RLWEAVE_MONITOR_ADDR"
WORKER_ENV = "RLWEAVE_WORKER"


def parse_address(text: str) -> tuple[str, int]:
    host, _, port = text.rpartition(":")
    return host.strip("[]"), int(port)


class HeartbeatSender:
    """One per process (:func:`start`). Thread-safe; every method returns at once."""

    def __init__(self, address: tuple[str, int], worker: str, interval_s: float, channel: Channel) -> None:
        self.address, self.worker, self.interval_s = address, worker, interval_s
        self.channel = channel
        self._replies = ReplayGuard(max_senders=1)  # the monitor is the one sender it hears
        self.dropped = 0  # datagrams not from the monitor, or not sealed for this sender
        self.host = socket.gethostname()
        self.pid = os.getpid()
        self.seq = 0
        self.step = -1
        self.current = ""  # the section in progress
        self.section_start = 0.0
        self.collective = ""
        # Who reads the monitor's answers to this process's beats, each answer's body once, on the
        # sender's thread (a monitor extension's worker side; none in a production job).
        self.answer_listeners: list[Callable[[dict[str, Any]], None]] = []
        self.cpu_s = 0.0  # this sender's own CPU seconds (its sends and reads, in any thread)
        self.actor = ""  # the Ray actor's name, where the process is one (a remote kill goes through it)
        # Reads the process's progress through its collectives (``"collectives#42"``) at each beat.
        self.collective_probe: Callable[[], str] | None = None
        self._activities: dict[str, int] = {}
        self._counters: dict[str, int] = {}
        self._finished: list[dict[str, Any]] = []
        self._extra: list[dict[str, Any]] = []
        self._lock = threading.Lock()
        self._last_sent = 0.0  # monotonic time of the last beat, from any thread
        self._sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self._sock.setblocking(False)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="rlweave-heartbeat", daemon=True)
        self._thread.start()

    # ---------------------------------------------------------------- progress

    @contextmanager
    def section(self, name: str, step: int | None = None) -> Iterator[None]:
        """Time the enclosed block as section ``name``, beating as it starts; sections do not
        nest (an inner one is timed, the outer one resumes as the current section afterwards)."""
        outer = (self.current, self.section_start)
        start_wall, start = time.time(), time.monotonic()
        with self._lock:
            if step is not None:
                self.step = step
            self.current, self.section_start = name, start
        self.beat_now()
        try:
            yield
        finally:
            duration = time.monotonic() - start
            with self._lock:
                self._finished.append({"section": name, "step": self.step, "start_s": start_wall,
                                       "duration_s": duration})
                self.current, self.section_start = outer

    @contextmanager
    def activity(self, name: str) -> Iterator[None]:
        """Like :meth:`section` for work that overlaps itself (a server's requests in flight):
        the section is ``name`` while at least one is running, and the first one beats at once;
        nothing is timed."""
        with self._lock:
            self._activities[name] = self._activities.get(name, 0) + 1
            first = self._activities[name] == 1 and not self.current
        if first:
            self.beat_now()  # the monitor learns at once that the work began
        try:
            yield
        finally:
            with self._lock:
                self._activities[name] -= 1

    def count(self, key: str, n: int = 1, beat: bool = True) -> None:
        """Add to a counter the monitor sums over every worker (``requests_resubmitted``); beats at
        once (counts are rare), so that the step it happened in reports it, unless ``beat`` is
        false (a count made every step rides on the next beat)."""
        with self._lock:
            self._counters[key] = self._counters.get(key, 0) + n
        if beat:
            self.beat_now()

    def set_step(self, step: int) -> None:
        """A new step begins (the controller's): beat at once, so that the monitor's notion of
        the job's step is never behind what the workers do."""
        self.step = step
        self.beat_now()

    def entered_collective(self, name: str, seq: int) -> None:
        self.collective = f"{name}#{seq}"

    def report(self, worker: str, alive: bool, detail: str = "", pid: int = 0) -> None:
        """Speak for another process (a child whose exit this process saw, a server a client
        found dead): sent with the next beat."""
        with self._lock:
            self._extra.append({"worker": worker, "alive": alive, "detail": detail, "pid": pid,
                                "host": self.host})
        self.beat_now()

    def beat_now(self) -> None:
        self._send()

    # ---------------------------------------------------------------- the thread

    def _message(self) -> dict[str, Any]:
        with self._lock:
            self.seq += 1
            finished, self._finished = self._finished, []
            extra, self._extra = self._extra, []
            counters, self._counters = self._counters, {}
            section = self.current or next((a for a, n in self._activities.items() if n > 0), "")
            running = time.monotonic() - self.section_start if self.current else 0.0
            collective = self.collective
            if self.collective_probe is not None:
                try:
                    collective = self.collective_probe()
                except Exception:  # the process group is being torn down
                    pass
            return {"worker": self.worker, "pid": self.pid, "host": self.host, "seq": self.seq,
                    "step": self.step, "section": section, "section_s": running, "actor": self.actor,
                    "collective": collective, "finished": finished, "reports": extra,
                    "counters": counters, "cpu_s": self.cpu_s}

    def _send(self) -> None:
        start = time.thread_time()
        self._last_sent = time.monotonic()
        data = self.channel.seal(self._message())
        try:
            self._sock.sendto(data, self.address)
        except OSError:
            pass  # the monitor is gone or not up yet: nothing to do, the next beat tries again
        self._spent(start)

    def _spent(self, start: float) -> None:
        with self._lock:
            self.cpu_s += time.thread_time() - start

    def _read_instructions(self) -> None:
        start = time.thread_time()
        try:
            self._read_all()
        finally:
            self._spent(start)

    def _read_all(self) -> None:
        while True:
            try:
                data, origin = self._sock.recvfrom(MAX_DATAGRAM + 1)
            except (BlockingIOError, OSError):
                return
            try:
                if origin[:2] != self.address:
                    raise Rejected("not_for_us")
                opened = self.channel.open(data)
                if opened.sender != MONITOR:
                    raise Rejected("not_for_us")
                self._replies.check(opened, time.time())
                for listener in self.answer_listeners:
                    listener(opened.body)
            except (Rejected, ValueError, TypeError):
                self.dropped += 1

    def _run(self) -> None:
        while not self._stop.is_set():
            left = self._last_sent + self.interval_s - time.monotonic()
            if left <= 0:
                self._send()
                continue
            try:
                readable, _, _ = select.select([self._sock], [], [], left)
            except (OSError, ValueError):  # the socket was closed
                return
            if readable:
                self._read_instructions()

    def stop(self) -> None:
        self._stop.set()


_sender: HeartbeatSender | None = None
_start_lock = threading.Lock()


def current() -> HeartbeatSender | None:
    """This process's sender, if it started one."""
    return _sender


def start(address: str, worker: str, interval_s: float, actor: str = "",
          channel: Channel | None = None) -> HeartbeatSender:
    """Start this process's sender once (later calls return the running one) on ``channel``
    (by default the one a parent process exported) and export the monitor's address, the
    channel and the worker's identity to child processes."""
    global _sender
    with _start_lock:
        if _sender is None:
            channel = channel or Channel.from_environ()
            if channel is None:
                raise RuntimeError(f"rlweave resilience: a heartbeat to {address} needs the job's channel key "
                                   f"(RLWEAVE_MONITOR_KEY and RLWEAVE_MONITOR_JOB in the environment), "
                                   "which the process that exported the address exports beside it")
            _sender = HeartbeatSender(parse_address(address), worker, interval_s, channel)
            _sender.actor = actor
            os.environ.update({MONITOR_ENV: address, WORKER_ENV: worker, **channel.export()})
        return _sender


NOT_A_WORKER = "not a worker"


def start_when_known(resolve: Callable[[], tuple[str, str, str, Channel] | str | None], interval_s: float,
                     give_up_s: float = 3600.0) -> None:
    """Start the sender from a background thread once ``resolve()`` returns (address, worker,
    actor name, channel): a process may load before the monitor exists, or before it knows its
    own name. ``resolve()`` returns ``None`` to be asked again, :data:`NOT_A_WORKER` to stop."""

    def wait() -> None:
        deadline = time.monotonic() + give_up_s
        while time.monotonic() < deadline:
            try:
                found = resolve()
            except Exception:  # the framework is shutting down, or not up yet
                found = None
            if found == NOT_A_WORKER:
                return
            if found is not None:
                address, worker, actor, channel = found
                start(address, worker, interval_s, actor=actor, channel=channel)
                return
            time.sleep(interval_s)

    threading.Thread(target=wait, name="rlweave-heartbeat-start", daemon=True).start()


@dataclass(frozen=True)
class Received:
    """A datagram the receiver accepted: its body, where it came from, its sender's id on the
    channel and when the sender sealed it (its clock: gaps between one sender's beats)."""

    message: dict[str, Any]
    origin: tuple[str, int]
    sender: str
    sent_s: float


class HeartbeatReceiver:
    """The monitor's end: a UDP socket on an ephemeral port of ``host`` (the one address the
    job's workers need: see :func:`rlweave.adapters.verl.resilience_monitor.bind_address`),
    accepting only datagrams sealed on ``channel``, and counting the rest by reason.

    The socket blocks: a monitor's thread sleeps in one ``recvfrom`` per datagram and never
    wakes while nothing arrives (:meth:`close` wakes it with a datagram of its own)."""

    def __init__(self, host: str, channel: Channel) -> None:
        self.channel = channel
        self._guard, self._rate = ReplayGuard(), RateLimit()
        self.drops = dict.fromkeys(DROP_REASONS, 0)  # keys fixed: read from other threads
        self._sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self._sock.bind((host, 0))
        self._own = self._sock.getsockname()
        self._closed = False
        self.address = f"{host}:{self._own[1]}"

    def receive(self, timeout_s: float | None = 0.2) -> Received | None:
        """One accepted datagram, or ``None``: after ``timeout_s`` without one (``None``: wait
        until one arrives or the receiver is closed), or for one dropped."""
        try:
            if timeout_s is not None and not select.select([self._sock], [], [], timeout_s)[0]:
                return None
            data, origin = self._sock.recvfrom(MAX_DATAGRAM + 1)
        except (OSError, ValueError):  # closed
            return None
        if self._closed:
            return None
        try:
            return self._accept(data, origin)
        except Rejected as rejected:
            self.drops[rejected.reason] += 1
            return None

    def _accept(self, data: bytes, origin: tuple[str, int]) -> Received:
        """The checks, cheapest first: a flood of junk stops at the length, the prefix or the rate."""
        if len(data) > MAX_DATAGRAM:
            raise Rejected("oversize")
        if not data.startswith(MAGIC):
            raise Rejected("unsigned")
        now = time.time()
        if not self._rate.allow(origin, time.monotonic()):
            raise Rejected("rate")
        opened = self.channel.open(data)
        self._guard.check(opened, now)
        return Received(opened.body, origin, opened.sender, opened.time_s)

    def dropped(self) -> int:
        return sum(self.drops.values())

    def reply(self, to: Received, message: dict[str, Any]) -> None:
        """Answer a datagram's sender, sealed for it alone."""
        try:
            self._sock.sendto(self.channel.seal(message, to=to.sender), to.origin)
        except OSError:
            pass

    def close(self) -> None:
        """Close the socket, waking a thread blocked in :meth:`receive` (it returns ``None``)."""
        self._closed = True
        try:
            self._sock.sendto(b"", self._own)
        except OSError:
            pass
        self._sock.close()
