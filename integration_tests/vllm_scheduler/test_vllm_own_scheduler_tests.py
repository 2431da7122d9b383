"""vLLM's own scheduler tests, run against rlweave's scheduler.

``vllm_upstream_tests/<version>`` holds each release's ``tests/v1/core/test_scheduler.py`` and
``test_async_scheduler.py`` with the helpers they import, as that release's source tarball has
them (its README says where from; Apache-2.0). They run in a pytest process of their own with
rlweave's subclasses in place of vLLM's ``Scheduler`` and ``AsyncScheduler`` and
``preemptive_serving`` on (``upstream_swap.py``). A test that fails there is run again on vLLM's
own scheduler: if it fails there too it cannot run on this machine (a model or processor it
downloads, a GPU-only path) and says nothing about rlweave; if it passes, it must be one of
:data:`DIFFER_BY_DESIGN`, the tests that assert vLLM's own order of admission or choice of a
request to preempt, which a scheduling plugin changes on purpose. Any other difference fails
here, and so does an entry of the list that no longer differs (the list stays true).
docs/vllm_upstream_scheduler_tests.md has the lists and the counts per release. The releases
between verl's pin and the newest pip installs beside verl (0.25-0.30) have none stored: the
runner runs the rest of the group there, without this file.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
UPSTREAM = HERE / "vllm_upstream_tests"
FILES = ("tests/v1/core/test_scheduler.py", "tests/v1/core/test_async_scheduler.py")

# Stand-ins for the Hugging Face models the upstream tests name, so that nothing is downloaded:
# each a config.json (no weights, no tokenizer) under the harness's stand-in architecture, with
# the real model's sizes where vLLM's config reads them. Tests that name other models (LLaVA and
# its processor, Qwen3-Next) fail on vLLM's own scheduler too, and so are not judged.
_LLAMA_LIKE = dict(architectures=["RlweaveSchedulerOnlyForCausalLM"], rms_norm_eps=1e-6)
STAND_INS = {
    "facebook/opt-125m": dict(_LLAMA_LIKE, model_type="opt", hidden_size=768, ffn_dim=3072,
                              num_attention_heads=12, num_hidden_layers=12, vocab_size=50272,
                              max_position_embeddings=2048, torch_dtype="float16",
                              word_embed_proj_dim=768, bos_token_id=2, eos_token_id=2),
    "Qwen/Qwen3-0.6B": dict(_LLAMA_LIKE, model_type="qwen3", hidden_size=1024,
                            intermediate_size=3072, num_attention_heads=16, num_key_value_heads=8,
                            head_dim=128, num_hidden_layers=28, vocab_size=151936,
                            max_position_embeddings=40960, torch_dtype="bfloat16",
                            bos_token_id=151643, eos_token_id=151645),
}

# Upstream tests (by function name) that fail on rlweave's scheduler with preemptive_serving on,
# and pass on vLLM's own, per release series: why each differs by design.
ARRIVAL_ORDER = (
    "asserts that among equal priorities vLLM admits (or keeps running) the request with the "
    "earliest Request.arrival_time; preemptive_serving keeps priority first but orders equal "
    "priorities by its own MLFQ queues (when each request reached the scheduler, and its "
    "expected length), so the order differs on purpose")
NO_INIT = (
    "builds the scheduler with object.__new__, skipping __init__, and sets vLLM's own "
    "attributes by hand: a subclass whose __init__ keeps state of its own (rlweave's keeps its "
    "per-iteration bookkeeping) cannot run there; a test artefact, not a scheduling difference")
_COMMON = {
    "test_priority_scheduling_arrival_time_tiebreaker": ARRIVAL_ORDER,
    "test_priority_scheduling_equal_priority_preemption": ARRIVAL_ORDER,
    "test_priority_scheduling_fcfs_fallback": ARRIVAL_ORDER,
    "test_priority_scheduling_mixed_priority_and_arrival": ARRIVAL_ORDER,
    "test_abort_request_when_structured_output_fsm_cannot_advance": NO_INIT,
}
SAME_DECISIONS_TWICE = (
    "asserts that two runs of one seeded workload (prefix caching off, then on) admit requests "
    "step for step alike; preemptive_serving's MLFQ decides from measured time (each request's "
    "service so far), so two runs of the same workload are not step-for-step identical")
DIFFER_BY_DESIGN: dict[str, dict[str, str]] = {
    "0.24": _COMMON,
    "0.31": _COMMON,
    "0.32": _COMMON,
    "0.33": _COMMON,
    "0.34": _COMMON | {"test_cached_reservations_admit_like_on_demand_sum": SAME_DECISIONS_TWICE},
}
MIN_PASSED = 60  # fewer rlweave schedulers built than this means the swap did not take
# Upstream tests that pass on rlweave's scheduler per release, as counted when its files were
# stored (docs/vllm_upstream_scheduler_tests.md): fewer means a release's tests stopped passing
# (or stopped being collected), whatever the reason, and fails here.
PASSED: dict[str, int] = {"0.24.0": 81, "0.31.0": 159, "0.32.0": 170, "0.33.0": 223, "0.34.0": 238}


def function_name(test_id: str) -> str:
    """``test_schedule[True-5]`` -> ``test_schedule``."""
    return test_id.split("[", 1)[0]


def outcomes(junit: Path) -> dict[str, str]:
    """Test id (``file.py::name[params]``) -> passed, failed or skipped, from a JUnit report."""
    found = {}
    for case in ET.parse(junit).iter("testcase"):
        module = case.get("classname", "").rsplit(".", 1)[-1]
        kinds = {child.tag for child in case}
        outcome = ("failed" if kinds & {"failure", "error"} else
                   "skipped" if "skipped" in kinds else "passed")
        found[f"{module}.py::{case.get('name')}"] = outcome
    return found


def run_upstream(version: str, mode: str, workdir: Path, only: list[str] | None = None) -> dict[str, str]:
    """One pytest process over the release's upstream files (or the ``only`` ids), on vLLM's
    scheduler (``mode="vllm"``) or rlweave's (``"rlweave"``); outcomes per test id."""
    root = UPSTREAM / version
    junit = workdir / f"{mode}.xml"
    env = {k: v for k, v in os.environ.items() if not k.startswith("RLWEAVE__")}
    env.update(
        HF_HUB_OFFLINE="1",
        PYTHONPATH=os.pathsep.join(filter(None, (str(HERE), env.get("PYTHONPATH")))),
        RLWEAVE_UPSTREAM_SCHEDULER=mode,
        RLWEAVE_UPSTREAM_REPORT=str(workdir / f"{mode}.json"),
    )
    if mode == "rlweave":
        env.update(RLWEAVE__PREEMPTIVE_SERVING__ENABLE="true",
                   RLWEAVE__PREEMPTIVE_SERVING__POLICY="skip_join_mlfq")
    targets = [str(root / f) for f in FILES] if only is None else [
        str(root / "tests/v1/core" / t) for t in only]
    command = [sys.executable, "-m", "pytest", *targets, "-q", "-p", "no:cacheprovider",
               "-p", "upstream_swap", "--rootdir", str(root), "-o", "addopts=", "-W", "ignore",
               "--tb=line", f"--junitxml={junit}"]
    with open(workdir / f"{mode}.log", "w") as log:
        done = subprocess.run(command, cwd=workdir, env=env, stdout=log, stderr=subprocess.STDOUT,
                              timeout=240)
    assert done.returncode in (0, 1), f"the upstream run ended with {done.returncode}: see {log.name}"
    return outcomes(junit)


@pytest.mark.timeout(600)
def test_vllms_own_scheduler_tests_pass_on_rlweaves_but_for_the_named_ones(
        vllm_version, series, tmp_path):
    version = vllm_version.split("+")[0]
    assert (UPSTREAM / version).is_dir(), f"no upstream tests stored for vLLM {version}"
    for name, config in STAND_INS.items():
        (tmp_path / name).mkdir(parents=True)
        (tmp_path / name / "config.json").write_text(json.dumps(config))
    ours = run_upstream(version, "rlweave", tmp_path)
    built = json.loads((tmp_path / "rlweave.json").read_text())["rlweave_schedulers_built"]
    failed = sorted(t for t, o in ours.items() if o == "failed")
    theirs = run_upstream(version, "vllm", tmp_path, only=failed) if failed else {}
    cannot_run_here = {t for t in failed if theirs.get(t) == "failed"}
    differ = {t for t in failed if t not in cannot_run_here}
    expected = DIFFER_BY_DESIGN[series]
    passed = sum(o == "passed" for o in ours.values())
    print(f"vLLM {version}: {len(ours)} upstream tests; on rlweave's scheduler {passed} passed, "
          f"{len(differ)} differ by design, {len(cannot_run_here)} cannot run here; "
          f"{built} rlweave schedulers built")
    assert built > MIN_PASSED, "rlweave's scheduler was not the one the upstream tests built"
    assert passed >= PASSED[version], (
        f"{passed} upstream tests passed on rlweave's scheduler, {PASSED[version]} when they were stored: "
        f"see {tmp_path}/rlweave.log")
    unexplained = sorted(t for t in differ if function_name(t.split("::")[1]) not in expected)
    assert not unexplained, (
        f"upstream tests that pass on vLLM's scheduler and fail on rlweave's, with no reason "
        f"in DIFFER_BY_DESIGN[{series!r}]: {unexplained} (see {tmp_path}/rlweave.log)")
    stale = sorted(set(expected) - {function_name(t.split("::")[1]) for t in differ})
    assert not stale, f"DIFFER_BY_DESIGN[{series!r}] names tests that no longer differ: {stale}"
