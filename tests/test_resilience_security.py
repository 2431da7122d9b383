"""Attacks on the resilience monitor's channel (issue 45), all on loopback (127.0.0.1).

Each runs a production monitor (no chaos tool unless a test says otherwise), and the trainer's
desk that decides and acts on what it finds, with one genuine worker beating, a victim process
that is not the job's, and then the attack. After each: the victim and the job's processes
alive, no incident, the genuine worker still the only one in the table with its own pid, and
the attack's datagrams counted by reason.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator

import psutil
import pytest

from rlweave.adapters import heartbeat
from rlweave.adapters import heartbeat_channel as hc
from rlweave.adapters.heartbeat_channel import Channel

pytest.importorskip("ray", reason="the monitor is the verl adapter's (ray in the core environment)")

from rlweave.benchmarks.resilience_chaos import FaultInjector, worker_extension  # noqa: E402
from rlweave.adapters.verl.resilience_monitor import ResilienceMonitor  # noqa: E402
from rlweave.adapters.verl.resilience_recovery import IncidentDesk, RecoveryExecutor  # noqa: E402

LOOPBACK = "127.0.0.1"
GENUINE = "agent_loop:0"


def beat_body(worker: str, pid: int, step: int = 0) -> dict:
    return {"worker": worker, "pid": pid, "host": socket.gethostname(), "seq": 1, "step": step, "section": "",
            "section_s": 0.0, "finished": [], "reports": [], "counters": {}, "cpu_s": 0.0}


@pytest.fixture
def foreign() -> Iterator[int]:
    """A process of this user that is not the job's: started by a child that exits at once, so
    that it is no descendant of this (the job's) process."""
    start = ("import subprocess, sys; p = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(120)'], "
             "start_new_session=True, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, "
             "stderr=subprocess.DEVNULL); print(p.pid)")
    out = subprocess.run([sys.executable, "-c", start], capture_output=True, text=True, check=True, timeout=30)
    pid = int(out.stdout)
    yield pid
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def start_job(chaos: bool) -> Iterator[tuple[ResilienceMonitor, heartbeat.HeartbeatSender]]:
    """A monitor (no chaos tool: production) with the desk that decides and acts on its
    incidents, and a genuine worker beating every 50 ms, seen once before the test starts."""
    from rlweave.config import Setting
    from rlweave.host import activate

    host = activate([Setting("resilience.enable", True, "test")], export_env=False)
    extensions = [lambda m: FaultInjector(m, [])] if chaos else []
    monitor = ResilienceMonitor("job-a", 0.05, host_ip=LOOPBACK, extensions=extensions)
    desk = IncidentDesk(host.hook, monitor, RecoveryExecutor(monitor))
    sender = heartbeat.HeartbeatSender(heartbeat.parse_address(monitor.address()), GENUINE, 0.05,
                                       monitor.sender_channel())
    wait_for(lambda: GENUINE in monitor.status()["workers"])
    yield monitor, sender
    sender.stop()
    desk.stop()
    monitor.stop()


@pytest.fixture
def job() -> Iterator[tuple[ResilienceMonitor, heartbeat.HeartbeatSender]]:
    yield from start_job(chaos=False)


@pytest.fixture
def chaos_job() -> Iterator[tuple[ResilienceMonitor, heartbeat.HeartbeatSender]]:
    """The same with the chaos tool registered (a test or benchmark job)."""
    yield from start_job(chaos=True)


def wait_for(condition, timeout_s: float = 10.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.01)


def send(monitor: ResilienceMonitor, *datagrams: bytes) -> socket.socket:
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    sock.bind((LOOPBACK, 0))
    for data in datagrams:
        sock.sendto(data, heartbeat.parse_address(monitor.address()))
    return sock


def settle(monitor: ResilienceMonitor, before: int, more: int) -> None:
    """Wait until the monitor has counted ``more`` drops beyond ``before``, then two checks."""
    wait_for(lambda: sum(monitor.drops().values()) >= before + more)
    time.sleep(3 * monitor.check_s)


def unharmed(monitor: ResilienceMonitor, *pids: int) -> None:
    """Every process alive and running, no incident, the genuine worker alone in the table."""
    for pid in (os.getpid(), *pids):
        assert psutil.Process(pid).status() != psutil.STATUS_STOPPED and psutil.pid_exists(pid), pid
    status = monitor.status()
    assert monitor.logged() == 0 and status["incidents"] == [], status["incidents"]
    assert {n: w["pid"] for n, w in status["workers"].items()} == {GENUINE: os.getpid()}
    assert status.get("faults", []) == []


def no_answer(sock: socket.socket, wait_s: float = 0.5) -> None:
    sock.settimeout(wait_s)
    with pytest.raises(TimeoutError):
        sock.recvfrom(hc.MAX_DATAGRAM)


def test_a_forged_beat_and_a_forged_inject_without_the_key_are_dropped(job, foreign):
    """The old wire format (plain JSON), and the new one sealed with a key not the job's: a beat
    naming a foreign pid, then faults against it. Nothing enters the table, nothing fires."""
    monitor, _ = job
    forger = Channel("job-a", os.urandom(32))
    beat, inject = beat_body("trainer:9", foreign), {"request": "chaos", "chaos": "inject", "fault": {
        "action": "kill", "worker": "trainer:9", "step": 0}}
    before = dict(monitor.drops())
    sock = send(monitor, json.dumps(beat).encode(), json.dumps(inject).encode(),
                json.dumps({"request": "chaos", "chaos": "status"}).encode(), forger.seal(beat), forger.seal(inject))
    settle(monitor, sum(before.values()), 5)
    drops = monitor.drops()
    assert (drops["unsigned"] - before["unsigned"], drops["bad_mac"] - before["bad_mac"]) == (3, 2)
    no_answer(sock)  # the status request got nothing back
    unharmed(monitor, foreign)


def test_a_sealed_beat_naming_a_process_not_the_jobs_is_refused(job, foreign):
    """Even with the key (a compromised worker), a beat cannot make the monitor watch or
    signal a process the kernel does not place under the job."""
    monitor, _ = job
    insider = monitor.sender_channel()
    before = monitor.drops()
    send(monitor, insider.seal(beat_body("trainer:9", foreign)))
    settle(monitor, sum(before.values()), 1)
    assert monitor.drops()["foreign_pid"] == before["foreign_pid"] + 1
    unharmed(monitor, foreign)


def test_a_pid_reused_after_admission_is_not_signalled(chaos_job):
    """The kernel's start time is checked again before a signal: a worker's pid now held by
    another process (simulated by changing the start time admitted) is refused."""
    monitor, _ = chaos_job
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
    try:
        send(monitor, monitor.sender_channel().seal(beat_body("trainer:3", child.pid)))
        wait_for(lambda: "trainer:3" in monitor.status()["workers"])
        monitor.processes.started[child.pid] -= 100.0  # as if the pid were another process's now
        chaos = monitor.extensions["chaos"]
        chaos.inject({"action": "kill", "worker": "trainer:3", "step": 0})
        wait_for(lambda: chaos.fired_list())
        [fired] = chaos.fired_list()
        assert fired["ok"] is False and child.poll() is None
    finally:
        child.kill()
        child.wait()


def test_a_production_job_takes_no_fault_and_answers_nothing_even_sealed(job, foreign):
    """Without the chaos plugin registered there is no fault injector: a sealed inject or
    status request is dropped and counted, and nothing answers it."""
    monitor, _ = job
    insider = monitor.sender_channel()
    before = monitor.drops()
    inject = {"request": "chaos", "chaos": "inject", "fault": {"action": "kill", "worker": GENUINE, "step": 0}}
    sock = send(monitor, insider.seal(inject), insider.seal({"request": "chaos", "chaos": "status"}))
    settle(monitor, sum(before.values()), 2)
    assert monitor.extensions == {}
    assert monitor.drops()["unanswered_request"] == before["unanswered_request"] + 2
    no_answer(sock)
    unharmed(monitor, foreign)


def test_a_replayed_or_stale_genuine_datagram_is_dropped(job, monkeypatch):
    monitor, _ = job
    insider = monitor.sender_channel()
    genuine = insider.seal(beat_body(GENUINE, os.getpid()))
    real_time = time.time
    monkeypatch.setattr(hc.time, "time", lambda: real_time() - 2 * hc.FRESH_S)
    old = insider.seal(beat_body(GENUINE, os.getpid()))
    monkeypatch.undo()
    before = monitor.drops()
    send(monitor, genuine, genuine, genuine, old)
    settle(monitor, sum(before.values()), 3)
    drops = monitor.drops()
    assert (drops["replayed"] - before["replayed"], drops["stale"] - before["stale"]) == (2, 1)
    unharmed(monitor)


def test_a_datagram_sealed_for_another_job_is_dropped(job):
    """Another job's datagram: its own key (the MAC fails), or, were a key shared, its job id."""
    monitor, _ = job
    other_job = Channel("job-b", os.urandom(32))
    same_key_other_id = Channel("job-b", bytes.fromhex(monitor.channel.key_hex()))
    before = monitor.drops()
    send(monitor, other_job.seal(beat_body("trainer:5", os.getpid())),
         same_key_other_id.seal(beat_body("trainer:5", os.getpid())))
    settle(monitor, sum(before.values()), 2)
    drops = monitor.drops()
    assert (drops["bad_mac"] - before["bad_mac"], drops["foreign_job"] - before["foreign_job"]) == (1, 1)
    unharmed(monitor)


def test_a_sender_takes_instructions_only_from_its_monitors_address_sealed_for_it(chaos_job):
    """A third address, even with the key and the monitor's id, cannot slow a worker down; nor
    can an answer sealed for another sender, nor one replayed."""
    monitor, sender = chaos_job
    slow = worker_extension(sender)  # the chaos tool's worker side, which reads the answers
    as_monitor = Channel("job-a", bytes.fromhex(monitor.channel.key_hex()), hc.MONITOR)
    third = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    third.bind((LOOPBACK, 0))
    target = (LOOPBACK, sender._sock.getsockname()[1])
    third.sendto(as_monitor.seal({"slow": 50.0}, to=sender.channel.name), target)
    third.sendto(json.dumps({"slow": 50.0}).encode(), target)
    wait_for(lambda: sender.dropped >= 2)
    assert slow.factor == 1.0
    # From the monitor's own socket: one for another sender is dropped, one for this one taken once.
    monitor.receiver._sock.sendto(monitor.channel.seal({"slow": 50.0}, to="someone-else"), target)
    sealed = monitor.channel.seal({"slow": 2.0}, to=sender.channel.name)
    monitor.receiver._sock.sendto(sealed, target)
    wait_for(lambda: slow.factor == 2.0)
    slow.factor = 1.0
    monitor.receiver._sock.sendto(sealed, target)  # replayed
    wait_for(lambda: sender.dropped >= 4)
    assert slow.factor == 1.0
    third.close()
    unharmed(monitor)


def test_a_flood_of_junk_costs_counters_not_detection(job, foreign):
    """Three seconds of junk from several sockets (random bytes, prefixed junk, oversize), while
    the genuine worker beats: no incident, the worker still fresh, memory bounded, and a crash
    reported afterwards still detected."""
    monitor, sender = job
    sockets = [send(monitor) for _ in range(4)]
    address = heartbeat.parse_address(monitor.address())
    junk = [os.urandom(200), hc.MAGIC + os.urandom(300), b"{" * (hc.MAX_DATAGRAM + 1), b""]
    before, sent, rounds = sum(monitor.drops().values()), 0, 0
    end = time.monotonic() + 3.0
    while time.monotonic() < end:  # bounded: three seconds
        rounds += 1
        for i, sock in enumerate(sockets):  # each socket sends every kind in turn
            try:
                sock.sendto(junk[(rounds + i) % len(junk)], address)
                sent += 1
            except OSError:  # the kernel's buffer is full: the flood's own problem
                pass
    time.sleep(0.5)
    drops = monitor.drops()
    assert sum(drops.values()) - before > min(sent // 10, 1000), (sent, drops)
    assert drops["rate"] > 0 and drops["bad_mac"] > 0 and drops["oversize"] > 0 and drops["unsigned"] > 0, drops
    assert len(monitor.receiver._rate.buckets) <= hc.MAX_ORIGINS
    assert time.time() - monitor.workers[GENUINE]["seen_s"] < 2.0
    unharmed(monitor, foreign)
    # Detection is intact: a worker's crash, reported by the genuine sender, is an incident.
    sender.report("agent_loop:1", alive=False, detail="gone", pid=999_999)
    wait_for(lambda: monitor.logged() == 1)
    for sock in sockets:
        sock.close()


def test_the_monitor_binds_only_the_address_it_is_given():
    """Never every interface: a test's monitor on loopback listens on loopback alone."""
    from rlweave.config import Setting
    from rlweave.host import activate

    activate([Setting("resilience.enable", True, "test")], export_env=False)
    monitor = ResilienceMonitor("job-a", 0.05, host_ip=LOOPBACK)
    try:
        assert monitor.receiver._sock.getsockname()[0] == LOOPBACK
    finally:
        monitor.stop()
    # Its receiving thread sleeps in recvfrom without a timeout: stopping must wake it.
    for thread in monitor.threads:
        thread.join(timeout=2.0)
        assert not thread.is_alive(), thread.name


def test_every_byte_of_a_sealed_datagram_is_covered_by_its_mac():
    """Any change to a sealed datagram (its header, the job, sender and receiver ids, the body,
    the MAC itself) is refused before anything is parsed; and what a holder of the key could
    seal that is not a well-formed datagram (a short header, a time that is no number, a body
    that is no object) is refused as malformed, not read."""
    sender, monitor = Channel("job-a", b"k" * 32), Channel("job-a", b"k" * 32, hc.MONITOR)
    sealed = sender.seal(beat_body(GENUINE, os.getpid()))
    assert monitor.open(sealed).body["worker"] == GENUINE
    for i in range(len(hc.MAGIC), len(sealed)):
        tampered = bytearray(sealed)
        tampered[i] ^= 0x01
        with pytest.raises(hc.Rejected) as refused:
            monitor.open(bytes(tampered))
        assert refused.value.reason == "bad_mac", i

    def forged_by_a_key_holder(payload: bytes) -> bytes:
        return hc.MAGIC + monitor._mac(payload) + payload

    ids = b"job-a" + b"x" * 4 + hc.MONITOR.encode()
    header = hc.HEADER.pack(1, time.time(), 5, 4, len(hc.MONITOR))
    for payload in (header[:7], hc.HEADER.pack(1, float("nan"), 5, 4, len(hc.MONITOR)) + ids + b"{}",
                    header + ids + b"[]", header + ids + b"{"):
        with pytest.raises(hc.Rejected) as refused:
            monitor.open(forged_by_a_key_holder(payload))
        assert refused.value.reason == "malformed", payload
    assert monitor.open(forged_by_a_key_holder(header + ids + b"{}")).sender == "xxxx"


def test_the_chaos_tool_refuses_a_job_started_without_it(monkeypatch):
    """``rlweave chaos inject|status`` reads the job's contact from Ray's KV and refuses before
    sending anything when the job has no chaos tool; with it, it gets the job's channel."""
    import ray
    from ray.experimental import internal_kv

    from rlweave.adapters.verl import chaos
    from rlweave.adapters.verl.resilience_monitor import KV_PREFIX

    contact = {"address": "127.0.0.1:9", "key": os.urandom(32).hex(), "extensions": []}
    monkeypatch.setattr(ray, "is_initialized", lambda: True)
    monkeypatch.setattr(internal_kv, "_internal_kv_list", lambda prefix: [f"{KV_PREFIX}job-a".encode()])
    monkeypatch.setattr(internal_kv, "_internal_kv_get", lambda key: json.dumps(contact).encode())
    fix = r"without the chaos tool.*RLWEAVE_PLUGIN_MODULES=rlweave.benchmarks.resilience_chaos"
    with pytest.raises(SystemExit, match=fix):
        chaos.status()
    contact["extensions"] = ["chaos"]
    address, channel = chaos._monitor("auto")
    assert address == ("127.0.0.1", 9) and channel.job == "job-a" and channel.key_hex() == contact["key"]
