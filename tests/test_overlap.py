"""The overlap plugin's schedule, timeline model, profiles and per-linear choice (pure)."""

from __future__ import annotations

import dataclasses
import json

import pytest

from rlweave.config import ConfigError, build_config, settings_from_mapping
from rlweave.host import activate
from rlweave.plugins.overlap.choose import OverlapError, choose, shapes
from rlweave.plugins.overlap.model import DeviceProfile, Shape, gemm_s, predict, split_gemm_penalty
from rlweave.plugins.overlap.profiles import BUILTIN, ProfileError, dump, for_device, load
from rlweave.plugins.overlap.schedule import chunk_candidates, ring_peers, schedule, split_rows, step_order
from rlweave.types import LinearInfo, TPDevice

H200 = BUILTIN["h200-nvlink"]
GPU = TPDevice("NVIDIA H200", "nccl", ("ring", "symm_mem", "tile"))
CPU = TPDevice("cpu", "gloo", ("ring",), ("symm_mem: needs CUDA", "tile: needs CUDA"))


def linear(kind="column", tokens=8192, tp=8, rank=0, device=GPU, sp=True) -> LinearInfo:
    return LinearInfo(kind, 12288, 6144 * tp if kind == "column" else 12288, tp, rank, sp, tokens, 2, device)


@pytest.mark.parametrize("world", [2, 3, 4, 8])
def test_every_step_reads_a_different_peer_and_covers_every_shard(world):
    for op in ("ag_gemm", "gemm_rs"):
        orders = [step_order(op, r, world) for r in range(world)]
        for r in range(world):
            assert sorted(orders[r]) == list(range(world))
        for step in range(world):
            assert sorted(o[step] for o in orders) == list(range(world))  # a permutation per step
    # AllGather: own shard first, then rank+1 (FLUX: rank 5 of 8 reads 6, 7, 0, ...).
    assert step_order("ag_gemm", 5, 8) == (5, 6, 7, 0, 1, 2, 3, 4)
    # ReduceScatter: block rank+1 first, own block last.
    assert step_order("gemm_rs", 5, 8) == (6, 7, 0, 1, 2, 3, 4, 5)


@pytest.mark.parametrize("world", [2, 4, 8])
def test_ring_flows_are_consistent(world):
    """What a rank receives at step s+1 is what its sender held at step s (AllGather), and the
    accumulator it receives is for the block it computes (ReduceScatter)."""
    for r in range(world):
        recv_from, send_to = ring_peers(r, world)
        assert ring_peers(send_to, world)[0] == r
        ag_me, ag_src = step_order("ag_gemm", r, world), step_order("ag_gemm", recv_from, world)
        rs_me, rs_src = step_order("gemm_rs", r, world), step_order("gemm_rs", recv_from, world)
        for s in range(world - 1):
            assert ag_me[s + 1] == ag_src[s]
            assert rs_me[s + 1] == rs_src[s]


def test_split_rows_and_candidates():
    assert split_rows(10, 4) == (3, 3, 2, 2) and sum(split_rows(7, 7)) == 7
    assert chunk_candidates(1024, 128, 8) == [1, 2, 4, 8]
    assert chunk_candidates(256, 128, 8) == [1, 2]
    assert chunk_candidates(3, 1, 8) == [1, 2]
    assert chunk_candidates(64, 128, 8) == [1]


def test_sequential_has_zero_e_overlap_and_perfect_overlap_is_one():
    s = Shape("ag_gemm", 4096, 6144, 12288, 8)
    seq = predict(H200, s, "sequential")
    assert seq.e_overlap == pytest.approx(0.0)
    assert seq.ect_s == pytest.approx(seq.sequential_s - gemm_s(H200, 4096, 6144, 12288))
    free_link = dataclasses.replace(H200, link_bps=1e30, link_latency_s=0.0, tile_efficiency=1.0,
                                    overlap_slowdown=0.0, launch_s=0.0)
    tile = predict(free_link, s, "tile", 4)
    assert tile.ect_s == pytest.approx(0.0, abs=1e-12) and tile.e_overlap == pytest.approx(1.0)


def test_model_reproduces_flux_qualitatively():
    """With a tile kernel as fast as the unsplit GEMM (FLUX's CUTLASS kernels are), tile beats
    decomposition at every m, decomposition loses at small m (split GEMMs under-fill the
    device), and both gain with m (Fig. 4 / Table 4 of FLUX)."""
    flux = dataclasses.replace(H200, tile_efficiency=1.0)
    for op, n, k in (("ag_gemm", 6144, 12288), ("gemm_rs", 12288, 6144)):
        prev = -10.0
        for m in (1024, 2048, 4096, 8192):
            s = Shape(op, m, n, k, 8)
            tile = min((predict(flux, s, "tile", c) for c in (1, 2, 4, 8)), key=lambda p: p.time_s)
            dec = predict(flux, s, "decomposed", 1)
            assert tile.time_s < dec.time_s
            assert tile.e_overlap > 0.3
            assert dec.e_overlap > prev - 1e-9
            prev = dec.e_overlap
        assert predict(flux, Shape(op, 1024, n, k, 8), "decomposed", 1).e_overlap < 0


def test_a_slower_tile_kernel_loses_to_cublas_pieces_at_large_m():
    """10% slower than cuBLAS, the tile kernel pays more than decomposition hides at m = 8192."""
    s = Shape("ag_gemm", 8192, 6144, 12288, 8)
    assert predict(H200, s, "decomposed", 1).time_s < predict(H200, s, "tile", 1).time_s


def test_split_gemm_penalty_grows_with_pieces():
    s = Shape("ag_gemm", 2048, 6144, 12288, 8)
    penalties = [split_gemm_penalty(H200, s, c) for c in (1, 2, 4)]
    assert 0 < penalties[0] < penalties[1] < penalties[2]


def test_chunks_follow_the_link_and_gemm_speeds():
    """A slow link with a big latency wants few pieces; a fast one with no latency, more."""
    s = Shape("ag_gemm", 8192, 6144, 12288, 8)
    from rlweave.plugins.overlap.choose import best
    slow = dataclasses.replace(H200, link_latency_s=2e-3)
    fast = dataclasses.replace(H200, link_latency_s=0.0, link_bps=50e9)
    assert best(slow, s, "tile", 8).chunks_per_rank == 1
    assert best(fast, s, "tile", 8).chunks_per_rank > 1


def test_choose_picks_tile_on_gpu_and_the_schedules_match_the_linear():
    plan = choose(linear("column", rank=3, tokens=2048), H200)
    assert plan.backend == "tile"
    assert plan.forward.op == "ag_gemm" and plan.backward.op == "gemm_rs"
    assert plan.forward.order == step_order("ag_gemm", 3, 8)
    assert (plan.forward.recv_from, plan.forward.send_to) == (4, 2)
    assert plan.forward.predicted_s < plan.forward.sequential_s
    row = choose(linear("row", tokens=2048), H200)
    assert row.forward.op == "gemm_rs" and row.backward.op == "ag_gemm"
    assert choose(linear("column", tokens=8192), H200).backend == "symm_mem"  # cuBLAS pieces win there
    fwd, bwd = shapes(linear("row"))
    assert (fwd.m, fwd.n, fwd.k) == (8192, 12288, 12288 // 8) and (bwd.n, bwd.k) == (12288 // 8, 12288)


def test_every_rank_gets_the_same_chunks():
    plans = [choose(linear("row", tokens=4096, rank=r), H200) for r in range(8)]
    assert len({(p.backend, p.forward.chunks_per_rank, p.backward.chunks_per_rank) for p in plans}) == 1


def test_auto_keeps_megatron_where_nothing_beats_sequential():
    assert choose(linear(tokens=64), H200) is None
    assert choose(linear(sp=False), H200) is None
    assert choose(linear(tp=1), H200) is None


def test_forced_backend_runs_or_is_refused_with_the_reason():
    assert choose(linear(tokens=64, device=CPU), BUILTIN["cpu-gloo"], "ring").backend == "ring"
    with pytest.raises(OverlapError, match="tile: needs CUDA.*set rlweave.overlap.backend=auto"):
        choose(linear(device=CPU), BUILTIN["cpu-gloo"], "tile")


def test_profiles_by_device_and_from_json(tmp_path):
    assert for_device("NVIDIA H200").name == "h200-nvlink" and for_device("cpu").name == "cpu-gloo"
    assert for_device("NVIDIA H100 80GB HBM3").name == "h100-nvlink"
    path = dump(dataclasses.replace(H200, name="mine", source="test"), tmp_path / "p.json")
    assert load(str(path), "cpu").name == "mine" and load("auto", "NVIDIA H200") == H200
    (tmp_path / "bad.json").write_text(json.dumps({"name": "x"}))
    with pytest.raises(ProfileError, match="lacks"):
        load(str(tmp_path / "bad.json"), "cpu")
    with pytest.raises(ProfileError, match="neither a built-in"):
        load("nope", "cpu")


def test_config_section_validates():
    config = build_config(settings_from_mapping({"overlap": {"enable": True, "backend": "ring"}}, "test"))
    assert config.overlap.backend == "ring"
    with pytest.raises(ConfigError, match="unknown rlweave.overlap.backend"):
        build_config(settings_from_mapping({"overlap": {"backend": "flux"}}, "test"))
    with pytest.raises(ConfigError, match="does not exist"):
        build_config(settings_from_mapping({"overlap": {"profile": "/nope.json"}}, "test"))


def test_hook_answers_through_the_host():
    host = activate(settings_from_mapping({"overlap": {"enable": True, "backend": "ring"}}, "test"),
                    export_env=False)
    assert host.implements("rlweave_tp_linear_impl")
    plan = host.hook.rlweave_tp_linear_impl(linear=linear(device=CPU, tp=2, rank=1))
    assert plan.backend == "ring" and plan.forward.order == (1, 0)


def test_profile_fields_are_documented_numbers():
    for profile in BUILTIN.values():
        assert isinstance(profile, DeviceProfile) and profile.gemm_flops > 0 and profile.link_bps > 0
