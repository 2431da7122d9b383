"""rlweave's gloo checkpoint engine on its own: real processes, no Ray, no verl trainer.

Four processes play verl's roles: actor rank 0 (the sender), actor rank 1 (which only walks its
weight generator, as a non-source FSDP rank does), and two rollout workers. The test drives them
the way verl's ``CheckpointEngineManager.update_weights`` does (prepare, build_topology,
init_process_group, send/receive, finalize) for two updates, and checks that every received
tensor equals the sent one bit for bit, across many buckets and a weight larger than a bucket.
"""

from __future__ import annotations

import asyncio
import multiprocessing as mp
from typing import Any, AsyncIterator, Iterator

import pytest
import torch

BUCKET = 4096  # bytes: small, so the weights below span many buckets
ROLES = ("actor", "actor", "rollout", "rollout")


def make_weights(update: int) -> list[tuple[str, torch.Tensor]]:
    """Deterministic weights of mixed dtypes and sizes; different in every update."""
    gen = torch.Generator().manual_seed(update)
    return [
        ("embed.weight", torch.randn(64, 48, generator=gen)),  # 12 KiB: chunked over 3+ buckets
        ("layer.0.q.weight", torch.randn(16, 16, generator=gen).to(torch.bfloat16)),
        ("layer.0.bias", torch.randn(7, generator=gen)),  # odd size: misaligns what follows
        ("layer.0.norm", torch.randn(1, generator=gen).to(torch.float16)),
        ("exact_bucket", torch.randn(BUCKET // 4, generator=gen)),  # exactly one bucket
        ("counts", torch.randint(0, 1 << 40, (33,), generator=gen)),
        ("scalar", torch.tensor(float(update))),
        ("lm_head.weight", torch.randn(40, 33, generator=gen)),
    ]


def sync_weights(update: int) -> Iterator[tuple[str, torch.Tensor]]:
    yield from make_weights(update)


async def async_weights(update: int) -> AsyncIterator[tuple[str, torch.Tensor]]:
    for item in make_weights(update):
        yield item


def worker(role: str, index: int, conn: Any, updates: int) -> None:
    from rlweave.adapters.verl.cpu.gloo_checkpoint_engine import GlooCheckpointEngine

    engine = GlooCheckpointEngine(bucket_size=BUCKET, is_master=(role == "actor" and index == 0),
                                  timeout_s=60, host="127.0.0.1")
    groups = []
    for update in range(updates):
        conn.send(engine.prepare())
        engine.init_process_group(**conn.recv())
        groups.append(engine.group)
        if role == "actor":
            weights = sync_weights(update) if update % 2 == 0 else async_weights(update)
            metrics = asyncio.run(engine.send_weights(weights, global_steps=update))
            result: dict[str, Any] = {"metrics": metrics}
        else:
            async def receive() -> dict[str, torch.Tensor]:
                return {name: tensor.clone() async for name, tensor in engine.receive_weights(update)}

            received = asyncio.run(receive())
            expected = dict(make_weights(update))
            result = {
                "names": list(received),
                "mismatched": [name for name, tensor in expected.items()
                               if name not in received or received[name].dtype != tensor.dtype
                               or not torch.equal(received[name], tensor)],
            }
        engine.finalize()
        result["group_reused"] = len(groups) > 1 and groups[-1] is groups[-2]
        conn.send(result)


@pytest.mark.timeout(300)
def test_gloo_engine_moves_weights_bit_exact_across_buckets_and_updates():
    from rlweave.adapters.verl.cpu.gloo_checkpoint_engine import GlooCheckpointEngine

    updates = 2
    ctx = mp.get_context("spawn")
    pipes, procs = [], []
    for i, role in enumerate(ROLES):
        index = i if role == "actor" else i - ROLES.index("rollout")
        parent, child = ctx.Pipe()
        proc = ctx.Process(target=worker, args=(role, index, child, updates), daemon=True)
        proc.start()
        pipes.append(parent)
        procs.append(proc)
    try:
        n_actor = ROLES.count("actor")
        for update in range(updates):
            metadata = [pipe.recv() for pipe in pipes]
            actor_kwargs, rollout_kwargs = GlooCheckpointEngine.build_topology(
                n_actor, len(ROLES) - n_actor, metadata)
            for i, pipe in enumerate(pipes):
                kwargs = actor_kwargs if i < n_actor else rollout_kwargs
                pipe.send({k: v[i if i < n_actor else i - n_actor] for k, v in kwargs.items()})
            assert all(pipe.poll(120) for pipe in pipes), "a worker hung in the transfer"
            results = [pipe.recv() for pipe in pipes]

            sender, idle, *receivers = results
            expected_names = [name for name, _ in make_weights(update)]
            assert sender["metrics"]["checkpoint_engine/gloo/buckets"] >= 6
            assert sender["metrics"]["checkpoint_engine/gloo/tensors"] == len(expected_names)
            assert sender["metrics"]["checkpoint_engine/gloo/bytes"] == sum(
                t.nbytes for _, t in make_weights(update))
            assert idle["metrics"] == {}
            for received in receivers:
                assert received["names"] == expected_names  # every weight once, in order
                assert received["mismatched"] == []
            # the membership did not change, so the second update reuses the first's group
            assert all(r["group_reused"] == (update > 0) for i, r in enumerate(results) if i != 1)
        for proc in procs:
            proc.join(30)
            assert proc.exitcode == 0
    finally:
        for proc in procs:
            if proc.is_alive():
                proc.kill()


@pytest.mark.timeout(120)
def test_staged_send_hands_the_weights_over_through_the_object_store():
    """rlweave's overlapped push: the sender stages its weights and returns; a receiver handed
    the reference yields them bit for bit, even after the trainer changed its own in place."""
    import ray

    from rlweave.adapters.verl.cpu.gloo_checkpoint_engine import STAGED_KEY, GlooCheckpointEngine

    ray.init(num_cpus=1, include_dashboard=False, log_to_driver=False)
    try:
        sender = GlooCheckpointEngine(bucket_size=BUCKET, is_master=True, timeout_s=60, host="127.0.0.1")
        sender.init_process_group(rank=0, world_size=1, master_metadata=sender.prepare().master, fingerprint="one")
        live = make_weights(0)
        sender.stage_next()
        metrics = asyncio.run(sender.send_weights(iter(live), global_steps=1))
        for _, tensor in live:  # the trainer's next optimizer step
            tensor.zero_()
        receiver = GlooCheckpointEngine(bucket_size=BUCKET, timeout_s=60, host="127.0.0.1")
        receiver.receive_staged(metrics[STAGED_KEY])

        async def receive() -> list[tuple[str, torch.Tensor]]:
            return [(name, tensor) async for name, tensor in receiver.receive_weights(1)]

        received = asyncio.run(receive())
        expected = make_weights(0)
        assert [name for name, _ in received] == [name for name, _ in expected]
        assert all(a.dtype == b.dtype and torch.equal(a, b) for (_, a), (_, b) in zip(received, expected))
        assert metrics["checkpoint_engine/gloo/bytes"] == sum(t.nbytes for _, t in expected)
    finally:
        ray.shutdown()
