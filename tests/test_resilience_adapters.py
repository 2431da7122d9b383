"""The framework-free parts of resilience's adapters: heartbeats over UDP (sealed with the job's
key), verl's worker names, the two-stage checkpoint's files (persist, verify, stage, corrupt) and
the heat-map. The attacks on the channel are in test_resilience_security.py."""

from __future__ import annotations

import json
import time
import zlib
from pathlib import Path

import pytest

from rlweave.adapters import heartbeat
from rlweave.adapters.heartbeat_channel import Channel
from rlweave.adapters.verl import checkpoints as ckpt
from rlweave.adapters.verl.resilience import worker_name
from rlweave.plugins.resilience.heatmap import section_ratios, write_straggler_heatmap
from rlweave.plugins.resilience.monitor import HealthMonitor
from rlweave.types import Health, Heartbeat


def receive_until(receiver: heartbeat.HeartbeatReceiver, wanted, timeout_s: float = 5.0) -> heartbeat.Received:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        got = receiver.receive()
        if got is not None and wanted(got.message):
            return got
    raise AssertionError("no such beat arrived")


def pair(worker: str, interval_s: float) -> tuple[heartbeat.HeartbeatReceiver, heartbeat.HeartbeatSender]:
    """A monitor's receiver and a worker's sender on one job's channel (loopback)."""
    channel = Channel.new("job")
    receiver = heartbeat.HeartbeatReceiver("127.0.0.1", channel)
    return receiver, heartbeat.HeartbeatSender(heartbeat.parse_address(receiver.address), worker, interval_s,
                                               channel.peer())


def test_a_sender_beats_its_sections_and_takes_the_monitors_instructions():
    receiver, sender = pair("trainer:1", 0.05)
    try:
        with sender.section("update_actor", step=3):
            receive_until(receiver, lambda m: m["section"] == "update_actor")
        got = receive_until(receiver, lambda m: m["finished"])
        message = got.message
        [done] = message["finished"]
        assert (message["worker"], done["section"], done["step"]) == ("trainer:1", "update_actor", 3)
        assert done["duration_s"] > 0 and message["pid"] > 0
        answers: list[dict] = []
        sender.answer_listeners.append(answers.append)
        receiver.reply(got, {"slow": 3.0})
        deadline = time.monotonic() + 5
        while not answers and time.monotonic() < deadline:
            time.sleep(0.02)
        assert [a["slow"] for a in answers] == [3.0]
        with sender.activity("generate"), sender.activity("generate"):
            receive_until(receiver, lambda m: m["section"] == "generate")
        sender.count("requests_resubmitted", 2)  # beats at once
        got = receive_until(receiver, lambda m: m["counters"])
        assert got.message["counters"] == {"requests_resubmitted": 2}
        sender.report("rollout:0/engine", alive=False, detail="gone", pid=7)
        got = receive_until(receiver, lambda m: m["reports"])
        assert got.message["reports"][0]["worker"] == "rollout:0/engine"
        assert receiver.dropped() == 0 and sender.dropped == 0
    finally:
        sender.stop()
        receiver.close()


def test_a_beat_sent_for_an_event_defers_the_periodic_one():
    """Beats are for silence: one a section or a step sent makes the next periodic one wait a
    whole interval (a loaded machine can only make it later). The gap is the sender's own (each
    datagram carries when it was sealed), not when the receiver got to read them."""
    receiver, sender = pair("trainer:0", 0.4)
    try:
        receive_until(receiver, lambda m: True)  # the first periodic beat
        time.sleep(0.2)
        sender.set_step(5)
        event = receive_until(receiver, lambda m: m["step"] == 5)
        periodic = receive_until(receiver, lambda m: True)
        assert periodic.message["seq"] == event.message["seq"] + 1
        assert periodic.sent_s - event.sent_s > 0.35
    finally:
        sender.stop()
        receiver.close()


def test_an_instruction_reaches_a_sender_between_its_beats():
    """The sender's thread sleeps on its socket, so the monitor's answer is read as it arrives,
    not at the next beat: with a 60 s interval, the answer is taken while the first beat is
    still the only one sent (order and counts, not a wall-clock bound)."""
    receiver, sender = pair("trainer:0", 60.0)
    try:
        answers: list[dict] = []
        sender.answer_listeners.append(answers.append)
        got = receive_until(receiver, lambda m: m["worker"] == "trainer:0")
        receiver.reply(got, {"slow": 2.0})
        deadline = time.monotonic() + 30
        while not answers and time.monotonic() < deadline:
            time.sleep(0.005)
        assert [a["slow"] for a in answers] == [2.0] and sender.seq == 1
    finally:
        sender.stop()
        receiver.close()


def test_the_slow_fault_lives_in_the_chaos_tool_and_holds_a_rank_s_sections():
    """The ``slow`` fault's worker side is the chaos tool's (a production sender has no notion of
    it): the factor the monitor answers with holds each timed section open so that it takes that
    many times as long; before any answer, and in a job without the tool, nothing is held."""
    from rlweave.benchmarks.resilience_chaos import worker_extension

    receiver, sender = pair("trainer:1", 0.05)
    try:
        slow = worker_extension(sender)
        assert slow.hold_s("update_actor", 0.4) == 0.0
        got = receive_until(receiver, lambda m: True)
        receiver.reply(got, {"slow": 3.0})
        deadline = time.monotonic() + 5
        while slow.factor != 3.0 and time.monotonic() < deadline:
            time.sleep(0.02)
        assert slow.hold_s("update_actor", 0.4) == pytest.approx(0.8)
    finally:
        sender.stop()
        receiver.close()


def test_the_monitor_queues_what_it_finds_typed_and_answers_the_chaos_tool():
    """The monitor runs as threads of the trainer's process and only detects: each incident is
    queued once, typed; what monitoring cost is counted; and ``rlweave chaos`` reaches the
    chaos extension of a job that registered it, over the job's channel."""
    from rlweave.adapters.verl.chaos import ask
    from rlweave.benchmarks.resilience_chaos import FaultInjector
    from rlweave.adapters.verl.resilience_monitor import ResilienceMonitor
    from rlweave.config import Setting
    from rlweave.host import activate

    activate([Setting("resilience.enable", True, "test")], export_env=False)
    monitor = ResilienceMonitor("job", 0.05, host_ip="127.0.0.1", extensions=[lambda m: FaultInjector(m, [])])
    address = heartbeat.parse_address(monitor.address())
    sender = heartbeat.HeartbeatSender(address, "agent_loop:0", 0.05, monitor.sender_channel())
    try:
        sender.report("agent_loop:1", alive=False, detail="gone", pid=999_999)
        incident = monitor.incidents.get(timeout=5)
        assert (incident.worker, incident.kind, incident.detail) == ("agent_loop:1", Health.DEAD, "gone")
        time.sleep(0.2)  # a few checks more: reported once
        assert monitor.incidents.empty() and monitor.logged() == 1
        tool = monitor.sender_channel()
        fault = {"action": "kill", "worker": "trainer:0", "step": 9}
        assert ask(address, tool, {"request": "chaos", "chaos": "inject", "fault": fault})
        status = ask(address, tool, {"request": "chaos", "chaos": "status"})
        assert set(status["workers"]) == {"agent_loop:0"} and len(status["incidents"]) == 1
        assert status["faults"] == [] and monitor.extensions["chaos"].faults[-1].worker == "trainer:0"
        assert monitor.dropped() == 0
        costs = monitor.costs()
        assert costs["monitor"] > 0 and costs["heartbeats"] > 0
    finally:
        sender.stop()
        monitor.stop()


def test_the_exit_watch_reports_a_process_as_it_ends_and_sleeps_until_then():
    """A crash is seen when the kernel ends the process (a zombie counts), not at the next
    check; a worker no longer watched has its pidfd closed."""
    import subprocess
    import sys

    from rlweave.adapters.verl.resilience_monitor import ExitWatch

    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    watch = ExitWatch()
    try:
        assert watch.update({("trainer:0", child.pid), ("trainer:1", sleeper.pid)}) == []
        assert watch.wait(0.05) == []
        child.kill()  # not reaped: a zombie until wait() below
        start = time.monotonic()
        assert watch.wait(60.0) == [(("trainer:0", child.pid), "process exited")]
        assert time.monotonic() - start < 30.0  # woken by the exit, not the timeout: no load takes 30 s
        assert watch.update({("trainer:1", sleeper.pid)}) == []  # the ended one is not watched again
        assert watch.update(set()) == [] and watch.fds == {}
        child.wait()
        assert watch.update({("trainer:0", child.pid)}) == [(("trainer:0", child.pid), "process exited")]
    finally:
        watch.close()
        for p in (child, sleeper):
            p.kill()
            p.wait()


def _fake_job(rank: str):
    """A driver, its raylet and a trainer rank under it, as ``main_ppo`` starts them (titles by
    ``exec -a``): returns the driver and the rank's pid."""
    import subprocess

    rank_cmd = f"RANK={rank} exec -a ray::WorkerDict.actor_rollout_update_actor sleep 60"
    driver = subprocess.Popen(["bash", "-c", f"(exec -a /opt/ray/raylet/raylet bash -c '{rank_cmd} & wait') & wait"])
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        import psutil

        found = [p for p in psutil.Process(driver.pid).children(recursive=True) if p.name() == "sleep"]
        if found and found[0].cmdline()[0].startswith("ray::WorkerDict"):
            return driver, found[0].pid
        time.sleep(0.05)
    raise AssertionError("the fake job did not start")


def test_the_chaos_tool_finds_a_rank_in_its_job_and_refuses_to_guess_between_jobs():
    from rlweave.adapters.verl.chaos import find_processes

    jobs = [_fake_job("1"), _fake_job("1")]
    try:
        # At least these two jobs: a real verl job elsewhere on the machine may add its own.
        with pytest.raises(SystemExit, match=r"trainer:1 is in \d+ jobs .* --job PID") as refused:
            find_processes("trainer:1")
        assert all(str(rank) in str(refused.value) for _, rank in jobs)
        for driver, rank in jobs:
            assert [p.pid for p in find_processes("trainer:1", job=driver.pid)] == [rank]
        assert find_processes("trainer:0", job=jobs[0][0].pid) == []
    finally:
        for driver, _ in jobs:
            import psutil

            for child in psutil.Process(driver.pid).children(recursive=True):
                child.kill()
            driver.kill()
            driver.wait()


def test_a_sender_counts_the_cpu_its_beats_cost_and_reports_it_in_each_beat():
    """What monitoring costs is measured where it is spent, so the trainer can report it."""
    receiver, sender = pair("trainer:0", 30.0)
    try:
        receive_until(receiver, lambda m: m["seq"] == 1)
        for _ in range(50):  # (few enough for the receiver's socket buffer)
            sender.beat_now()
        assert sender.cpu_s > 0
        got = receive_until(receiver, lambda m: m["seq"] == 51)
        assert 0 < got.message["cpu_s"] <= sender.cpu_s
    finally:
        sender.stop()
        receiver.close()


@pytest.mark.parametrize(("actor", "env", "expected"), [
    ("a1b2c3WorkerDict_0:1", {"RANK": "1"}, "trainer:1"),
    ("vllm_server_2_0", {}, "rollout:2"),
    ("vllm_server_0_1", {}, "rollout:0/node1"),
    ("agent_loop_worker_0_ab12cd34", {}, "agent_loop:0"),
    ("reward_loop_worker_3", {}, "reward:3"),
    ("TransferQueueController", {}, None),
])
def test_verl_actor_names_say_which_worker_a_process_is(actor, env, expected):
    assert worker_name(actor, env) == expected


def test_a_retired_worker_is_forgotten_and_a_new_pid_starts_afresh():
    monitor = HealthMonitor()
    monitor.observe(Heartbeat("trainer:0", 1.0, pid=10))
    monitor.observe(Heartbeat("trainer:0", 1.5, pid=10, retired=True))
    monitor.observe(Heartbeat("trainer:0", 1.6, pid=10, alive=False))  # its exit: no incident
    assert monitor.check(100.0) == []
    monitor.observe(Heartbeat("trainer:1", 2.0, pid=11))
    monitor.observe(Heartbeat("trainer:1", 3.0, pid=12))  # rebuilt: a new process
    monitor.observe(Heartbeat("trainer:1", 3.1, pid=11, alive=False))  # the old one's exit
    assert monitor.check(3.2) == []
    monitor.observe(Heartbeat("trainer:1", 3.3, pid=12, alive=False))
    assert [i.kind for i in monitor.check(3.4)] == [Health.DEAD]


def snapshot(folder: Path, ranks: int = 2) -> None:
    for rank in range(ranks):
        for kind in ("model", "optim", "extra_state"):
            path = folder / "actor" / f"{kind}_world_size_{ranks}_rank_{rank}.pt"
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(bytes([rank]) * (1000 + rank))
    (folder / "actor" / "huggingface").mkdir()
    (folder / "actor" / "huggingface" / "config.json").write_text("{}")


def persist(tmp_path: Path, step: int, keep: int | None = None) -> Path:
    source, root = tmp_path / "shm" / f"global_step_{step}", tmp_path / "ckpt"
    snapshot(source)
    partial = root / f"global_step_{step}{ckpt.PARTIAL}"
    host = ckpt.SnapshotHost()
    files = {**host.persist(str(source), str(partial), [0]), **host.persist(str(source), str(partial), [1])}
    return ckpt.finish_persist(root, step, files, b"dataloader", world_size=2, keep=keep)


def test_stage_two_writes_verls_layout_atomically_with_a_manifest(tmp_path):
    final = persist(tmp_path, 2)
    root = tmp_path / "ckpt"
    assert final == root / "global_step_2" and (root / ckpt.TRACKER).read_text() == "2"
    assert not list(root.glob(f"*{ckpt.PARTIAL}"))
    manifest = json.loads((final / ckpt.MANIFEST).read_text())
    assert set(manifest["files"]) == {"data.pt", "actor/huggingface/config.json"} | {
        f"actor/{k}_world_size_2_rank_{r}.pt" for k in ("model", "optim", "extra_state") for r in (0, 1)}
    assert ckpt.quick_problems(final, manifest) == []
    persist(tmp_path, 4, keep=1)
    assert ckpt.persisted_steps(root) == [4] and (root / ckpt.TRACKER).read_text() == "4"


@pytest.mark.parametrize(("how", "says"), [("flip", "checksum differs"), ("truncate", "cut short"),
                                            ("delete", "missing")])
def test_a_damaged_checkpoint_is_found_while_staging_it(tmp_path, how, says):
    final = persist(tmp_path, 2)
    assert how in ckpt.corrupt(final, how)
    manifest = ckpt.read_manifest(final)
    problems = ckpt.SnapshotHost().stage(str(final), str(tmp_path / "staged"), manifest["files"], None)
    assert len(problems) == 1 and says in problems[0]
    if how != "flip":  # size or presence: visible without reading
        assert ckpt.quick_problems(final, manifest)


def test_staging_a_good_checkpoint_copies_each_nodes_share(tmp_path):
    final = persist(tmp_path, 2)
    files = ckpt.read_manifest(final)["files"]
    host = ckpt.SnapshotHost()
    assert host.stage(str(final), str(tmp_path / "node1"), files, [1]) == []
    copied = {str(p.relative_to(tmp_path / "node1")) for p in (tmp_path / "node1").rglob("*") if p.is_file()}
    assert copied == {f"actor/{k}_world_size_2_rank_1.pt" for k in ("model", "optim", "extra_state")}


def test_the_callers_node_has_its_snapshot_host_in_process_and_each_node_answers_in_order(tmp_path):
    """No Ray actor (and its idle CPU) for the trainer's own node: ``start_hosts`` gives that
    node a plain object, and ``on_each_host`` calls it directly."""
    final = persist(tmp_path, 2)
    files = ckpt.read_manifest(final)["files"]
    [here] = ckpt.start_hosts({"node-a": [0, 1]}, here="node-a").values()
    assert isinstance(here, ckpt.SnapshotHost)
    hosts = {"a": here, "b": ckpt.SnapshotHost()}
    answers = ckpt.on_each_host(hosts, "stage", lambda node: (str(final), str(tmp_path / node), files,
                                                              [0] if node == "a" else [1]))
    assert answers == [[], []]
    assert {p.name for p in (tmp_path / "b").rglob("*.pt")} == {
        f"{k}_world_size_2_rank_1.pt" for k in ("model", "optim", "extra_state")}


def test_heatmap_shows_the_slow_rank(tmp_path):
    events = [{"ph": "X", "name": "update_actor", "worker": f"trainer:{rank}", "dur": d * 1e6, "ts": 0,
               "args": {"section": True, "step": step}}
              for step in range(3) for rank, d in enumerate((0.2, 0.2, 0.6))]
    workers, sections, ratios, _ = section_ratios(events)
    assert workers == ["trainer:0", "trainer:1", "trainer:2"] and sections == ["update_actor"]
    assert [round(r[0], 2) for r in ratios] == [1.0, 1.0, 3.0]
    assert write_straggler_heatmap(events, tmp_path / "heat.png", "test").stat().st_size > 1000


def test_the_ledger_counts_distinct_samples_and_those_trained_twice():
    """"No sample lost or trained twice" rests on distinct keys: a sample met twice in the
    trained batch is one sample and one duplicate, never two samples making up for a lost one."""
    from types import SimpleNamespace

    from rlweave.adapters.verl.resilient_trainer import Resilience

    ledger = SimpleNamespace(submitted={"a": "3", "b": "7"})
    keys = ["a_0", "a_1", "b_0", "b_0", "pad_0"]  # b_1 lost, b_0 twice
    tags = [{}, {}, {}, {}, {"is_padding": True}]
    figures = Resilience.ledger(ledger, SimpleNamespace(keys=keys, tags=tags))
    assert (figures["samples"], figures["duplicate_samples"]) == (3.0, 1.0)
    assert (figures["lost_groups"], figures["extra_groups"]) == (0.0, 0.0)
    assert figures["prompts_digest"] == float(zlib.crc32(b"3,7"))
