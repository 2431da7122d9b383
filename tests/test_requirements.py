"""Plugins' framework requirements: unmet settings and conflicting plugins stop a run with one
message (rlweave.requirements)."""

from __future__ import annotations

import pytest

from rlweave.config import ConfigError, build_config, settings_from_mapping
from rlweave.adapters.verl_needs import verl_requirements
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
    found = verl_requirements(gathered(build_plugin_manager(config).hook.rlweave_needs()))
    assert {r.plugin for r in found} == {"stream_generation", "agentic_rollout"}
    none = gathered(build_plugin_manager(build_config([])).hook.rlweave_needs())
    assert none == []


def test_every_need_has_verl_settings_and_no_plugin_names_a_verl_key():
    """The verl adapter maps every need; the plugins' modules carry no verl key."""
    from pathlib import Path

    from rlweave.adapters.verl_needs import VERL_SETTINGS
    from rlweave.types import Need

    assert set(VERL_SETTINGS) == set(Need)
    keys = {s.key.split(".")[0] for settings in VERL_SETTINGS.values() for s in settings} - {"rlweave"}
    plugins = Path(__file__).resolve().parents[1] / "plugins"
    for module in plugins.rglob("*.py"):
        text = module.read_text()
        for key in keys:
            assert f'"{key}.' not in text and f"'{key}." not in text, f"{module} names the verl key {key}.*"


def test_two_plugins_needing_one_verl_key_differently_are_refused_naming_both():
    config = build_config(settings_from_mapping(
        {"resilience": {"enable": True}, "stage_fusion": {"enable": True}}, "test"))
    requirements = verl_requirements(gathered(build_plugin_manager(config).hook.rlweave_needs()))
    with pytest.raises(ConfigError, match="these plugins cannot run together") as info:
        check_requirements(requirements, {}, "cli")
    assert "rlweave.resilience needs trainer.v1.trainer_mode in {sync} (recovery redoes" in str(info.value)
    assert "rlweave.stage_fusion needs trainer.v1.trainer_mode in {rlweave_stream} (inter-stage" in str(info.value)
