from __future__ import annotations

import pytest

from rlweave.config import (
    ConfigError,
    build_config,
    settings_from_env,
    settings_from_mapping,
    settings_from_overrides,
    to_env,
)


def test_defaults_enable_nothing():
    assert build_config([]).enabled() == []


def test_hydra_overrides_and_env_agree():
    from_cli = build_config(settings_from_overrides(
        ["trainer.total_epochs=1", "+rlweave.tracing.enable=true", "++rlweave.tracing.dir=/tmp/t"]))
    from_env = build_config(settings_from_env(
        {"RLWEAVE__TRACING__ENABLE": "true", "RLWEAVE__TRACING__DIR": "/tmp/t", "PATH": "/bin"}))
    assert from_cli == from_env
    assert from_cli.enabled() == ["tracing"]
    assert from_cli.tracing.dir == "/tmp/t"


def test_mapping_from_verl_config():
    from omegaconf import OmegaConf

    node = OmegaConf.create({"tracing": {"enable": True}})
    assert build_config(settings_from_mapping(node, "verl config")).tracing.enable


def test_later_settings_win():
    settings = settings_from_env({"RLWEAVE__TRACING__ENABLE": "true"}) + settings_from_overrides(
        ["+rlweave.tracing.enable=false"])
    assert build_config(settings).enabled() == []


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (["+rlweave.tracing.enabel=true"],
         ["'rlweave.tracing.enabel'", "'+rlweave.tracing.enabel=true'", "Options of rlweave.tracing: enable, dir"]),
        (["+rlweave.tracing.enable=maybe"], ["'maybe'", "allowed: true or false"]),
        (["+rlweave.tracer.enable=true"], ["'rlweave.tracer.enable'", "plugin one of: agentic_rollout, overlap"]),
        (["+rlweave.tracing=true"], ["'rlweave.tracing'"]),
    ],
)
def test_bad_input_names_key_allowed_values_and_source(args, expected):
    with pytest.raises(ConfigError) as info:
        build_config(settings_from_overrides(args, source="verl command line"))
    message = str(info.value)
    assert "verl command line" in message
    for part in expected:
        assert part in message


def test_env_source_is_named():
    with pytest.raises(ConfigError, match="environment variable RLWEAVE__TRACING__ENABLE"):
        build_config(settings_from_env({"RLWEAVE__TRACING__ENABLE": "yes please"}))


def test_enabling_a_plugin_that_is_not_built_yet_is_an_error_not_a_no_op(monkeypatch):
    from rlweave.plugins.overlap.options import OverlapConfig

    monkeypatch.setattr(OverlapConfig, "available", False)  # every plugin has landed: pretend one has not
    with pytest.raises(ConfigError, match="rlweave.overlap .*not available.*available plugins: .*tracing"):
        build_config(settings_from_overrides(["+rlweave.overlap.enable=true"]))


def test_to_env_round_trips_and_is_empty_when_disabled(tmp_path):
    config = build_config(settings_from_overrides(["+rlweave.tracing.enable=true",
                                                   f"+rlweave.tracing.dir={tmp_path}"]))
    assert build_config(settings_from_env(to_env(config))) == config
    assert to_env(build_config([])) == {}


def test_relative_trace_dir_becomes_absolute(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    config = build_config(settings_from_overrides(["+rlweave.tracing.dir=traces"]))
    assert config.tracing.dir == str(tmp_path / "traces")
