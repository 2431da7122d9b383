"""The cluster file: a good one loads, each bad field gets its own line naming it and the fix,
a measured figure overrides a default profile, and every default profile carries its sources."""

from __future__ import annotations

import copy

import pytest

from rlweave.plan import DEFAULTS, ClusterError, load_cluster, parse_cluster

GOOD = """
[gpu]
kind = "H100_SXM"
count = 1024

[model]
params_b = 7.6
layers = 28
hidden = 3584

[parallelism]
tp = 4
pp = 1
dp = 256
rollout_tp = 4

[recorded]
gpu = "A100_80GB"
gpus = 8
params_b = 0.5
"""


@pytest.fixture
def good(tmp_path):
    path = tmp_path / "cluster.toml"
    path.write_text(GOOD)
    return path


def test_a_good_file_loads(good):
    cluster = load_cluster(good)
    assert cluster.gpu is DEFAULTS["H100_SXM"] and cluster.gpus == 1024 and cluster.instances == 256
    assert cluster.model.experts == 0 and cluster.parallelism.ep == 1
    assert cluster.recorded.gpu is DEFAULTS["A100_80GB"] and cluster.recorded.rollout_tp == 1
    assert cluster.requests_per_step is None


def data():
    import tomllib

    return tomllib.loads(GOOD)


def broken(section: str, key: str, value) -> dict:
    d = copy.deepcopy(data())
    if value is None:
        del d[section][key]
    else:
        d[section][key] = value
    return d


@pytest.mark.parametrize(("section", "key", "value", "says"), [
    ("gpu", "kind", "B300", "name a default profile"),
    ("gpu", "count", 0, "must be a whole number >= 1"),
    ("gpu", "count", None, "is missing"),
    ("gpu", "hbm_tbs", -1.0, "must be a number"),
    ("gpu", "colour", "green", "unknown field"),
    ("model", "params_b", "7B", "parameters in billions"),
    ("model", "layers", 2.5, "whole number"),
    ("model", "top_k", 2, "0 (a dense model)"),
    ("parallelism", "dp", 128, "tp x pp x dp = 512, but [gpu] count = 1024"),
    ("parallelism", "rollout_tp", 3, "does not divide [gpu] count"),
    ("parallelism", "pp", 3, "does not divide [model] layers"),
    ("parallelism", "ep", 2, "a dense model (experts = 0) has ep = 1"),
    ("recorded", "gpus", None, "the GPU count the trace ran on"),
    ("recorded", "gpu", "measured", "gpu = 'measured' needs all of"),
    ("recorded", "rollout_tp", 3, "does not divide [recorded] gpus"),
])
def test_each_bad_field_is_named_with_its_fix(section, key, value, says):
    with pytest.raises(ClusterError) as caught:
        parse_cluster(broken(section, key, value), "c.toml")
    named = [p for p in caught.value.problems if says in p]
    assert named and all(p.startswith(f"[{section}]") and key in p for p in named)
    assert str(caught.value).startswith("cluster file c.toml:")


def test_every_bad_field_is_listed_at_once():
    d = broken("gpu", "count", 0)
    d["model"]["layers"] = 0
    d["extra"] = {}
    with pytest.raises(ClusterError) as caught:
        parse_cluster(d)
    assert len(caught.value.problems) == 3


def test_a_moe_model_checks_top_k_and_ep():
    d = data()
    d["model"] |= {"experts": 64, "top_k": 8}
    d["parallelism"]["ep"] = 8
    assert parse_cluster(d).model.top_k == 8
    d["model"]["top_k"], d["parallelism"]["ep"] = 65, 48
    with pytest.raises(ClusterError) as caught:
        parse_cluster(d)
    assert any("between 1 and 64" in p for p in caught.value.problems)
    assert any("ep = 48: must divide [model] experts = 64" in p for p in caught.value.problems)


def test_a_measured_figure_overrides_the_default_and_says_so():
    d = data()
    d["gpu"]["hbm_tbs"] = 3.0
    d["links"] = {"network_gbs": 25.0}
    gpu = parse_cluster(d).gpu
    assert (gpu.hbm_tbs, gpu.network_gbs, gpu.bf16_tflops) == (3.0, 25.0, 989.0)
    assert gpu.source.startswith("measured (hbm_tbs = 3, network_gbs = 25")
    d["recorded"] = {"gpu": "measured", "gpus": 1, "params_b": 0.5, "bf16_tflops": 1.0, "hbm_tbs": 0.05,
                     "nvlink_gbs": 10.0, "network_gbs": 1.0}
    assert parse_cluster(d).recorded.gpu.hbm_tbs == 0.05


def test_an_unreadable_file_says_what_is_wrong(tmp_path):
    with pytest.raises(ClusterError, match="no such file"):
        load_cluster(tmp_path / "absent.toml")
    (tmp_path / "bad.toml").write_text("[gpu\n")
    with pytest.raises(ClusterError, match="not valid TOML"):
        load_cluster(tmp_path / "bad.toml")


def test_every_default_profile_carries_its_sources_and_tags():
    assert {"H100_SXM", "H200_SXM", "H20", "A100_80GB", "H800_SXM"} <= set(DEFAULTS)
    for gpu in DEFAULTS.values():
        assert gpu.source and ("[P]" in gpu.source or "[R]" in gpu.source)
        assert min(gpu.bf16_tflops, gpu.hbm_tbs, gpu.nvlink_gbs, gpu.network_gbs) > 0
    assert "[R] third party only" in DEFAULTS["H20"].source  # no public datasheet
    assert DEFAULTS["H200_SXM"].hbm_tbs > DEFAULTS["H100_SXM"].hbm_tbs > DEFAULTS["A100_80GB"].hbm_tbs


def test_failures_are_optional_each_figure_the_users_own_and_checked():
    base = data()
    assert parse_cluster(base).failures is None
    full = {"gpu_mtbf_hours": 50_000, "checkpoint_s": 300, "restart_s": 900, "snapshot_s": 10, "recover_s": 120}
    assert parse_cluster(base | {"failures": full}).failures.snapshot_s == 10
    verl_only = {k: full[k] for k in ("gpu_mtbf_hours", "checkpoint_s", "restart_s")}
    assert parse_cluster(base | {"failures": verl_only}).failures.recover_s is None
    with pytest.raises(ClusterError) as error:
        parse_cluster(base | {"failures": {"checkpoint_s": 300, "restart_s": -1, "snapshot_s": 10}})
    assert error.value.problems == ["[failures] gpu_mtbf_hours is missing: see docs/plan.md, [failures]",
                                    "[failures] restart_s = -1: must be a number >= 0; see docs/plan.md, [failures]"]
    with pytest.raises(ClusterError, match="give both"):
        parse_cluster(base | {"failures": verl_only | {"snapshot_s": 10}})
