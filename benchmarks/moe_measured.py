"""The measured part of ``rlweave bench moe``: Megatron-core MoE forward+backward on gloo with
EP=2 (two CPU processes, one core and one thread each), on a skewed replayed routing.

In the same processes, on the same tokens and the same logical weights, each training step
(all of its micro-batches, forward+backward) runs through
- Megatron's own ``MoELayer`` (static contiguous placement), and
- rlweave's ``ReplayBalancedMoELayer`` (``rebalance_step`` before the step: moves and step
  replicas; then per micro-batch ``prepare_microbatch`` and micro-batch replicas; planning,
  copies and gradient reductions are all included in its time),
alternating which goes first. A step's time is the slower rank's wall time; beside it, the
busiest rank's CPU time, which other processes on a shared machine disturb less. The lower
bound is Megatron's layer on a uniformly random routing of the same size (as balanced as
routing gets).

Run by :mod:`rlweave.benchmarks.moe` in the megatron-core environment:
``python -m rlweave.benchmarks.moe_measured OUT.json [--tokens N] [--micro-batches M] ...``
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import sys
import time

import numpy as np

EP = 2


def parse(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    parser.add_argument("out")
    parser.add_argument("--tokens", type=int, default=4096, help="tokens per micro-batch, both ranks")
    parser.add_argument("--micro-batches", type=int, default=4)
    parser.add_argument("--steps", type=int, default=4, help="timed steps (after one warm-up)")
    parser.add_argument("--hidden", type=int, default=512)
    parser.add_argument("--experts", type=int, default=8)
    parser.add_argument("--top-k", type=int, default=2)
    parser.add_argument("--ffn", type=int, help="expert FFN width (default 4096 / top-k: a token's expert "
                                                "compute stays that of top-2 at 2048)")
    parser.add_argument("--zipf", type=float, default=1.2)
    parser.add_argument("--slots-per-rank", type=int, help="default: the rank's experts plus 2 spare")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--dispatcher", choices=("alltoall", "allgather"), default="alltoall")
    parser.add_argument("--trace", help="replay this .npz trace's routing (--experts, --top-k its own) instead of Zipf")
    opts = parser.parse_args(argv)
    opts.ffn = opts.ffn or 4096 // opts.top_k
    opts.slots_per_rank = opts.slots_per_rank or opts.experts // EP + 2
    return opts


def step_routing(opts: argparse.Namespace, step: int, skewed: bool) -> np.ndarray:
    """Global replayed top-2 ids [M * tokens, 2]: Zipf popularity whose hot experts shift every
    micro-batch (the bench's synthetic trace), the ``--trace`` file's tokens (step s replays layer
    s % layers from token s * M * tokens on, wrapping around), or uniformly random for the lower
    bound."""
    from rlweave.benchmarks.moe import synthetic_trace

    if skewed and opts.trace:
        # Any integer dtype is a valid trace (a routing capture stores int16 to save memory);
        # Megatron's RouterReplay gathers with these ids, and torch's gather takes only int64.
        ids = np.load(opts.trace)["topk_ids"].astype(np.int64)
        if ids.shape[2] != opts.top_k or ids.max() >= opts.experts:
            raise SystemExit(f"rlweave: --experts {opts.experts} --top-k {opts.top_k} do not describe {opts.trace} "
                             f"(top-{ids.shape[2]} over {int(ids.max()) + 1} experts)")
        want = opts.micro_batches * opts.tokens
        return np.take(ids[:, step % ids.shape[1]], np.arange(step * want, (step + 1) * want), axis=0, mode="wrap")
    rng = np.random.default_rng([opts.seed, step])
    trace_args = argparse.Namespace(micro_batches=opts.micro_batches, tokens=opts.tokens, layers=1,
                                    experts=opts.experts, zipf=opts.zipf if skewed else 0.0, scenario="shifting")
    return synthetic_trace(rng, trace_args, opts.top_k)[0][:, 0]


def rank_main(rank: int, opts: argparse.Namespace, port: int) -> None:
    os.sched_setaffinity(0, {rank % os.cpu_count()})
    os.environ.update(RLWEAVE__REPLAY_BALANCE__ENABLE="true", RLWEAVE__REPLAY_BALANCE__SLOTS_PER_RANK=str(opts.slots_per_rank),
                      RLWEAVE__REPLAY_BALANCE__RANKS_PER_NODE=str(EP))
    import torch
    import torch.distributed as dist

    from rlweave.adapters.megatron.cpu import alltoall_without_cuda_streams, init_expert_parallel, moe_config

    init_expert_parallel(rank, EP, port)
    if opts.dispatcher == "alltoall":
        alltoall_without_cuda_streams()
    from megatron.core.transformer.moe.moe_layer import MoELayer
    from megatron.core.transformer.moe.router_replay import RouterReplay, RouterReplayAction

    from rlweave.adapters.megatron import layer_spec, moe_submodules
    from rlweave.adapters.megatron.balanced_moe import prepare_microbatch, rebalance_step

    config = moe_config(opts.experts, opts.top_k, opts.hidden, opts.ffn, EP, moe_token_dispatcher_type=opts.dispatcher)
    static = MoELayer(config, submodules=moe_submodules(opts.experts))
    ours = layer_spec(num_experts=opts.experts).submodules.mlp(config=config)
    with torch.no_grad():
        ours.router.weight.copy_(static.router.weight)
    # Megatron's layer holds this rank's experts; gather all of them as the logical weights.
    mine = [[p.detach() for p in e.parameters()] for e in static.experts.local_experts]
    everyone: list = [None] * EP
    dist.all_gather_object(everyone, mine)
    per_rank = opts.experts // EP
    ours.load_logical_expert_state({e: everyone[e // per_rank][e % per_rank] for e in range(opts.experts)})

    tokens_seen: list[int] = []
    for layer in (static, ours):
        layer.experts.register_forward_pre_hook(lambda _m, args: tokens_seen.append(int(args[1].sum())))
    per = opts.tokens // EP

    def run_step(layer, routing: np.ndarray, step: int) -> tuple[float, float, list[int], torch.Tensor]:
        tokens_seen.clear()
        local = np.concatenate([routing[m * opts.tokens + rank * per: m * opts.tokens + (rank + 1) * per]
                                for m in range(opts.micro_batches)])
        dist.barrier()
        start, cpu_start = time.perf_counter(), time.process_time()
        if layer is ours:
            rebalance_step(ours, local[:, None, :], tuple(np.arange(opts.micro_batches + 1) * per))
        first = None
        for m in range(opts.micro_batches):
            torch.manual_seed(1000 * step + 10 * m + rank)
            x = torch.randn(per // 4, 4, opts.hidden, requires_grad=True)
            replay = [torch.as_tensor(local[m * per:(m + 1) * per])] * 2  # one RouterReplay per layer
            RouterReplay.set_replay_data(replay)
            RouterReplay.set_global_router_replay_action(RouterReplayAction.REPLAY_FORWARD)
            if layer is ours:  # where the trainer sets replay data: plan this micro-batch now
                prepare_microbatch(ours, local[m * per:(m + 1) * per, None, :])
            out, _ = layer(x)
            out.square().mean().backward()
            first = out.detach() if first is None else first
        elapsed = torch.tensor([time.perf_counter() - start, time.process_time() - cpu_start])
        dist.all_reduce(elapsed, op=dist.ReduceOp.MAX)
        layer.zero_grad(set_to_none=True)
        return float(elapsed[0]), float(elapsed[1]), list(tokens_seen), first

    times: dict[str, list[float]] = {"static": [], "rlweave": [], "balanced": []}
    cpu: dict[str, list[float]] = {"static": [], "rlweave": [], "balanced": []}  # busiest rank's CPU time
    loads: dict[str, list[list[int]]] = {"static": [], "rlweave": []}
    max_diff = 0.0
    for step in range(opts.steps + 1):
        skewed, uniform = step_routing(opts, step, True), step_routing(opts, step, False)
        order = [("static", static, skewed), ("rlweave", ours, skewed), ("balanced", static, uniform)]
        outputs = {}
        for name, layer, routing in (order if step % 2 else order[::-1]):
            seconds, cpu_seconds, seen, outputs[name] = run_step(layer, routing, step)
            if step:  # step 0 warms up
                times[name].append(seconds)
                cpu[name].append(cpu_seconds)
                if name in loads:
                    loads[name].append(seen)
        max_diff = max(max_diff, float((outputs["static"] - outputs["rlweave"]).abs().max()))
    gathered: list = [None] * EP
    dist.all_gather_object(gathered, loads)
    if rank == 0:
        imbalance = {}
        for name in loads:
            per_rank = np.array([g[name] for g in gathered], dtype=float)  # [ranks, steps, micro-batches]
            imbalance[name] = float((per_rank.max(axis=0) / per_rank.mean(axis=0)).mean())
        median = {name: statistics.median(t) for name, t in times.items()}
        cpu_median = {name: statistics.median(t) for name, t in cpu.items()}
        result = {"step_s": median, "all_step_s": times, "max_mean_rank_tokens": imbalance,
                  "busiest_rank_cpu_s": cpu_median, "cpu_speedup": cpu_median["static"] / cpu_median["rlweave"],
                  "speedup": median["static"] / median["rlweave"], "bound": median["static"] / median["balanced"],
                  "max_abs_output_diff": max_diff, "options": vars(opts)}
        with open(opts.out, "w") as f:
            json.dump(result, f, indent=2)
    dist.destroy_process_group()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main(argv: list[str]) -> None:
    import torch.multiprocessing as mp

    opts = parse(argv)
    mp.spawn(rank_main, args=(opts, free_port()), nprocs=EP)


if __name__ == "__main__":
    main(sys.argv[1:])
