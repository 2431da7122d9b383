from __future__ import annotations

import os
import sys
import types

import pluggy
import pytest

from rlweave.config import settings_from_overrides
from rlweave.host import activate, build_plugin_manager, get_host, hot_caller
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


def _plugins_host(monkeypatch, *functions):  # noqa: ANN001, ANN202
    """A host with each of ``functions`` registered as its own plugin module, in order."""
    names = []
    for i, function in enumerate(functions):
        module = types.ModuleType(f"hot_plugin_{i}")
        setattr(module, function.__name__, function)
        monkeypatch.setitem(sys.modules, module.__name__, module)
        names.append(module.__name__)
    monkeypatch.setenv("RLWEAVE_PLUGIN_MODULES", ",".join(names))
    return activate()


def test_hot_caller_calls_plain_implementations_as_pluggy_would(monkeypatch):
    seen = []

    @hookimpl
    def rlweave_schedule(waiting, running, engine):  # noqa: ANN001, ANN202
        seen.append(("first registered", waiting, running, engine))
        return "first registered's decision"

    def second(running):  # names one of the three arguments  # noqa: ANN001, ANN202
        seen.append(("second registered", running))
        return None  # passes: the next implementation decides

    second.__name__ = "rlweave_schedule"
    host = _plugins_host(monkeypatch, rlweave_schedule, hookimpl(second))
    expected = host.hook.rlweave_schedule(waiting="w", running="r", engine="e")
    pluggy_calls, seen[:] = list(seen), []
    assert hot_caller(host.hook.rlweave_schedule)("w", "r", "e") == expected == "first registered's decision"
    assert seen == pluggy_calls == [("second registered", "r"), ("first registered", "w", "r", "e")]


def test_hot_caller_of_a_hook_whose_results_nobody_reads_returns_none(monkeypatch):
    steps = []

    @hookimpl
    def rlweave_engine_step(step):  # noqa: ANN001, ANN202
        steps.append(step)
        return "ignored"

    host = _plugins_host(monkeypatch, rlweave_engine_step)
    assert hot_caller(host.hook.rlweave_engine_step)("a step") is None and steps == ["a step"]
    assert hot_caller(host.hook.rlweave_request_arrived)("nobody listens") is None


def test_hot_caller_keeps_pluggys_call_where_a_wrapper_listens(monkeypatch):
    order = []

    @hookimpl(wrapper=True)
    def rlweave_schedule(waiting, running, engine):  # noqa: ANN001, ANN202
        order.append("wrapper before")
        decision = yield
        order.append("wrapper after")
        return f"wrapped {decision}"

    host = _plugins_host(monkeypatch, rlweave_schedule)
    assert hot_caller(host.hook.rlweave_schedule)("w", "r", "e") == "wrapped None"
    assert order == ["wrapper before", "wrapper after"]
