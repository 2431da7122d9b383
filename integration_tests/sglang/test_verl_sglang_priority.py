"""The verl_sglang_priority patch on the installed verl 0.9 and SGLang: import level only, since
SGLang cannot run on this CPU-only machine (see verl_priority_script.py for its two stand-ins)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from rlweave.patches import REQUEST_PRIORITY, PatchVersionError, apply_patches

SCRIPT = Path(__file__).with_name("verl_priority_script.py")
REQUEST = "sglang.srt.managers.io_struct.GenerateReqInput"


@pytest.fixture(scope="module")
def found() -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith("RLWEAVE")}
    proc = subprocess.run([sys.executable, str(SCRIPT)], env=env, capture_output=True, text=True,
                          timeout=240)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.mark.timeout(300)
def test_import_only_priority_reaches_sglangs_request_object(found):
    assert found["applied"] == ["verl_sglang_priority"]
    assert found["direct"] == [[REQUEST, 5], [REQUEST, None]]  # no priority: SGLang's default
    assert found["direct_tokens"] == [7, 8]
    assert found["via_client"] == [-2, None]  # verl's client no longer drops it for SGLang


@pytest.mark.timeout(300)
def test_import_only_ray_lets_the_priority_through_to_the_server_actor(found):
    assert not found["ray_accepts_priority_before"]
    assert found["ray_accepts_priority"] and found["ray_accepts_handoff"]
    assert found["still_coroutines"]  # Ray runs SGLangHttpServer as an async actor


@pytest.mark.timeout(300)
def test_import_only_priority_policy_turns_on_sglangs_priority_scheduling(found):
    flags = {"enable_priority_scheduling": True, "schedule_low_priority_values_first": True,
             "default_priority_value": 0}
    assert found["server_args_priority"] == flags
    assert found["sglang_server_args"] == [True, True, 0]  # SGLang's ServerArgs takes them
    assert found["server_args_user_wins"] == flags | {"schedule_low_priority_values_first": False}
    assert found["server_args_fcfs"] == {}


@pytest.mark.timeout(300)
def test_import_only_revert_restores_verls_functions(found):
    assert found["reverted"] and found["request_type_is_sglangs"]


def test_refuses_a_verl_version_it_was_not_written_for():
    with pytest.raises(PatchVersionError, match=r"'verl_sglang_priority'.*written for verl .*, not 0\.10\.0; "
                                                r"see .*verl_sglang_priority/upstream\.md"):
        apply_patches("verl", "0.10.0", REQUEST_PRIORITY)
