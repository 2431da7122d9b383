"""rlweave's tile kernels (FLUX's signal protocol) under Triton's CPU interpreter: their indexing
is tested here, their speed only on a GPU (scripts/gpu_check_overlap.sh).

With every flag set, the AllGather+GEMM kernel equals ``torch.matmul`` of the gathered input,
and the GEMM+ReduceScatter kernel's epilogue puts each owner's rows into its buffer and raises
each row group's flag to its target. A flag left unset makes exactly the tiles over its rows
time out (the bounded spin), so the kernel reads the flags it should.
"""

from __future__ import annotations

import os

os.environ["TRITON_INTERPRET"] = "1"  # before the kernels are decorated

import pytest  # noqa: E402
import torch  # noqa: E402
import triton  # noqa: E402, F401  (the rig installs it: a broken Triton must fail, not skip)
from rlweave.adapters.megatron.overlap import tile_kernels as tk  # noqa: E402

CFG = tk.launch_config(on_gpu=False)  # 16 x 16 x 16 tiles


@pytest.mark.timeout(240)
@pytest.mark.parametrize("world,shard,chunk,first", [(2, 37, 19, 0), (4, 9, 4, 27), (4, 16, 16, 16)])
def test_ag_gemm_with_flags_set_equals_matmul(world, shard, chunk, first):
    torch.manual_seed(0)
    a, b = torch.randn(world * shard, 45), torch.randn(45, 29)
    flags = torch.ones(world * -(-shard // chunk), dtype=torch.int32)
    out, timeouts = tk.ag_gemm(a, b, flags, shard, chunk, first)
    torch.testing.assert_close(out, a @ b, rtol=1e-5, atol=1e-4)
    assert timeouts.item() == 0


@pytest.mark.timeout(240)
def test_ag_gemm_on_a_transposed_weight_view_and_bf16():
    torch.manual_seed(1)
    a, w = torch.randn(32, 24).bfloat16(), torch.randn(20, 24).bfloat16()
    out, _ = tk.ag_gemm(a, w.t(), torch.ones(4, dtype=torch.int32), 16, 8, 16)
    torch.testing.assert_close(out, a @ w.t(), rtol=2e-2, atol=2e-2)


@pytest.mark.timeout(240)
def test_an_unset_flag_stalls_exactly_the_tiles_over_its_rows():
    shard, chunk = 24, 8  # 2 shards x 3 chunks; 48 rows = 3 m-tiles of 16
    a, b = torch.randn(2 * shard, 16), torch.randn(16, 40)  # 3 column tiles
    flags = torch.ones(6, dtype=torch.int32)
    flags[4] = 0  # shard 1, chunk 1: rows 32..39, inside m-tile 2
    _, timeouts = tk.ag_gemm(a, b, flags, shard, chunk, 0, max_spin=3)
    assert timeouts.item() == 3  # m-tile 2's three column tiles waited on it


@pytest.mark.timeout(240)
@pytest.mark.parametrize("world,block,group", [(2, 24, 8), (4, 9, 4)])
def test_gemm_rs_epilogue_writes_owner_rows_and_raises_group_flags(world, block, group):
    torch.manual_seed(2)
    rank, slot = 1, 3  # this rank's partial goes at row offset ``slot`` of each owner's buffer
    a, b = torch.randn(world * block, 33), torch.randn(33, 21)
    dst = [torch.full((slot + block, 21), float("nan")) for _ in range(world)]
    groups = -(-block // group)
    flags = [torch.zeros(groups, dtype=torch.int32) for _ in range(world)]
    tk.gemm_rs(a, b, tk.pointer_table(dst), tk.pointer_table(flags), world, rank, group, slot, config=CFG)
    full = a @ b
    targets = tk.rs_group_targets(world * block, 21, world, group, CFG)
    for owner in range(world):
        torch.testing.assert_close(dst[owner][slot:], full[owner * block:(owner + 1) * block], rtol=1e-5, atol=1e-4)
        assert dst[owner][:slot].isnan().all()  # nothing outside this rank's slot
        assert flags[owner].tolist() == targets[owner]
