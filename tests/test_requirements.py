"""Plugins' framework requirements: unmet settings and conflicting plugins stop a run with one
message (rlweave.requirements)."""

from __future__ import annotations

import pytest

from rlweave.config import ConfigError, build_config, settings_from_mapping
from rlweave.host import build_plugin_manager
from rlweave.requirements import check_requirements, gathered, problems
from rlweave.types import SettingRequirement

MODE = SettingRequirement("trainer.mode", ("stream",), "sync", "it streams", "a")


def test_a_met_requirement_passes_and_an_unset_key_takes_the_default():
    assert problems([MODE], {"trainer.mode": "stream"}, "cli") == []
    [message] = problems([MODE], {}, "cli")
    assert message == ("trainer.mode=sync (the default), but rlweave.a needs trainer.mode in {stream} "
                       "(it streams); set trainer.mode=stream.")


def test_an_unknown_default_is_not_checked_when_unset():
    engine = SettingRequirement("rollout.name", ("vllm",), None, "priorities", "b")
    assert problems([engine], {}, "cli") == []
    assert "rollout.name=trtllm (from cli)" in problems([engine], {"rollout.name": "trtllm"}, "cli")[0]


def test_two_plugins_that_need_different_values_are_refused_together():
    other = SettingRequirement("trainer.mode", ("fused",), "sync", "it fuses", "c")
    with pytest.raises(ConfigError, match=r"these plugins cannot run together: rlweave.a needs .*rlweave.c needs"):
        check_requirements([MODE, other], {"trainer.mode": "stream"}, "cli")


def test_overlapping_requirements_accept_their_common_values():
    wide = SettingRequirement("trainer.mode", ("fused", "stream"), "sync", "either", "d")
    assert problems([MODE, wide], {"trainer.mode": "stream"}, "cli") == []
    assert "set trainer.mode=stream" in problems([MODE, wide], {}, "cli")[0]


def test_enabled_plugins_answer_for_verl_and_disabled_ones_say_nothing():
    config = build_config(settings_from_mapping(
        {"stream_generation": {"enable": True}, "agentic_rollout": {"enable": True}}, "test"))
    found = gathered(build_plugin_manager(config).hook.rlweave_framework_requirements(framework="verl"))
    assert {r.plugin for r in found} == {"stream_generation", "agentic_rollout"}
    none = gathered(build_plugin_manager(build_config([])).hook.rlweave_framework_requirements(framework="verl"))
    assert none == []
