"""rlweave's overlapped TP linears (``rlweave.overlap``) equal Megatron's plain ones on gloo.

TP=2 and TP=4 CPU process groups, sequence parallelism on, 5-row shards cut into uneven pieces:
- ``ring`` through the real overlap plugin (``backend=ring, chunks_per_rank=2``): outputs, input
  gradients and weight/bias gradients of the column- and row-parallel linears equal Megatron's
  (fp32 bit for bit where the CPU GEMM of a row slice equals the slice of the GEMM, always
  within 1e-6; bf16 within its tolerance); the ring and symm_mem ops along gather dims 0 and 1
  equal all_gather/reduce_scatter + matmul; a transformer layer from rlweave's spec trains two
  SGD steps to Megatron's losses and weights.
- ``symm_mem`` with torch's own reference implementations of its two ops standing in for their
  CUDA kernels (no CUDA here): the same equalities through the linears.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch

HERE = Path(__file__).resolve().parent
FP32 = dict(rtol=1e-6, atol=1e-6)
BF16 = dict(rtol=2e-2, atol=5e-2)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_ranks(world: int, out: Path, mode: str, **env: str) -> list[dict]:
    base = {k: v for k, v in os.environ.items() if not k.startswith("RLWEAVE")}
    base["PYTHONPATH"] = os.pathsep.join([str(HERE), base.get("PYTHONPATH", "")])
    subprocess.run([sys.executable, "-W", "ignore", str(HERE / "overlap_worker.py"), str(world), str(out),
                    str(free_port()), mode], env=base | env, check=True, timeout=240, capture_output=True, text=True)
    return [torch.load(out / f"rank{r}.pt", weights_only=False) for r in range(world)]


@pytest.fixture(scope="module", params=[2, 4], ids=["tp2", "tp4"])
def ring_ranks(request, tmp_path_factory):
    return request.param, run_ranks(request.param, tmp_path_factory.mktemp("ring"), "ring",
                                    RLWEAVE__OVERLAP__ENABLE="true", RLWEAVE__OVERLAP__BACKEND="ring",
                                    RLWEAVE__OVERLAP__CHUNKS_PER_RANK="2")


def assert_linears_equal(ranks: list[dict], backend: str) -> None:
    for rank in ranks:
        for (kind, dtype), r in rank["linears"].items():
            tol = FP32 if "float32" in dtype else BF16
            plans = [p for p in r["plans"].values()]
            assert plans and all(p is not None and p.backend == backend for p in plans), (kind, dtype, plans)
            ref, ours = r["ref"], r["ours"]
            torch.testing.assert_close(ours["out"], ref["out"], **tol)
            torch.testing.assert_close(ours["dx"], ref["dx"], **tol)
            assert ours["grads"].keys() == ref["grads"].keys() == {"weight", "bias"}
            for name, grad in ref["grads"].items():
                torch.testing.assert_close(ours["grads"][name], grad, **tol)


@pytest.mark.timeout(300)
def test_ring_linears_equal_megatron(ring_ranks):
    world, ranks = ring_ranks
    assert all(r["host_active"] for r in ranks)
    assert_linears_equal(ranks, "ring")
    plan = next(iter(ranks[1]["linears"][("column", "torch.float32")]["plans"].values()))
    assert plan.forward.chunks_per_rank == 2 and plan.forward.order[0] == 1  # own shard first


@pytest.mark.timeout(300)
def test_backend_ops_along_both_gather_dims(ring_ranks):
    _, ranks = ring_ranks
    for rank in ranks:
        for (backend, dim), checks in rank["ops"].items():
            for what, (got, want) in checks.items():
                torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5, msg=f"{backend} dim {dim} {what}")


@pytest.mark.timeout(300)
def test_transformer_layer_from_rlweave_spec_trains_like_megatrons(ring_ranks):
    _, ranks = ring_ranks
    for rank in ranks:
        layer = rank["layer"]
        assert "OverlapColumnParallelLinear" in layer["classes"] and "OverlapRowParallelLinear" in layer["classes"]
        assert layer["losses"]["ours"] == pytest.approx(layer["losses"]["ref"], rel=1e-6)
        assert layer["losses"]["ref"][1] != layer["losses"]["ref"][0]  # it did train
        for name, (ref, ours) in layer["params"].items():
            torch.testing.assert_close(ours, ref, **FP32, msg=name)


@pytest.mark.timeout(300)
def test_symm_mem_backend_with_torchs_reference_ops_no_cuda(tmp_path):
    ranks = run_ranks(2, tmp_path, "symm_mem", RLWEAVE_PLUGIN_MODULES="symm_mem_plan_plugin")
    assert_linears_equal(ranks, "symm_mem")


def test_layer_spec_swaps_the_linears_only_while_a_plugin_plans_them(monkeypatch):
    """Disabled means absent: Megatron's own linear classes in the spec unless the hook has an
    implementation (in-process, no process group needed to build a spec)."""
    from megatron.core.tensor_parallel.layers import ColumnParallelLinear, RowParallelLinear

    from rlweave import host
    from rlweave.adapters.megatron import layer_spec
    from rlweave.adapters.megatron.overlap.linears import OverlapColumnParallelLinear, OverlapRowParallelLinear

    for name in [n for n in os.environ if n.startswith("RLWEAVE")]:
        monkeypatch.delenv(name)
    host.reset()
    attention = layer_spec().submodules.self_attention.submodules
    assert (attention.linear_qkv, attention.linear_proj) == (ColumnParallelLinear, RowParallelLinear)
    monkeypatch.setenv("RLWEAVE__OVERLAP__ENABLE", "true")
    host.reset()
    try:
        spec = layer_spec()
        attention, mlp = spec.submodules.self_attention.submodules, spec.submodules.mlp
        mlp = mlp.keywords["submodules"] if hasattr(mlp, "keywords") else mlp.submodules  # partial or ModuleSpec
        assert (attention.linear_qkv, attention.linear_proj) == (OverlapColumnParallelLinear, OverlapRowParallelLinear)
        assert (mlp.linear_fc1, mlp.linear_fc2) == (OverlapColumnParallelLinear, OverlapRowParallelLinear)
    finally:
        host.reset()
