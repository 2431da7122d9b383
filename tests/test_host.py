from __future__ import annotations

import os
import sys
import types

import pluggy
import pytest

from rlweave.config import settings_from_overrides
from rlweave.host import activate, build_plugin_manager, get_host
from rlweave.hookspecs import hookimpl
from rlweave.types import Stage, StageContext


def test_disabled_host_registers_only_the_core():
    host = get_host()
    assert not host.active
    assert [name for name, _ in host.pm.list_name_plugin()] == ["rlweave.defaults"]


def test_activation_is_idempotent_and_exports_env(tmp_path):
    settings = settings_from_overrides(["+rlweave.tracing.enable=true", f"+rlweave.tracing.dir={tmp_path}"])
    first = activate(settings)
    assert first.active
    assert activate(settings) is first
    assert os.environ["RLWEAVE__TRACING__ENABLE"] == "true"


def test_wrapper_stage_hook_runs_the_stage_once(tmp_path):
    host = activate(settings_from_overrides(["+rlweave.tracing.enable=true", f"+rlweave.tracing.dir={tmp_path}"]))
    calls = []
    result = host.hook.rlweave_run_stage(context=StageContext(Stage.GENERATE, 1, "actor"),
                                         run=lambda: calls.append(1) or "out")
    assert result == "out" and calls == [1]


def test_firstresult_hook_returns_none_without_a_decider():
    host = get_host()
    assert host.hook.rlweave_schedule(waiting=[], running=[], engine=None) is None
    assert not host.implements("rlweave_schedule")


def test_misspelt_hookimpl_fails_loudly(monkeypatch):
    plugin = types.ModuleType("misspelt_plugin")

    @hookimpl
    def rlweave_engine_stpe(step):  # noqa: ANN001 - the typo is the test
        return None

    plugin.rlweave_engine_stpe = rlweave_engine_stpe
    monkeypatch.setitem(sys.modules, "misspelt_plugin", plugin)
    monkeypatch.setenv("RLWEAVE_PLUGIN_MODULES", "misspelt_plugin")
    with pytest.raises(pluggy.PluginValidationError, match="rlweave_engine_stpe"):
        build_plugin_manager(get_host().config)


def test_module_plugins_from_env_make_the_host_active(monkeypatch):
    plugin = types.ModuleType("deciding_plugin")

    @hookimpl
    def rlweave_request_priority(trajectory):  # noqa: ANN001
        return 7

    plugin.rlweave_request_priority = rlweave_request_priority
    monkeypatch.setitem(sys.modules, "deciding_plugin", plugin)
    monkeypatch.setenv("RLWEAVE_PLUGIN_MODULES", "deciding_plugin")
    host = activate()
    assert host.active and host.implements("rlweave_request_priority")
    assert host.hook.rlweave_request_priority(trajectory=None) == 7


def test_every_hook_is_prefixed_and_documented():
    pm = build_plugin_manager(get_host().config)
    names = [n for n in dir(pm.hook) if not n.startswith("_")]
    assert names and all(n.startswith("rlweave_") for n in names)
    for name in names:
        spec = getattr(pm.hook, name).spec
        assert spec.function.__doc__, f"{name} has no docstring"
