"""ReLibra's placement applied in Megatron-core: a MoE layer over physical expert *slots*.

Design (why it looks like this): Megatron's dispatchers and experts assume a fixed, contiguous
block of ``num_moe_experts / ep`` experts per rank and are not spec slots we could swap. So the
layer is built as an ordinary ``MoELayer`` with ``R * S`` *physical* experts (``S`` slots per EP
rank, from the ``rlweave_expert_topology`` hook), while its router (Megatron's own, and its
``RouterReplay``) stays over the ``E`` *logical* experts. After routing, the logical
``routing_map``/``probs`` [tokens, E] are mapped onto the slots [tokens, R*S]; Megatron's
dispatcher, experts and combine then run unmodified. Nothing in Megatron is patched.

Slots: the first ``E / R`` slots of each rank are *home* slots, each holding one expert's
weights (its owner copy, updated by the optimizer); the rest are spare slots for replicas.

Per step (:func:`rebalance_step`, where the trainer knows the step's replayed routing):
``rlweave_expert_step_placement`` may move experts between home slots (their weights, ``.grad``
and optimizer state travel with them) and may put *step replicas* in spare slots. A step
replica is copied from its owner once (the weights do not change between a step's
micro-batches), serves tokens in every micro-batch of the step, accumulates its gradient over
them, and after the step's last backward (the ``M``-th of the ``M`` micro-batches announced) its
gradient is added into the owner's ``.grad`` and the slot is emptied. An optimizer step before
that is caught: the next forward finds the owners' weights changed and raises, and so does the
next ``rebalance_step`` when only some of the announced backward passes ran.

One home layout per expert-data-parallel group: its ranks hold the same slots, and Megatron
reduces (DDP) or shards (distributed optimizer) each slot's gradient over them, so the step plan
comes from the step's loads summed over that group and is the same in every EP group of it.
Replicas fold into their owners before that reduction.

Per micro-batch and layer (``route``):
1. the routing of the whole EP group is gathered and handed to
   ``rlweave_expert_microbatch_placement`` with the step's layout, which may put further
   replicas of hot experts into the spare slots left. With replayed routing this happens
   ahead, for all layers at once, in :func:`prepare_microbatch` (where the trainer sets the
   micro-batch's replay data), off the layer's critical path;
2. those micro-batch replicas receive their owner's weights (one point-to-point message each);
3. each logical expert's tokens are split among its slots deterministically: its tokens in EP
   rank order, then token order, are cut at ``round(cumsum(token_share) * n)``, so every routed
   token goes to exactly one slot and the gate probability stays differentiable;
4. after the layer's backward, micro-batch replica gradients are sent to and added into the
   owner's ``.grad``, and the replica's ``.grad`` is cleared (so an optimizer never steps a
   replica).

Under verl, :mod:`rlweave.adapters.verl.router_replay` calls :func:`rebalance_step` and
:func:`prepare_microbatch` where verl's Megatron engine hands the step's and each
micro-batch's replayed routing to Megatron.

Under Megatron's ``DistributedDataParallel`` (:mod:`rlweave.adapters.megatron.balanced_ddp`):
spare slots stay out of DDP's buffers and the optimizer (their gradients live in ``.grad``), an
owner's gradient lives in DDP's ``main_grad`` buffer, and replica gradients are added there in
the layer's backward, so before ``finalize_model_grads`` reduces the buffers over the
expert-data-parallel group. An owner's move carries ``main_grad`` and the optimizer's state
(under the distributed optimizer: its fp32 main-parameter and Adam shards,
:mod:`rlweave.adapters.megatron.sharded_expert_state`).

Limits (each fails loudly, none silently): ``SequentialMLP`` experts (``moe_grouped_gemm=False``),
expert tensor parallelism 1, every token routed to exactly ``top_k`` experts (no capacity
dropping), one micro-batch's forward and backward before the next forward of the layer
(Megatron's no-pipelining schedule), a ``torch.optim`` optimizer over the layer's parameters or
Megatron's, non-distributed or distributed with Adam, DDP without ``overlap_grad_reduce`` or
``overlap_param_gather``. Checkpoints are logical: Megatron's distributed checkpoint
(``sharded_state_dict``) holds each expert under its logical id, as Megatron's own layer saves it,
and mbridge's weight export names them by logical id (``rlweave.patches.verl_megatron_layer_spec``);
a plain ``state_dict`` holds physical slots (:meth:`ReplayBalancedMoELayer.logical_expert_state`
reads them by logical id).
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
import weakref
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
from megatron.core.transformer.moe.experts import SequentialMLP
from megatron.core.transformer.moe.moe_utils import get_default_pg_collection

from rlweave.adapters.megatron.moe_layer import RlweaveMoELayer
from rlweave.adapters.megatron.sharded_expert_state import ShardedExpertState, distributed_optimizers
from rlweave.adapters.megatron.slot_transfer import flatten, transfer, unflatten_into
from rlweave.host import get_host
from rlweave.types import ExpertPlacement, ExpertTopology, RoutingTrace


class PlacementError(ValueError):
    """A placement the layer cannot apply (wrong shape, lost tokens, moved owners mid-step)."""


def _logical_router(builder: Any, logical_config: Any, **kwargs: Any) -> Any:
    """Build Megatron's router over the logical experts, whatever config the layer passes."""
    kwargs["config"] = logical_config
    return builder(**kwargs)


class _ReduceReplicaGrads(torch.autograd.Function):
    """Identity on the layer's input; its backward runs once the whole layer's backward has
    (every expert weight gradient of the layer is accumulated by then), and reduces replica
    gradients into their owners. ``anchor`` makes it run even when the input needs no grad."""

    @staticmethod
    def forward(ctx: Any, hidden: torch.Tensor, anchor: torch.Tensor, ticket: _Ticket) -> torch.Tensor:
        ctx.ticket = ticket
        return hidden.view_as(hidden)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor | None, None, None]:
        ctx.ticket.finish()
        return (grad if ctx.needs_input_grad[0] else None), None, None


@dataclasses.dataclass(frozen=True)
class _MicrobatchPlan:
    """One layer's placement for one micro-batch, with the EP group's tokens per expert
    (``counts`` [R, E], by EP rank) that the deterministic token split needs."""

    physical_to_logical: np.ndarray
    token_share: np.ndarray
    counts: torch.Tensor


class _Ticket:
    """One micro-batch's forward awaiting its backward, with the replicas it used."""

    def __init__(self, layer: ReplayBalancedMoELayer) -> None:
        self.layer = layer
        self.step = layer._step  # the step whose backward count it adds to
        self.replicas: list[tuple[int, int]] = []  # micro-batch replicas: (replica slot, owner slot)
        self.done = False

    def finish(self) -> None:
        if not self.done:
            self.done = True
            self.layer._after_backward(self)


class ReplayBalancedMoELayer(RlweaveMoELayer):
    """Megatron's ``MoELayer`` with ReLibra's expert placement applied (see the module doc)."""

    def __init__(self, config: Any, submodules: Any = None, layer_number: int | None = None,
                 pg_collection: Any = None, is_mtp_layer: bool = False, name: str | None = None) -> None:
        pg_collection = pg_collection if pg_collection is not None else get_default_pg_collection()
        ep_size = pg_collection.ep.size()
        if pg_collection.expt_tp is not None and pg_collection.expt_tp.size() > 1:
            raise NotImplementedError("rlweave.replay_balance: expert tensor parallelism > 1 is not supported yet")
        experts = config.num_moe_experts
        topology = get_host().hook.rlweave_expert_topology(num_logical_experts=experts, ep_size=ep_size,
                                                           expert_bytes=_expert_bytes(config))
        if topology is None:
            topology = ExpertTopology(experts, 1, ep_size, experts // ep_size)
        if topology.num_ranks != ep_size or topology.num_logical_experts != experts:
            raise PlacementError(f"topology {topology} does not describe {experts} experts on {ep_size} EP ranks")
        physical = dataclasses.replace(config, num_moe_experts=topology.num_ranks * topology.slots_per_rank)
        router = functools.partial(_logical_router, submodules.router, config)
        super().__init__(physical, dataclasses.replace(submodules, router=router), layer_number,
                         pg_collection, is_mtp_layer, name)
        if not isinstance(self.experts, SequentialMLP):
            raise NotImplementedError("rlweave.replay_balance needs SequentialMLP experts: build the spec "
                                      "with moe_grouped_gemm=False")
        self.logical_config = config
        self.topology = topology
        self.home_slots = experts // ep_size
        self.ep_rank = pg_collection.ep.rank()
        self.expt_dp_group = _expert_data_parallel_group(pg_collection)
        static = np.arange(experts)
        self.physical_to_logical = np.full(topology.num_ranks * topology.slots_per_rank, -1)
        self.physical_to_logical[self._home_slot_ids()] = static  # Megatron's contiguous layout
        self.token_share = (self.physical_to_logical >= 0).astype(float)  # of the step's layout
        self._anchor = torch.empty(0, requires_grad=True)
        self._in_flight: weakref.WeakSet[_Ticket] = weakref.WeakSet()
        self._ticket: _Ticket | None = None
        self._prepared: _MicrobatchPlan | None = None  # from prepare_microbatch, for the next forward
        self._step = 0  # steps begun by rebalance_step
        self._step_replicas: list[tuple[int, int]] = []  # (replica slot, owner slot), kept for the step
        self._step_micro_batches = 0  # given to rebalance_step
        self._backwards_left = 0  # of the step's micro-batches, before its replicas' gradients fold
        self._home_versions: list[tuple[torch.Tensor, int]] = []  # this rank's owners, while step replicas live
        self.last_physical_to_logical = self.physical_to_logical.copy()  # of the last micro-batch
        self.last_token_share = self.token_share.copy()
        self.ddp_state = "none"  # "held out" / "released": rlweave.adapters.megatron.balanced_ddp
        self.distributed_optimizer = False  # DDP's use_distributed_optimizer, set by release_spare_slots
        self._load_prefix = ""
        self.register_load_state_dict_pre_hook(self._remember_load_prefix)
        self.register_load_state_dict_post_hook(self._spares_need_no_state)

    # ----- layout -----------------------------------------------------------------------------
    @property
    def slots_per_rank(self) -> int:
        return self.topology.slots_per_rank

    def _home_slot_ids(self) -> np.ndarray:
        """Physical ids of the home slots, rank-major: [E]."""
        s = self.slots_per_rank
        return (np.arange(self.topology.num_ranks)[:, None] * s + np.arange(self.home_slots)).ravel()

    def owner_slot(self) -> np.ndarray:
        """Home slot of each logical expert [E]."""
        home = self._home_slot_ids()
        owner = np.empty(self.topology.num_logical_experts, dtype=int)
        owner[self.physical_to_logical[home]] = home
        return owner

    def _slot_params(self, slot: int) -> list[torch.nn.Parameter]:
        local = slot - self.ep_rank * self.slots_per_rank
        return list(self.experts.local_experts[local].parameters())

    def _local(self, slot: int) -> bool:
        return slot // self.slots_per_rank == self.ep_rank

    def current_placement(self) -> ExpertPlacement:
        """The step's layout in force (home slots and step replicas) with its token split, as a
        one-layer placement."""
        return ExpertPlacement(self.physical_to_logical.copy()[None], self.token_share.copy()[None])

    # ----- logical weights (checkpoints, tests) -----------------------------------------------
    def logical_expert_state(self, grads: bool = False) -> dict[int, list[torch.Tensor]]:
        """This rank's owned experts: logical id -> parameter tensors (``SequentialMLP`` order),
        or their gradients with ``grads``."""
        out = {}
        for slot in self._home_slot_ids()[self.ep_rank * self.home_slots:][: self.home_slots]:
            params = self._slot_params(slot)
            out[int(self.physical_to_logical[slot])] = [_grad_of(p) if grads else p.detach() for p in params]
        return out

    def sharded_state_dict(self, prefix: str = "", sharded_offsets: tuple = (), metadata: dict | None = None) -> dict:
        """Megatron's distributed-checkpoint state with the experts by logical id, spare slots
        not saved (:func:`rlweave.adapters.megatron.logical_experts.logical_expert_shards`)."""
        from rlweave.adapters.megatron.logical_experts import logical_expert_shards

        state = super().sharded_state_dict(prefix, sharded_offsets, metadata)
        experts = f"{prefix}experts."
        state = {key: value for key, value in state.items() if not key.startswith(experts)}
        return state | logical_expert_shards(self, experts, sharded_offsets, metadata)

    def _remember_load_prefix(self, module: Any, state_dict: Any, prefix: str, *args: Any) -> None:
        self._load_prefix = prefix

    def _spares_need_no_state(self, module: Any, incompatible: Any) -> None:
        """A checkpoint without spare slots (the logical one of :meth:`sharded_state_dict`, or
        Megatron's layer's) loads strictly: a spare slot holds a replica, copied from its owner
        before it serves tokens, so it has nothing to load."""
        spares = tuple(f"{self._load_prefix}experts.local_experts.{s}."
                       for s in range(self.home_slots, self.slots_per_rank))
        incompatible.missing_keys[:] = [key for key in incompatible.missing_keys if not key.startswith(spares)]

    @torch.no_grad()
    def load_logical_expert_state(self, experts: dict[int, list[torch.Tensor]]) -> None:
        """Load the owned experts of this rank from logical id -> parameter tensors."""
        for e, slot in enumerate(self.owner_slot()):
            if slot // self.slots_per_rank == self.ep_rank:
                for p, value in zip(self._slot_params(slot), experts[e], strict=True):
                    p.copy_(value)

    # ----- per micro-batch ----------------------------------------------------------------------
    def forward(self, hidden_states: torch.Tensor, intermediate_tensors: Any = None,
                padding_mask: torch.Tensor | None = None) -> Any:
        self._ticket = None
        self._check_ddp()
        if any(p._version != version for p, version in self._home_versions):
            raise RuntimeError("rlweave.replay_balance: an expert's weights changed since its step replicas were "
                               "copied (an optimizer step or a weight load before the step's last backward); "
                               "give rebalance_step the number of micro-batches the step runs, and call it "
                               "before every step")
        if torch.is_grad_enabled():
            self._ticket = _Ticket(self)
            self._in_flight.add(self._ticket)
            hidden_states = _ReduceReplicaGrads.apply(hidden_states, self._anchor, self._ticket)
        return super().forward(hidden_states, intermediate_tensors, padding_mask)

    def spare_params(self) -> list[torch.nn.Parameter]:
        """This rank's spare-slot parameters (replicas only: never in DDP or an optimizer)."""
        first = self.ep_rank * self.slots_per_rank
        return [p for s in range(first + self.home_slots, first + self.slots_per_rank) for p in self._slot_params(s)]

    def _check_ddp(self) -> None:
        """Megatron's DDP must hold the owners only, set up by balanced_ddp (module doc there)."""
        under_ddp = hasattr(self._slot_params(self.ep_rank * self.slots_per_rank)[0], "main_grad")
        spares_in_ddp = any(hasattr(p, "main_grad") for p in self.spare_params())
        if spares_in_ddp or (under_ddp and self.ddp_state != "released") or self.ddp_state == "held out":
            raise NotImplementedError(
                "rlweave.replay_balance under Megatron's DistributedDataParallel: its spare (replica) slots must stay "
                "out of DDP and the optimizer; build DDP and the optimizer between "
                "rlweave.adapters.megatron.balanced_ddp.hold_out_spare_slots(model) and release_spare_slots(ddp_chunks)")

    def route(self, hidden_states: torch.Tensor, padding_mask: torch.Tensor | None = None) -> Any:
        probs, routing_map = super().route(hidden_states, padding_mask)  # logical [T, E]
        topk = self.logical_config.moe_router_topk
        if not bool((routing_map.sum(dim=1) == topk).all()):
            raise NotImplementedError("rlweave.replay_balance needs every token routed to exactly top_k "
                                      "experts (no capacity dropping or padding masks yet)")
        rank = dist.get_rank(self.ep_group)
        plan, self._prepared = self._prepared, None
        if plan is None:  # not prepared ahead (learned routing): gather and plan now
            ids = torch.topk(routing_map.to(torch.int8), topk, dim=1, sorted=False).indices
            plan = self._plan(_gather_rows(ids, self.ep_group))
        elif not torch.equal(routing_map.sum(dim=0).cpu(), plan.counts[rank]):
            raise PlacementError("this micro-batch's routing is not the one given to prepare_microbatch; "
                                 "prepare each micro-batch right before its forward, with its replay data")
        self.last_physical_to_logical, self.last_token_share = plan.physical_to_logical, plan.token_share
        replicas = self._copy_replicas(plan.physical_to_logical)
        if self._ticket is not None:
            self._ticket.replicas = replicas
        before = plan.counts[:rank].sum(dim=0)  # tokens of each expert on lower EP ranks
        return self._to_physical(probs, routing_map, plan.physical_to_logical, plan.token_share, before,
                                 plan.counts.sum(dim=0))

    def _plan(self, ids_per_rank: list[torch.Tensor]) -> _MicrobatchPlan:
        """Ask the plugin where experts live for a micro-batch whose routing ([T_r, k] per EP
        rank) is known, and check the answer."""
        trace = RoutingTrace(torch.cat(ids_per_rank).numpy()[:, None, :], (0, sum(len(i) for i in ids_per_rank)),
                             source=f"megatron-layer-{self.layer_number}")
        placement = get_host().hook.rlweave_expert_microbatch_placement(
            trace=trace, topology=self.topology, current=self.current_placement())
        p2l, share = self._check_microbatch(placement)
        counts = torch.stack([torch.bincount(i.reshape(-1), minlength=self.topology.num_logical_experts)
                              for i in ids_per_rank])
        return _MicrobatchPlan(p2l, share, counts)

    def _check_microbatch(self, placement: ExpertPlacement | None) -> tuple[np.ndarray, np.ndarray]:
        layout = self.physical_to_logical
        if placement is None:
            return layout.copy(), self.token_share.copy()
        p2l, share = np.asarray(placement.physical_to_logical), np.asarray(placement.token_share, dtype=float)
        if p2l.shape != (1, layout.size) or share.shape != p2l.shape:
            raise PlacementError(f"a micro-batch placement must be [1, {layout.size}] (slots of this layer), "
                                 f"got {p2l.shape} and {share.shape}")
        p2l, share = p2l[0], share[0]
        kept = layout >= 0
        if not np.array_equal(p2l[kept], layout[kept]):
            raise PlacementError("a micro-batch placement keeps the step's layout (home slots and step replicas) "
                                 "and may only fill empty slots; moving owners and step replicas happens per "
                                 "step (rlweave_expert_step_placement)")
        _check_shares(p2l, share, self.topology)
        return p2l, share

    @torch.no_grad()
    def _copy_replicas(self, p2l: np.ndarray) -> list[tuple[int, int]]:
        """Copy this micro-batch's replicas (the slots it fills beyond the step's layout) from their
        owners. Returns them as (replica slot, owner slot)."""
        owner = self.owner_slot()
        new = np.nonzero((p2l >= 0) & (self.physical_to_logical < 0))[0]
        replicas = [(int(s), int(owner[p2l[s]])) for s in new]
        if replicas and any(not t.done for t in self._in_flight if t is not self._ticket):
            raise RuntimeError("rlweave.replay_balance: a micro-batch's backward must run before the next "
                               "forward of the same MoE layer when replicas are in use (no-pipelining "
                               "schedule); this forward would overwrite replica weights still needed")
        self._copy_weights(replicas)
        return replicas

    def _copy_weights(self, replicas: list[tuple[int, int]]) -> None:
        transfer([(o, s) for s, o in replicas], self.slots_per_rank, self.ep_group,
                 lambda slot: flatten(self._slot_params(slot)),
                 lambda slot, flat: unflatten_into(flat, self._slot_params(slot)))

    def _to_physical(self, probs: torch.Tensor, routing_map: torch.Tensor, p2l: np.ndarray,
                     share: np.ndarray, before: torch.Tensor, total: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Logical [T, E] probs/map -> physical [T, R*S]; expert e's j-th token of the EP group
        goes to the slot whose cut interval holds j."""
        experts, device = self.topology.num_logical_experts, routing_map.device
        index = torch.cumsum(routing_map.to(torch.int64), dim=0) - 1 + before.to(device)  # [T, E] group-wide
        lo, hi = np.zeros(p2l.size), np.zeros(p2l.size)
        for e in range(experts):
            slots = np.nonzero(p2l == e)[0]
            cuts = np.rint(np.concatenate([[0.0], np.cumsum(share[slots])]) * int(total[e]))
            cuts[-1] = int(total[e])
            lo[slots], hi[slots] = cuts[:-1], cuts[1:]
        column = torch.as_tensor(np.maximum(p2l, 0), device=device)
        used = torch.as_tensor(p2l >= 0, device=device)
        slot_index = index[:, column]
        mask = (routing_map[:, column] & used & (slot_index >= torch.as_tensor(lo, device=device))
                & (slot_index < torch.as_tensor(hi, device=device)))
        return probs[:, column] * mask.to(probs.dtype), mask

    def _after_backward(self, ticket: _Ticket) -> None:
        """A micro-batch's backward of this layer is done: fold its micro-batch replicas'
        gradients into the owners, and after the step's last one its step replicas' too."""
        replicas = list(ticket.replicas)
        if self._step_replicas and ticket.step == self._step:
            self._backwards_left -= 1
            if self._backwards_left == 0:
                replicas += self._step_replicas
                self._release_step_replicas()
        self._reduce_replica_grads(replicas)

    def _release_step_replicas(self) -> None:
        """Empty the step replicas' slots (their weights are stale once the optimizer steps)."""
        homes = self._home_slot_ids()
        kept = np.isin(np.arange(self.physical_to_logical.size), homes)
        self.physical_to_logical = np.where(kept, self.physical_to_logical, -1)
        self.token_share = kept.astype(float)
        self._step_replicas, self._home_versions, self._backwards_left = [], [], 0

    @torch.no_grad()
    def _reduce_replica_grads(self, replicas: list[tuple[int, int]]) -> None:
        """Add each replica's gradient into its owner's (``main_grad`` under Megatron's DDP, else
        ``.grad``); clear the gradients of the spare slots but the step replicas still in use
        (Megatron's experts give an unused slot a zero gradient, which an optimizer would step).
        Runs in the layer's backward, so before DDP reduces ``main_grad`` in
        ``finalize_model_grads`` (with ``overlap_grad_reduce`` off, which balanced_ddp checks)."""
        def read(slot: int) -> torch.Tensor:
            return flatten([p.grad if p.grad is not None else torch.zeros_like(p) for p in self._slot_params(slot)])

        def add(slot: int, flat: torch.Tensor) -> None:
            params = self._slot_params(slot)
            for p in params:
                if _grad_of(p) is None:
                    p.grad = torch.zeros_like(p)
            unflatten_into(flat, [_grad_of(p) for p in params], add=True)

        transfer(replicas, self.slots_per_rank, self.ep_group, read, add)
        first = self.ep_rank * self.slots_per_rank
        kept = {slot for slot, _ in self._step_replicas}  # still accumulating over the step
        for slot in range(first + self.home_slots, first + self.slots_per_rank):  # spare slots, even unused ones
            if slot not in kept:
                for p in self._slot_params(slot):
                    p.grad = None

    # ----- per step -----------------------------------------------------------------------------
    @torch.no_grad()
    def move_homes(self, new_p2l: np.ndarray, optimizer: Any = None) -> int:
        """Move experts to the home slots of ``new_p2l`` [R*S] with their weights, gradient
        (``main_grad`` under DDP, else ``.grad``) and, given ``optimizer``, its state: per
        parameter for ``torch.optim`` or Megatron's non-distributed one (of the fp32
        ``main_param`` where Megatron keeps one), the fp32 main-parameter and Adam shards for
        Megatron's distributed one (:mod:`rlweave.adapters.megatron.sharded_expert_state`).
        Returns the number of experts moved."""
        old_owner = self.owner_slot()
        homes = self._home_slot_ids()
        new_owner = np.empty_like(old_owner)
        new_owner[new_p2l[homes]] = homes
        moves = [(int(a), int(b)) for a, b in zip(old_owner, new_owner, strict=True) if a != b]
        if not moves:
            return 0
        local = [p for s in homes if s // self.slots_per_rank == self.ep_rank for p in self._slot_params(s)]
        sharded = self._sharded_state(moves, optimizer)
        plain = optimizer is not None and sharded is None
        state = _optimizer_state(optimizer, [_master(p) for p in local]) if plain else {}
        keys = {tuple(sorted(k for k, v in state.get(_master(p), {}).items() if torch.is_tensor(v))) for p in local}
        if len(keys) > 1:
            raise RuntimeError("rlweave.replay_balance: the optimizer holds state for some experts of this layer "
                               "but not others, so it cannot move with them; rebalance before the first step or "
                               "after a step that updated every expert")
        names = keys.pop() if keys else ()
        with_grad = any(_grad_of(p) is not None for p in local)

        def pieces(slot: int) -> list[torch.Tensor]:
            out = []
            for p in self._slot_params(slot):
                if with_grad and _grad_of(p) is None:
                    p.grad = torch.zeros_like(p)
                out += [p.data] + ([_grad_of(p)] if with_grad else [])
                if sharded is not None:
                    out += sharded.tensors(p)
                    continue
                master = _master(p)
                out += [master.data] if master is not p else []
                out += [state[master][k] for k in names]
            return out

        transfer(moves, self.slots_per_rank, self.ep_group, lambda s: flatten(pieces(s)),
                 lambda s, flat: unflatten_into(flat, pieces(s)))
        if sharded is not None:
            sharded.keep_owned([p for _, target in moves if self._local(target) for p in self._slot_params(target)])
        self._prepared = None  # planned against the old homes
        self.physical_to_logical = np.where(np.isin(np.arange(new_p2l.size), homes), new_p2l, -1)
        return len(moves)

    def _sharded_state(self, moves: list[tuple[int, int]], optimizer: Any) -> ShardedExpertState | None:
        """Under Megatron's distributed optimizer: the moved slots' whole main-parameter and Adam
        state on this rank (every rank of the expert-data-parallel group makes the same moves)."""
        optimizers = distributed_optimizers(optimizer) if optimizer is not None else []
        if not optimizers:
            if self.ddp_state == "released" and self.distributed_optimizer:
                raise NotImplementedError("rlweave.replay_balance under Megatron's distributed optimizer moves an "
                                          "expert's main-parameter and Adam shards with it: give rebalance_step "
                                          "the optimizer")
            return None
        slots = {s for move in moves for s in move if self._local(s)}
        return ShardedExpertState(optimizers, [p for s in sorted(slots) for p in self._slot_params(s)])

    def end_unfinished_step(self) -> None:
        """Before a new step: drop the last step's replicas if none of its micro-batches ran a
        backward (nothing to fold); refuse if only some did (their gradients would be lost)."""
        if self._step_replicas and self._backwards_left != self._step_micro_batches:
            raise RuntimeError(f"rlweave.replay_balance: the last step ran the backward of "
                               f"{self._step_micro_batches - self._backwards_left} of the {self._step_micro_batches} "
                               f"micro-batches given to rebalance_step, so its step replicas' gradients never "
                               f"reached their owners; give rebalance_step the step's micro-batches exactly")
        self._release_step_replicas()
        self._prepared = None

    @torch.no_grad()
    def begin_step(self, layout: np.ndarray, token_share: np.ndarray, micro_batches: int,
                   optimizer: Any = None) -> int:
        """Apply a step placement: move owners to the home slots of ``layout`` [R*S] (weights,
        ``.grad``, optimizer state), then copy its step replicas (spare slots it fills) from them,
        to be kept for ``micro_batches`` backward passes. Returns the number of experts moved."""
        self.end_unfinished_step()
        homes = self._home_slot_ids()
        if sorted(layout[homes].tolist()) != list(range(self.topology.num_logical_experts)):
            raise PlacementError(f"a step placement's home slots must hold every expert once, got {layout[homes].tolist()}")
        _check_shares(layout, token_share, self.topology)
        moved = self.move_homes(layout, optimizer)
        owner = self.owner_slot()
        spare = np.setdiff1d(np.nonzero(layout >= 0)[0], homes)
        replicas = [(int(s), int(owner[layout[s]])) for s in spare] if micro_batches else []
        self._copy_weights(replicas)
        self._step += 1
        if replicas:
            self.physical_to_logical, self.token_share = layout.copy(), token_share.copy()
            self._step_replicas, self._step_micro_batches = replicas, micro_batches
            self._backwards_left = micro_batches
            # Every rank's owners change when the optimizer steps, so each rank sees a step taken
            # too early alike, in its own forward, before any collective.
            self._home_versions = [(p, p._version) for s in homes if self._local(s) for p in self._slot_params(s)]
        return moved


def _grad_of(p: torch.Tensor) -> torch.Tensor | None:
    """Where ``p``'s gradient accumulates: DDP's ``main_grad`` buffer view, else ``.grad``."""
    return p.main_grad if hasattr(p, "main_grad") else p.grad


def _master(p: torch.Tensor) -> torch.Tensor:
    """The tensor the optimizer steps for ``p``: Megatron's fp32 ``main_param`` copy, if kept."""
    master = getattr(p, "main_param", None)
    return p if master is None else master


def _optimizer_state(optimizer: Any, params: list[torch.Tensor]) -> dict:
    """The per-parameter state of ``params`` in ``optimizer`` (``torch.optim``, or Megatron's
    chained non-distributed one over them)."""
    state = {id(p): o.state for o in _torch_optimizers(optimizer) for group in o.param_groups for p in group["params"]}
    if not all(id(p) in state for p in params):
        raise NotImplementedError("rlweave.replay_balance moves the optimizer state of this layer's experts: give "
                                  "rebalance_step the optimizer over the model's parameters")
    return {p: state[id(p)].get(p, {}) for p in params}


def _torch_optimizers(optimizer: Any) -> list[torch.optim.Optimizer]:
    """The ``torch.optim`` optimizers holding the state: ``optimizer`` itself, or those inside
    Megatron's (``ChainedOptimizer`` of ``FP32Optimizer``/``Float16OptimizerWithFloat16Params``)."""
    if isinstance(optimizer, torch.optim.Optimizer):
        return [optimizer]
    chained = getattr(optimizer, "chained_optimizers", None)
    if chained is not None:
        return [inner for o in chained for inner in _torch_optimizers(o)]
    if isinstance(getattr(optimizer, "optimizer", None), torch.optim.Optimizer):
        return [optimizer.optimizer]
    raise NotImplementedError(f"rlweave.replay_balance moves the state of a torch.optim optimizer or Megatron's "
                              f"non-distributed one, not of {type(optimizer).__name__}")


def _expert_data_parallel_group(pg_collection: Any) -> dist.ProcessGroup:
    """The group whose ranks hold the same expert slots (Megatron reduces slot gradients and
    shards optimizer state over it): the layer's own, else Megatron's global one."""
    group = getattr(pg_collection, "expt_dp", None)
    if group is None:
        from megatron.core import parallel_state

        get_group = parallel_state.get_expert_data_parallel_group
        # megatron-core 0.19 splits the group for GTP rematerialisation (its default is the wider
        # one); 0.18 has no such split and no keyword, so its one group is the right one.
        if "with_gtp_remat" in inspect.signature(get_group).parameters:
            return get_group(with_gtp_remat=False)
        group = get_group()
    return group


def _expert_bytes(config: Any) -> int:
    """Bytes of one SequentialMLP expert's weights: fc1 [F (x2 gated), H] and fc2 [H, F]."""
    ffn = config.moe_ffn_hidden_size or config.ffn_hidden_size
    params = ffn * config.hidden_size * (3 if config.gated_linear_unit else 2)
    return params * torch.finfo(config.params_dtype).bits // 8


def _check_shares(p2l: np.ndarray, share: np.ndarray, topology: ExpertTopology) -> None:
    """Every expert's shares are >= 0 and sum to 1; no rank holds an expert twice."""
    used = p2l >= 0
    if np.any(p2l >= topology.num_logical_experts) or np.any(share[used] < -1e-9):
        raise PlacementError(f"slots must hold expert ids below {topology.num_logical_experts} with shares >= 0")
    totals = np.bincount(p2l[used], weights=share[used], minlength=topology.num_logical_experts)
    if not np.allclose(totals, 1.0, atol=1e-6):
        raise PlacementError(f"each expert's token shares must sum to 1 (every token once), got {totals.round(4).tolist()}")
    per_rank = p2l.reshape(topology.num_ranks, -1)
    for r, row in enumerate(per_rank):
        held = row[row >= 0]
        if len(set(held.tolist())) != len(held):
            raise PlacementError(f"rank {r} holds an expert twice: {row.tolist()}")


def _gather_rows(rows: torch.Tensor, group: dist.ProcessGroup) -> list[torch.Tensor]:
    """All-gather a [n_r, k] tensor whose n_r differs by rank; returns each rank's rows."""
    size = torch.tensor([rows.shape[0]], device=rows.device)
    sizes = [torch.zeros_like(size) for _ in range(dist.get_world_size(group))]
    dist.all_gather(sizes, size, group=group)
    longest = int(max(sizes))
    padded = torch.zeros((longest, rows.shape[1]), dtype=torch.int64, device=rows.device)
    padded[: rows.shape[0]] = rows
    gathered = [torch.empty_like(padded) for _ in sizes]
    dist.all_gather(gathered, padded, group=group)
    return [g[: int(n)].cpu() for g, n in zip(gathered, sizes, strict=True)]


def balanced_layers(model: torch.nn.Module) -> list[ReplayBalancedMoELayer]:
    """The ReLibra MoE layers of ``model`` in module order (the layer axis of a step's trace)."""
    return [m for m in model.modules() if isinstance(m, ReplayBalancedMoELayer)]


def _gather_layers(layers: list[ReplayBalancedMoELayer], topk_ids: np.ndarray) -> list[torch.Tensor]:
    """All-gather this rank's [tokens, layers, k] routing over the EP group: [T_r, layers, k] per rank."""
    if topk_ids.ndim != 3 or topk_ids.shape[1] != len(layers):
        raise PlacementError(f"the routing must be [tokens, {len(layers)} layers, top_k] for the model's rlweave "
                             f"MoE layers, got {topk_ids.shape}")
    device = next(layers[0].router.parameters()).device  # NCCL gathers device tensors
    ids = torch.as_tensor(np.asarray(topk_ids, dtype=np.int64), device=device)
    rows = _gather_rows(ids.reshape(ids.shape[0], -1), layers[0].ep_group)
    return [r.reshape(len(r), *topk_ids.shape[1:]) for r in rows]


def _group_loads(step_ids: np.ndarray, offsets: list[int], experts: int, group: dist.ProcessGroup,
                 device: torch.device) -> np.ndarray:
    """Tokens per expert [M, layers, E] of the step's micro-batches summed over the expert-data-
    parallel group: every EP group of it gets the same loads, hence the same plan. Its ranks
    hold the same slots and Megatron sums (DDP) or shards (distributed optimizer) each slot over
    them, so a slot must hold the same expert in every EP group, or different experts'
    gradients would be added together."""
    m, layers = len(offsets) - 1, step_ids.shape[1]
    loads = np.zeros((m, layers, experts), dtype=np.int64)
    for i in range(m):
        for layer in range(layers):
            loads[i, layer] = np.bincount(step_ids[offsets[i] : offsets[i + 1], layer].ravel(), minlength=experts)
    if dist.get_world_size(group) == 1:
        return loads
    shape = torch.tensor([m, -m], device=device)
    dist.all_reduce(shape, op=dist.ReduceOp.MAX, group=group)
    if int(shape[0]) != -int(shape[1]):
        raise PlacementError(f"every expert-data-parallel replica must run the same number of micro-batches in a "
                             f"step; they run {-int(shape[1])} to {int(shape[0])} (this one {m})")
    total = torch.as_tensor(loads, device=device)
    dist.all_reduce(total, group=group)
    return total.cpu().numpy()


def prepare_microbatch(model: torch.nn.Module, topk_ids: np.ndarray) -> None:
    """Where the trainer hands a micro-batch's replay data to Megatron (verl:
    ``set_router_replay_data``): plan every layer's placement for it now, with one gather for all
    layers, instead of inside each layer's forward.

    ``topk_ids``: int [tokens, layers, top_k], this rank's tokens of the micro-batch, ``layers`` =
    :func:`balanced_layers` of ``model``. Every rank of the EP group calls it; the next forward of
    each layer uses the plan and checks that its routing is this one.
    """
    layers = balanced_layers(model)
    if not layers:
        return
    per_rank = _gather_layers(layers, topk_ids)
    for index, layer in enumerate(layers):
        layer._prepared = layer._plan([ids[:, index] for ids in per_rank])


def rebalance_step(model: torch.nn.Module, topk_ids: np.ndarray, microbatch_bounds: tuple[int, ...],
                   optimizer: Any = None) -> int:
    """Before a training step: hand the step's replayed routing to
    ``rlweave_expert_step_placement``, move experts to their new home slots and copy the step's
    replicas, kept until the last of its micro-batches has run its backward.

    ``topk_ids``: int [tokens, layers, top_k], this rank's tokens of the step (what Megatron's
    ``RouterReplay`` will replay), ``layers`` = :func:`balanced_layers` of ``model``;
    ``microbatch_bounds``: this rank's micro-batch offsets ``[0, ..., tokens]``. Every rank of
    the EP group and of the expert-data-parallel group calls it: the plan comes from the loads
    summed over the expert-data-parallel group (``group_loads``), so every EP group applies the
    same home layout. Returns the number of experts moved on all layers.
    """
    layers = balanced_layers(model)
    if not layers:
        return 0
    first = layers[0]
    group, topology = first.ep_group, first.topology
    bounds = np.asarray(microbatch_bounds)
    all_ids = _gather_layers(layers, topk_ids)
    device = next(first.router.parameters()).device
    all_bounds = _gather_rows(torch.as_tensor(bounds, device=device)[:, None], group)
    if len({len(b) for b in all_bounds}) != 1:
        raise PlacementError("every EP rank must run the same number of micro-batches")
    # The EP group's micro-batch m = every rank's m-th micro-batch, in rank order.
    chunks, offsets = [], [0]
    for m in range(len(bounds) - 1):
        for rows, b in zip(all_ids, all_bounds, strict=True):
            chunks.append(rows[int(b[m]) : int(b[m + 1])])
        offsets.append(offsets[-1] + sum(len(c) for c in chunks[-len(all_ids):]))
    step_ids = torch.cat(chunks).numpy()
    for layer in layers:
        layer.end_unfinished_step()
    current = ExpertPlacement(np.stack([layer.physical_to_logical for layer in layers]),
                              np.stack([layer.token_share for layer in layers]))
    placement = get_host().hook.rlweave_expert_step_placement(
        trace=RoutingTrace(step_ids, tuple(offsets), source="megatron-replay-step"),
        topology=topology, current=current,
        group_loads=_group_loads(step_ids, offsets, topology.num_logical_experts, first.expt_dp_group, device))
    if placement is None:
        return 0
    p2l, share = np.asarray(placement.physical_to_logical), np.asarray(placement.token_share, dtype=float)
    if p2l.shape != current.physical_to_logical.shape or share.shape != p2l.shape:
        raise PlacementError(f"a step placement must be {list(current.physical_to_logical.shape)} (layers, slots), like the "
                             f"placement in force; got {p2l.shape} and {share.shape}")
    return sum(layer.begin_step(layout, split, len(bounds) - 1, optimizer)
               for layer, layout, split in zip(layers, p2l, share, strict=True))
