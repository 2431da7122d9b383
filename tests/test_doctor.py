"""``rlweave doctor`` tells which plugins work with the verl it finds, from what they declare."""

from __future__ import annotations

from rlweave.doctor import (
    Environment,
    PluginFacts,
    hook_callers,
    plugin_facts,
    settings_on_verl,
    verdict_on_verl,
)
from rlweave.frameworks import FRAMEWORKS
from rlweave.types import SettingRequirement


def env(**versions: str) -> Environment:
    return Environment("test", (), {k.replace("_", "-"): v for k, v in versions.items()})


HEDDLE_LIKE = PluginFacts("heddle_like", frozenset({"verl"}), (
    SettingRequirement("actor_rollout_ref.rollout.name", ("vllm", "sglang"), None, "priorities", "heddle_like"),))
ENGINE_ONLY = PluginFacts("engine_only", frozenset({"vllm"}), ())
GPU_ONLY = PluginFacts("gpu_only", frozenset({"verl"}), (
    SettingRequirement("trainer.device", ("cuda",), "cuda", "CUDA kernels", "gpu_only"),))


def test_hook_callers_are_read_from_the_adapters():
    callers = hook_callers()
    assert callers["rlweave_engine_step"] == {"vllm"}
    assert "verl" in callers["rlweave_run_stage"]
    assert callers["rlweave_framework_loaded"] >= {"verl", "vllm", "megatron-core", "sglang"}
    assert "rlweave_configure" not in callers  # the core calls it, no framework


def test_shipped_plugins_declare_where_they_run():
    assert plugin_facts("preemptive_serving", "rlweave.plugins.preemptive_serving.plugin").reaches == {"vllm"}
    stream = plugin_facts("stream_generation", "rlweave.plugins.stream_generation.plugin")
    assert "verl" in stream.reaches
    assert any(r.key == "trainer.v1.trainer_mode" for r in stream.verl_requirements)


def test_a_plugin_needing_a_rollout_engine_refuses_without_one():
    refused = verdict_on_verl(HEDDLE_LIKE, env(verl="0.9.1"), gpu=False, environ={})
    assert not refused.works and "vllm or sglang" in refused.refusal
    assert verdict_on_verl(HEDDLE_LIKE, env(verl="0.9.1", sglang="0.5.23"), gpu=False, environ={}).works


def test_a_plugin_only_an_engine_calls_runs_under_verl_through_its_rollout_setting():
    assert not verdict_on_verl(ENGINE_ONLY, env(verl="0.9.1"), gpu=False, environ={}).works
    works = verdict_on_verl(ENGINE_ONLY, env(verl="0.9.1", vllm="0.32.0+cpu"), gpu=False, environ={})
    assert works.works and works.runs_in == FRAMEWORKS["vllm"].role
    assert settings_on_verl(ENGINE_ONLY) == [("actor_rollout_ref.rollout.name=vllm", "its hooks run in vLLM engines")]
    # an engine rlweave does not support counts as absent
    assert not verdict_on_verl(ENGINE_ONLY, env(verl="0.9.1", vllm="0.40.0"), gpu=False, environ={}).works


def test_gpu_only_plugin_refuses_on_a_machine_without_a_gpu():
    refused = verdict_on_verl(GPU_ONLY, env(verl="0.9.1"), gpu=False, environ={})
    assert not refused.works and refused.refusal.startswith("GPU-only")
    assert verdict_on_verl(GPU_ONLY, env(verl="0.9.1"), gpu=True, environ={}).works


def test_unsupported_verl_and_a_plugin_filter_refuse_every_plugin():
    old = verdict_on_verl(ENGINE_ONLY, env(verl="0.8.0", vllm="0.32.0"), gpu=False, environ={})
    assert "outside rlweave's >=0.9.0,<0.10" in old.refusal
    for value in ("none", "someone_else"):
        blocked = verdict_on_verl(HEDDLE_LIKE, env(verl="0.9.1", vllm="0.32.0"), gpu=False,
                                  environ={"VERL_USE_EXTERNAL_PLUGINS": value})
        assert "VERL_USE_EXTERNAL_PLUGINS" in blocked.refusal
    assert verdict_on_verl(HEDDLE_LIKE, env(verl="0.9.1", vllm="0.32.0"), gpu=False,
                           environ={"VERL_USE_EXTERNAL_PLUGINS": "rlweave,other"}).works


def test_each_framework_filters_plugins_by_its_own_rules():
    vllm, sglang, verl = FRAMEWORKS["vllm"], FRAMEWORKS["sglang"], FRAMEWORKS["verl"]
    # vLLM splits VLLM_PLUGINS on commas, no stripping, no 'auto'; '' loads nothing.
    for value in ("auto", "", " rlweave", "other"):
        assert vllm.filters_out_rlweave({"VLLM_PLUGINS": value}), value
    assert vllm.filters_out_rlweave({"VLLM_PLUGINS": "other,rlweave"}) is None
    # SGLang strips names and treats '' as every plugin; no 'auto'.
    assert sglang.filters_out_rlweave({"SGLANG_PLUGINS": ""}) is None
    assert sglang.filters_out_rlweave({"SGLANG_PLUGINS": " rlweave "}) is None
    assert sglang.filters_out_rlweave({"SGLANG_PLUGINS": "auto"})
    # verl: 'auto' loads every plugin.
    assert verl.filters_out_rlweave({"VERL_USE_EXTERNAL_PLUGINS": "auto"}) is None


def test_doctor_says_how_each_vllm_release_is_tested_or_why_refused(monkeypatch):
    from rlweave.doctor import vllm_plugins_table

    monkeypatch.delenv("VLLM_PLUGINS", raising=False)
    envs = [env(vllm=v) for v in ("0.24.0", "0.28.0", "0.32.0+cpu", "0.34.0", "0.35.0")]
    rows = {(r[1], r[2]): r[3] for r in vllm_plugins_table(envs)[1:]}
    verdicts = {v: rows[(v, "preemptive_serving")] for v in ("0.24.0", "0.28.0", "0.32.0+cpu", "0.34.0", "0.35.0")}
    assert verdicts == {"0.24.0": "scheduler-tested", "0.28.0": "scheduler-tested", "0.32.0+cpu": "engine-tested",
                        "0.34.0": "scheduler-tested", "0.35.0": "refused"}
    monkeypatch.setenv("VLLM_PLUGINS", "auto")
    refused = vllm_plugins_table([env(vllm="0.32.0")])[1]
    assert refused[3] == "refused" and "VLLM_PLUGINS='auto'" in refused[4]


def test_doctor_says_how_each_sglang_and_megatron_release_is_tested():
    """SGLang releases are graded one by one (0.5.13 is untested although 0.5.12 and 0.5.23
    are), megatron-core by series; a release outside the range is refused."""
    from rlweave.doctor import frameworks_table

    envs = [env(sglang=v) for v in ("0.5.12", "0.5.13", "0.5.23", "0.6.0")]
    envs += [env(**{"megatron-core": v}) for v in ("0.17.0", "0.18.0", "0.19.2")]
    table = frameworks_table(envs)
    column = table[0].index("CI verifies it")
    verdicts = {(r[0], r[2]): r[column] for r in table[1:] if r[0] != "rlweave"}
    assert verdicts == {("sglang", "0.5.12"): "import-tested", ("sglang", "0.5.13"): "untested",
                        ("sglang", "0.5.23"): "import-tested", ("sglang", "0.6.0"): "refused",
                        ("megatron-core", "0.17.0"): "refused", ("megatron-core", "0.18.0"): "engine-tested",
                        ("megatron-core", "0.19.2"): "engine-tested",
                        ("verl", "-"): "-", ("vllm", "-"): "-"}
