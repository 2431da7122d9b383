"""A Megatron-core MoE layer built through rlweave's spec runs forward and backward on gloo
(EP=1 and EP=2, CPU processes), equals Megatron's own layer, and fires rlweave's routing hook."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch

HERE = Path(__file__).resolve().parent


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_ranks(world_size: int, out: Path, script: str = "moe_worker.py", **env: str) -> list[dict]:
    """Run ``script`` with ``world_size`` gloo ranks and load what each rank saved."""
    base = {k: v for k, v in os.environ.items() if not k.startswith("RLWEAVE")}
    base["PYTHONPATH"] = os.pathsep.join([str(HERE), base.get("PYTHONPATH", "")])
    subprocess.run([sys.executable, "-W", "ignore", str(HERE / script), str(world_size), str(out),
                    str(free_port())], env=base | env, check=True, timeout=240, capture_output=True, text=True)
    return [torch.load(out / f"rank{r}.pt", weights_only=False) for r in range(world_size)]


@pytest.mark.timeout(300)
@pytest.mark.parametrize("world_size", [1, 2])
def test_rlweave_moe_layer_equals_megatron_and_reports_routing(world_size, tmp_path):
    log = tmp_path / "routing.log"
    ranks = run_ranks(world_size, tmp_path, RLWEAVE__TRACING__ENABLE="true",
                      RLWEAVE__TRACING__DIR=str(tmp_path / "trace"),
                      RLWEAVE_PLUGIN_MODULES="routing_log_plugin", ROUTING_LOG=str(log))
    for rank in ranks:
        assert rank["class"] == "RlweaveMoELayer" and rank["host_active"]
        ref, ours = rank["reference"], rank["rlweave"]
        torch.testing.assert_close(ours["output"], ref["output"], rtol=0, atol=0)
        torch.testing.assert_close(ours["input_grad"], ref["input_grad"], rtol=0, atol=0)
        assert ours["param_grads"].keys() == ref["param_grads"].keys()
        for name, grad in ref["param_grads"].items():
            torch.testing.assert_close(ours["param_grads"][name], grad)
    lines = [line.split(maxsplit=1) for line in log.read_text().splitlines()]
    assert len({pid for pid, _ in lines}) == world_size  # the hook fired in every rank
    # allgather dispatcher: each rank routes its own 32 tokens, top-2 of 8 experts
    assert all(shape.startswith("[32, 1, 2]") for _, shape in lines)


@pytest.mark.timeout(300)
def test_disabled_spec_is_megatrons_own(tmp_path):
    ranks = run_ranks(1, tmp_path)
    assert ranks[0]["class"] == "MoELayer" and not ranks[0]["host_active"]


@pytest.mark.timeout(300)
def test_a_megatron_outside_the_supported_range_is_refused_when_a_plugin_is_on(version_gate, forked_gate, tmp_path):
    """Megatron's spec provider (``layer_spec``) with a plugin on and the installed version read
    as one just outside ``rlweave.frameworks``' range; with rlweave off it is never checked.
    Each case is a fresh process for rlweave, forked after one shared import of Megatron."""
    from rlweave.frameworks import FRAMEWORKS

    outside, _ = version_gate
    pretend, run_forked = forked_gate
    build = "from rlweave.adapters.megatron import layer_spec; layer_spec(num_experts=4); print('built')"
    versions = outside("megatron-core")
    jobs = [(pretend("megatron-core", v) + build, {"RLWEAVE__TRACING__ENABLE": "true"}) for v in versions]
    *refused, off = run_forked("from megatron.core.models.gpt import gpt_layer_specs",
                               [*jobs, (pretend("megatron-core", versions[0]) + build, {})], tmp_path)
    for version, proc in zip(versions, refused, strict=True):
        assert proc.returncode != 0, f"megatron-core {version} was accepted"
        assert (f"megatron-core {version} is not supported by rlweave "
                f"(supported: {FRAMEWORKS['megatron-core'].supported_range})") in proc.stderr
    assert off.returncode == 0 and off.stdout.strip() == "built", off.stderr[-3000:]
