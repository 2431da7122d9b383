"""A gloo-collective checkpoint engine for verl: trainer -> standalone rollout weight transfer on CPU.

verl's standalone-rollout trainer (``trainer.v1.trainer_mode=separate_async``) refuses the
colocated ``naive`` engine, and every other engine verl ships moves weights over CUDA or RDMA
(cupy/NCCL, NIXL, Mooncake). This engine is verl's NCCL engine re-done for CPU: the same
bucketed broadcast from actor rank 0 to every rollout worker, but over a ``torch.distributed``
gloo process group built for the transfer alone, with CPU tensors and no CUDA streams.

Load it with::

    actor_rollout_ref.rollout.checkpoint_engine.backend=gloo
    actor_rollout_ref.rollout.checkpoint_engine.custom_backend_module=rlweave.adapters.verl.cpu.gloo_checkpoint_engine

(verl imports ``custom_backend_module`` on the trainer, on every actor worker and on every
rollout checkpoint-engine worker before it builds the engine, so importing this module is what
registers the backend.) Options go in ``checkpoint_engine.engine_kwargs.gloo``.

How one update flows (driven by verl's ``CheckpointEngineManager.update_weights``):

1. ``prepare`` on every worker allocates two ``bucket_size`` byte buffers; actor rank 0 (the
   master) also reports the address of the TCP store it runs, plus a fresh nonce.
2. ``build_topology`` (on the trainer) gives actor rank 0 group rank 0, every rollout worker
   ranks 1..N, and every other actor rank -1: those sit the transfer out.
3. ``init_process_group`` joins a gloo group over that store, or keeps the one built by an
   earlier update when the membership is unchanged (gloo's full-mesh connect is cheap, but
   there is no reason to redo it every step).
4. ``send_weights`` / ``receive_weights``: the sender packs weights into a bucket with verl's
   own ``split_weight_chunks`` (a weight larger than a bucket travels in chunks) and broadcasts,
   per bucket, a small header, the pickled bucket metadata, then the bytes. The receivers turn
   the buckets back into named tensors with verl's ``merge_weight_chunks``. Each side keeps one
   bucket in flight while it fills (sender) or drains (receiver) the other, so memory stays at
   two buckets however large the model is.
5. ``finalize`` frees the buckets.

Staged updates (:mod:`rlweave.adapters.verl.overlapped_push`): after ``stage_next``, the next
``send_weights`` puts the weights into Ray's object store and returns at once, with the object's
reference under :data:`STAGED_KEY`; a rollout worker handed that reference (``receive_staged``)
yields those weights from its next ``receive_weights``. No collective joins the two sides, so the
trainer goes on training while the rollout pauses, loads and resumes; the object store carries
the bytes between nodes as it does every other Ray object.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import os
import pickle
import time
import uuid
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, AsyncGenerator, AsyncIterable, Iterable

import ray
import torch
import torch.distributed as dist

from verl.checkpoint_engine.base import (
    CheckpointEngine,
    CheckpointEngineRegistry,
    TensorMeta,
    merge_weight_chunks,
    split_weight_chunks,
)
from verl.workers.rollout.utils import ensure_async_iterator

logger = logging.getLogger(__name__)
logger.setLevel(os.getenv("VERL_LOGGING_LEVEL", "WARN"))

BACKEND = "gloo"
# Header of every bucket: [metadata bytes, payload bytes, is_last]. A fixed-size tensor, so a
# receiver can post its broadcast before it knows anything about the bucket.
_HEADER_FIELDS = 3
# Where a staged send_weights returns the object-store reference of the weights it staged.
STAGED_KEY = "rlweave/staged_weights"

Weights = Iterable[tuple[str, torch.Tensor]] | AsyncIterable[tuple[str, torch.Tensor]]


def _node_ip() -> str:
    """This node's address as Ray reports it; loopback outside Ray (standalone use, tests).

    The store and gloo's sockets must listen on an address the other workers can reach, and the
    one Ray uses between its own nodes is the one known to work.
    """
    if ray.is_initialized():
        return ray.util.get_node_ip_address().strip("[]")
    return "127.0.0.1"


@dataclass(frozen=True)
class MasterMetadata:
    """Where the group's rendezvous store runs (on actor rank 0), and this update's nonce.

    The nonce names the store prefix of a group built in this update, so a rebuilt group never
    meets keys left by an earlier one on the same long-lived store.
    """

    host: str
    port: int
    nonce: str


@dataclass(frozen=True)
class WorkerMetadata:
    """What each worker reports from ``prepare``.

    ``engine_id`` is unique per engine instance; ``build_topology`` hashes the ids of all members
    into a membership fingerprint, so every member agrees whether the previous group still fits
    (same processes, same order) or has to be rebuilt, e.g. after a rollout replica was replaced.
    """

    engine_id: str
    master: MasterMetadata | None = None


class _BucketBroadcast:
    """One bucket's broadcast (header, metadata, payload), run in a worker thread.

    gloo collectives block, and the rollout side runs inside an asyncio event loop that also
    serves the rollout's weight loading; running the whole exchange in the default executor
    lets the caller fill or drain the other bucket meanwhile, as verl's NCCL engine does with its
    ``BroadcastOperation``. Only one exchange is in flight per process at a time, so the
    collectives reach gloo in the same order on every rank.

    Args:
        group: The transfer's gloo process group.
        rank: This process's rank in ``group``; rank 0 sends.
        bucket: Sender: the filled bucket. Receiver: the buffer to receive into.
        metadata: Sender only: ``{"bucket_meta": [TensorMeta, ...], "is_last": bool}``.
    """

    def __init__(self, group: dist.ProcessGroupGloo, rank: int, bucket: torch.Tensor,
                 metadata: dict[str, Any] | None = None) -> None:
        self.group = group
        self.rank = rank
        self.bucket = bucket
        self.metadata = metadata
        self.length = 0
        self._task = asyncio.get_running_loop().run_in_executor(None, self._run)

    def _broadcast(self, tensor: torch.Tensor) -> None:
        if tensor.numel():
            opts = dist.BroadcastOptions()
            opts.rootRank = 0
            self.group.broadcast([tensor], opts).wait()

    def _run(self) -> None:
        if self.rank == 0:
            assert self.metadata is not None
            payload = pickle.dumps(self.metadata)
            self.length = self.bucket.numel()
            header = torch.tensor([len(payload), self.length, int(self.metadata["is_last"])],
                                  dtype=torch.int64)
            self._broadcast(header)
            self._broadcast(torch.frombuffer(bytearray(payload), dtype=torch.uint8))
            self._broadcast(self.bucket)
            return
        header = torch.zeros(_HEADER_FIELDS, dtype=torch.int64)
        self._broadcast(header)
        meta_len, self.length, _ = (int(v) for v in header.tolist())
        payload = torch.empty(meta_len, dtype=torch.uint8)
        self._broadcast(payload)
        self.metadata = pickle.loads(payload.numpy().tobytes())
        self.bucket = self.bucket[: self.length]
        self._broadcast(self.bucket)

    async def wait_for_complete(self) -> dict[str, Any]:
        """Wait until this bucket's broadcast finished; returns the bucket's metadata."""
        await self._task
        assert self.metadata is not None
        return self.metadata


@CheckpointEngineRegistry.register(BACKEND)
class GlooCheckpointEngine(CheckpointEngine):
    """Checkpoint engine broadcasting weights from actor rank 0 to rollout workers over gloo.

    Args:
        bucket_size: Bucket size in bytes (verl passes ``update_weights_bucket_megabytes << 20``).
            Each side holds two buckets during a transfer, so the memory overhead is
            ``2 * bucket_size``. Buckets are allocated with ``torch.empty``, so only the pages a
            transfer touches become resident (verl's default bucket is 2 GiB).
        is_master: True on actor rank 0, which sends and hosts the rendezvous store.
        rebuild_group: Build a new gloo group on every update instead of reusing the last one.
        timeout_s: Timeout of the store and of every gloo collective: a peer that died surfaces
            as an error instead of a silent hang of the whole trainer.
        host: Address to listen on; defaults to this node's Ray address (loopback outside Ray).
    """

    def __init__(self, bucket_size: int, is_master: bool = False, rebuild_group: bool = False,
                 timeout_s: float = 600.0, host: str | None = None) -> None:
        self.bucket_size = bucket_size
        self.is_master = is_master
        self.rebuild_group = rebuild_group
        self.timeout = timedelta(seconds=timeout_s)
        self.host = host or _node_ip()
        self.engine_id = uuid.uuid4().hex

        self.rank: int | None = None
        self.world_size: int | None = None
        self.group: dist.ProcessGroupGloo | None = None
        self._group_key: str | None = None
        self.send_buf: torch.Tensor | None = None
        self.recv_buf: torch.Tensor | None = None
        self._stage_next = False  # sender: the next send_weights stages instead of broadcasting
        self._staged: Any = None  # receiver: what the next receive_weights yields instead

        # The master's store lives as long as the engine, like the NCCL engine's zmq server:
        # rollout workers connect to it on each rebuild, and it outlives any one group.
        self.store: dist.TCPStore | None = None
        if self.is_master:
            self.store = dist.TCPStore(self.host, 0, is_master=True, wait_for_workers=False,
                                       timeout=self.timeout)

    # ---- topology -------------------------------------------------------------------------

    def prepare(self) -> WorkerMetadata:
        """Allocate this update's two buckets; the master also reports its store's address."""
        self.send_buf = torch.empty(self.bucket_size, dtype=torch.uint8)
        self.recv_buf = torch.empty(self.bucket_size, dtype=torch.uint8)
        master = None
        if self.is_master:
            assert self.store is not None
            master = MasterMetadata(host=self.host, port=self.store.port, nonce=uuid.uuid4().hex)
        return WorkerMetadata(engine_id=self.engine_id, master=master)

    @classmethod
    def build_topology(cls, actor_wg_world_size: int, rollout_world_size: int,
                       metadata: list[WorkerMetadata]) -> tuple[dict[str, list[Any]], dict[str, list[Any]]]:
        """Actor rank 0 is group rank 0 (the only sender); rollout workers follow it.

        Other actor ranks get -1: on CPU there is no NVLink fan-out to gain from relays (verl's
        NCCL ``multi_sender``), so they only walk their weight generator, whose gathers are
        collective over the actor group.
        """
        master = metadata[0].master
        assert master is not None, "actor rank 0 must be the gloo checkpoint engine master"
        senders = [0] + [-1] * (actor_wg_world_size - 1)
        members = [metadata[0]] + list(metadata[actor_wg_world_size:])
        world_size = 1 + rollout_world_size
        fingerprint = hashlib.sha1("/".join(m.engine_id for m in members).encode()).hexdigest()
        common = {"world_size": world_size, "master_metadata": master, "fingerprint": fingerprint}
        actor_kwargs = {"rank": senders, **{k: [v] * actor_wg_world_size for k, v in common.items()}}
        rollout_kwargs = {"rank": list(range(1, world_size)),
                          **{k: [v] * rollout_world_size for k, v in common.items()}}
        return actor_kwargs, rollout_kwargs

    def init_process_group(self, rank: int, world_size: int, master_metadata: MasterMetadata,
                           fingerprint: str) -> None:
        """Join (or keep) the transfer's gloo group.

        Every member decides from the same ``fingerprint`` whether the previous group still
        fits, so all of them rebuild together or none does; a rebuilt group rendezvous under the
        master's fresh nonce.
        """
        self.rank, self.world_size = rank, world_size
        if rank < 0:
            return
        if not self.rebuild_group and self.group is not None and self._group_key == fingerprint:
            return
        self.group = None  # drop the old group's connections before opening new ones
        store: dist.Store
        if self.is_master:
            assert self.store is not None
            store = self.store
        else:
            store = dist.TCPStore(master_metadata.host, master_metadata.port, is_master=False,
                                  timeout=self.timeout)
        prefixed = dist.PrefixStore(f"rlweave_gloo_ckpt/{master_metadata.nonce}", store)
        self.group = self._new_gloo_group(prefixed, rank, world_size)
        self._group_key = fingerprint
        logger.info("gloo checkpoint engine: joined group as rank %d of %d", rank, world_size)

    def _new_gloo_group(self, store: dist.Store, rank: int, world_size: int) -> dist.ProcessGroupGloo:
        """A gloo group outside ``torch.distributed``'s default world.

        Trainer and rollout processes each already belong to their own default group (FSDP's,
        and the one verl's ``CheckpointEngineWorker`` opens), so ``dist.new_group`` cannot span
        them; a ``ProcessGroupGloo`` on its own store can. Its socket binds to ``self.host``
        unless ``GLOO_SOCKET_IFNAME`` names an interface, as it does for torch's own groups.
        """
        if os.environ.get("GLOO_SOCKET_IFNAME"):
            return dist.ProcessGroupGloo(store, rank, world_size, timeout=self.timeout)
        options = dist.ProcessGroupGloo._Options()
        options._timeout = self.timeout
        options._devices = [dist.ProcessGroupGloo.create_device(hostname=self.host)]
        return dist.ProcessGroupGloo(store, rank, world_size, options)

    def finalize(self) -> None:
        """Free the buckets; drop the group too when ``rebuild_group`` is set."""
        if self.rebuild_group:
            self.group = None
            self._group_key = None
        self.send_buf = None
        self.recv_buf = None

    # ---- transfer -------------------------------------------------------------------------

    @torch.no_grad()
    async def send_weights(self, weights: Weights, global_steps: int | None = None) -> dict[str, float]:
        """Broadcast ``weights`` bucket by bucket; returns transfer metrics for the trainer's log.

        verl merges what actor workers return from ``update_weights`` into the step's metrics,
        so ``checkpoint_engine/gloo/*`` shows in the console line of every step that synced.
        """
        assert self.rank is not None and self.rank <= 0, "rollout workers do not send weights"
        if self._stage_next:
            self._stage_next = False
            return await self._stage(weights)
        if self.rank < 0:
            async for _ in ensure_async_iterator(weights):
                pass
            return {}
        assert self.group is not None and self.send_buf is not None and self.recv_buf is not None

        start = time.perf_counter()
        send_buf, spare_buf = self.send_buf, self.recv_buf
        in_flight: _BucketBroadcast | None = None
        bucket_meta: list[TensorMeta] = []
        offset, total_bytes, buckets, tensors = 0, 0, 0, 0

        async def flush(is_last: bool) -> None:
            nonlocal in_flight, send_buf, spare_buf, bucket_meta, offset, total_bytes, buckets
            if in_flight is not None:  # its buffer is the one we are about to fill next
                await in_flight.wait_for_complete()
            in_flight = _BucketBroadcast(self.group, 0, send_buf[:offset],
                                         {"bucket_meta": bucket_meta, "is_last": is_last})
            total_bytes += offset
            buckets += 1
            send_buf, spare_buf = spare_buf, send_buf
            bucket_meta, offset = [], 0

        async for tensor_meta, chunk in split_weight_chunks(weights, self.bucket_size):
            if offset + tensor_meta.chunk_size > self.bucket_size:
                await flush(is_last=False)
            tensor_meta.offset = offset
            bucket_meta.append(tensor_meta)
            send_buf[offset : offset + tensor_meta.chunk_size].copy_(chunk)
            offset += tensor_meta.chunk_size
            tensors += tensor_meta.chunk_offset == 0
        await flush(is_last=True)
        assert in_flight is not None
        await in_flight.wait_for_complete()

        seconds = time.perf_counter() - start
        logger.info("gloo checkpoint engine: sent %d tensors, %d bytes in %d buckets, %.3fs",
                    tensors, total_bytes, buckets, seconds)
        prefix = "checkpoint_engine/gloo"
        return {f"{prefix}/send_s": seconds, f"{prefix}/bytes": float(total_bytes),
                f"{prefix}/buckets": float(buckets), f"{prefix}/tensors": float(tensors)}

    @torch.no_grad()
    async def receive_weights(
        self, global_steps: int | None = None
    ) -> AsyncGenerator[tuple[str, torch.Tensor], None]:
        """Yield ``(name, tensor)`` as buckets arrive, or the staged weights after ``receive_staged``.

        A yielded tensor may be a view into a bucket buffer that the next bucket overwrites, so
        it is valid only until the consumer asks for the next weight; verl's rollout adapters
        copy each weight as they receive it, as they must for the NCCL engine too.
        """
        if self._staged is not None:
            staged, self._staged = self._staged, None
            for name, weight in await staged if isinstance(staged, ray.ObjectRef) else staged:
                yield name, weight
            return
        async for name, weight in merge_weight_chunks(self._receive_chunks(), self.bucket_size):
            yield name, weight

    # ---- staged transfer --------------------------------------------------------------------

    def stage_next(self) -> None:
        """Make this sender's next ``send_weights`` stage the weights instead of broadcasting."""
        self._stage_next = True

    def receive_staged(self, staged: Any) -> None:
        """Make this receiver's next ``receive_weights`` yield ``staged``: the ``(name, tensor)``
        list a staged ``send_weights`` put in the object store, or its reference."""
        self._staged = staged

    async def _stage(self, weights: Weights) -> dict[str, Any]:
        """Put ``weights`` into the object store (a copy: the trainer may step right after)."""
        if self.rank != 0:  # the other actor ranks only take part in the weights' gathers
            async for _ in ensure_async_iterator(weights):
                pass
            return {}
        start = time.perf_counter()
        named = [(name, tensor.detach().cpu()) async for name, tensor in ensure_async_iterator(weights)]
        staged = ray.put(named)
        seconds = time.perf_counter() - start
        total = float(sum(t.numel() * t.element_size() for _, t in named))
        return {STAGED_KEY: staged, "checkpoint_engine/gloo/stage_s": seconds, "checkpoint_engine/gloo/bytes": total}

    async def _receive_chunks(self) -> AsyncGenerator[tuple[TensorMeta, torch.Tensor], None]:
        assert self.rank is not None and self.rank > 0, "only rollout workers receive weights"
        assert self.group is not None and self.send_buf is not None and self.recv_buf is not None
        start = time.perf_counter()
        ready_buf, next_buf = self.send_buf, self.recv_buf
        total_bytes = 0

        op = _BucketBroadcast(self.group, self.rank, ready_buf)
        metadata = await op.wait_for_complete()
        total_bytes += op.length
        while True:
            # Receive the next bucket into the other buffer while this one is being consumed.
            following = None if metadata["is_last"] else _BucketBroadcast(self.group, self.rank, next_buf)
            for tensor_meta in metadata["bucket_meta"]:
                yield tensor_meta, ready_buf[tensor_meta.offset : tensor_meta.offset + tensor_meta.chunk_size]
            if following is None:
                break
            metadata = await following.wait_for_complete()
            total_bytes += following.length
            ready_buf, next_buf = next_buf, ready_buf

        logger.info("gloo checkpoint engine: rank %d received %d bytes in %.3fs",
                    self.rank, total_bytes, time.perf_counter() - start)
