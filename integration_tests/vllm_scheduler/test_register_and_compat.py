"""The way a real engine meets rlweave, on each supported vLLM release: vLLM's own plugin
loader calls ``register()``, which passes the version gate and applies the patches, and the
config then picks rlweave's scheduler, which serves a preemptive workload to the end; a release
outside the range is refused; and verl 0.9's ``pause_generation`` call fits every release."""

from __future__ import annotations

import asyncio
import inspect
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

HERE = Path(__file__).parent


def _through_vllms_plugin_loader(model: str) -> None:
    """Run in a fresh process (``python THIS_FILE MODEL``) with preemptive_serving enabled:
    what vLLM's EngineCore does before it builds its scheduler. Prints a JSON report."""
    from harness import Run, build_scheduler, drain, make_request
    from vllm.plugins import load_general_plugins

    from rlweave.patches import _applied

    load_general_plugins()
    scheduler = build_scheduler(None, Path(model), num_blocks=128, max_num_seqs=2)
    free = scheduler.kv_cache_manager.block_pool.get_num_free_blocks()
    run = Run()
    for i, (prompt, tokens) in enumerate([(40, 24), (8, 6), (24, 16), (16, 4), (56, 20), (8, 10)]):
        scheduler.add_request(make_request(f"r{i}", prompt, tokens))
    drain(scheduler, run, compute_s_per_token=2e-4)
    print(json.dumps(dict(
        cls=type(scheduler).__name__, patches=sorted(_applied),
        tokens={rid: len(t) for rid, t in run.tokens.items()}, finished=run.finished,
        resumed=run.runner.resumed, blocks_back=scheduler.kv_cache_manager.block_pool.get_num_free_blocks() == free)))


@pytest.mark.timeout(180)
def test_vllms_plugin_loader_registers_rlweave_whose_scheduler_serves_to_the_end(vllm_version, model):
    env = {k: v for k, v in os.environ.items() if not k.startswith("RLWEAVE")}
    env |= dict(RLWEAVE__PREEMPTIVE_SERVING__ENABLE="true", RLWEAVE__PREEMPTIVE_SERVING__POLICY="skip_join_mlfq",
                PYTHONPATH=os.pathsep.join(filter(None, (str(HERE), env.get("PYTHONPATH")))))
    env.pop("VLLM_PLUGINS", None)
    proc = subprocess.run([sys.executable, __file__, str(model)], env=env, capture_output=True, text=True,
                          timeout=170)
    assert proc.returncode == 0, proc.stderr[-4000:]
    report = json.loads(proc.stdout.strip().splitlines()[-1])
    assert report["cls"] in ("RlweaveScheduler", "RlweaveAsyncScheduler")
    assert "vllm_scheduler_cls" in report["patches"] and "vllm_pause_generation_compat" in report["patches"]
    assert report["tokens"] == {"r0": 24, "r1": 6, "r2": 16, "r3": 4, "r4": 20, "r5": 10}
    assert sorted(report["finished"]) == sorted(report["tokens"])
    assert report["blocks_back"]
    if report["cls"] == "RlweaveScheduler":
        assert report["resumed"] and all(had == back for _, had, back in report["resumed"])


def test_version_gate_refuses_a_vllm_outside_the_range(vllm_version, host, monkeypatch):
    from rlweave.adapters import vllm as adapter
    from rlweave.frameworks import FRAMEWORKS, require_supported

    assert require_supported("vllm") == vllm_version
    monkeypatch.setenv("RLWEAVE__PREEMPTIVE_SERVING__ENABLE", "true")
    monkeypatch.setattr(adapter, "_registered", False)
    monkeypatch.setattr(type(FRAMEWORKS["vllm"]), "find_version", lambda self, paths=None: "0.23.1")
    with pytest.raises(SystemExit, match=r"^rlweave: vllm 0.23.1 is not supported by rlweave \(supported: >=0.24.0,<0.35\)"):
        adapter.register()


VERL_CALL = dict(wait_for_inflight_requests=False, clear_cache=True)  # verl 0.9.1's abort path


def test_pause_generation_compat_makes_verls_call_fit(vllm_version, series, monkeypatch):
    from vllm.v1.engine.async_llm import AsyncLLM

    from rlweave.patches import PLUGINS, VERL_CPU, patches_for
    from rlweave.patches.vllm_pause_generation_compat import apply

    assert {"vllm_pause_generation_compat"} <= {p.name for p in patches_for("vllm", PLUGINS)} & {
        p.name for p in patches_for("vllm", VERL_CPU)}
    real = AsyncLLM.pause_generation
    received: list[dict] = []

    async def engine_side(self, *args, **kwargs):  # type: ignore[no-untyped-def]
        inspect.signature(real).bind(self, *args, **kwargs)  # the TypeError vLLM would raise
        received.append(kwargs)

    engine_side.__signature__ = inspect.signature(real)  # type: ignore[attr-defined]
    monkeypatch.setattr(AsyncLLM, "pause_generation", engine_side)
    needs_it = "wait_for_inflight_requests" not in inspect.signature(real).parameters
    assert needs_it == (series >= "0.32")
    call = lambda: asyncio.run(AsyncLLM.pause_generation(object.__new__(AsyncLLM), **VERL_CALL))  # noqa: E731
    if needs_it:
        with pytest.raises(TypeError, match="wait_for_inflight_requests"):
            call()
    revert = apply()
    try:
        call()
    finally:
        revert()
    assert received[-1] == ({"mode": "abort", "clear_cache": True} if needs_it else VERL_CALL)
    assert AsyncLLM.pause_generation is engine_side


if __name__ == "__main__":
    _through_vllms_plugin_loader(sys.argv[1])
