"""rlweave from its wheel in an environment that already holds verl and vLLM (conftest's
``user_venv``): it is imported from there, and ``rlweave doctor`` tells a user what a job will
meet. verl's trainer runs from the same environment in test_verl_trainer_cpu.py (its traced run,
with a plugin on), so a user's install is the one CI trains with."""

from __future__ import annotations

import json

import pytest


@pytest.fixture(scope="module")
def doctor(user_venv) -> dict[str, list[dict[str, str]]]:
    done = user_venv.run("-m", "rlweave.cli", "doctor", "--json")
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def rows(doctor, title: str, **match: str) -> list[dict[str, str]]:
    table = next(t for name, t in doctor.items() if name.startswith(title))
    return [r for r in table if all(r[k] == v for k, v in match.items())]


@pytest.mark.timeout(600)
def test_the_wheel_is_what_imports(user_venv):
    done = user_venv.run("-c", "import rlweave.adapters.verl.cpu, rlweave; print(rlweave.__file__)")
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith(str(user_venv.root)), done.stdout


@pytest.mark.timeout(600)
def test_doctor_reports_frameworks_and_entry_points_of_this_environment_only(doctor, user_venv):
    (install,) = rows(doctor, "Frameworks", framework="rlweave")
    assert install["status"].startswith(f"installed in {user_venv.root}")
    assert install["environment"].endswith("(this interpreter)")  # no rig outside the checkout
    assert rows(doctor, "Frameworks", framework="verl")[0]["status"] == "supported"
    vllm = user_venv.run("-c", "import vllm; print(vllm.__version__)")
    assert vllm.returncode == 0, vllm.stderr
    (found,) = rows(doctor, "Frameworks", framework="vllm")  # this environment's vLLM, no other
    assert found["version"].split("+")[0] == vllm.stdout.split()[-1].split("+")[0]
    assert found["CI verifies it"] == "engine-tested"  # the release this group runs verl's trainer on
    loads = {r["group"]: r for r in rows(doctor, "Entry points")}
    assert loads["verl.plugins"]["entry point"] == "rlweave = rlweave.adapters.verl"
    assert loads["vllm.general_plugins"]["status"] == "found: vllm loads it"


@pytest.mark.timeout(600)
def test_doctor_says_which_plugins_work_with_this_verl_and_which_patches_apply(doctor):
    works = {r["plugin"]: r for r in rows(doctor, "Plugins with the verl found")}
    assert works["tracing"]["works"] == works["agentic_rollout"]["works"] == "yes"
    assert works["preemptive_serving"]["runs in"] == "vLLM engines"
    assert works["replay_balance"]["works"] == "REFUSES"  # no megatron-core in this environment
    assert "megatron-core" in works["replay_balance"]["why not / note"]
    assert rows(doctor, "Patches", patch="verl_gloo_backend")[0]["would apply to"] == "verl 0.9.1"
