"""An expert's optimizer state under Megatron's ``DistributedOptimizer``, made whole for a move.

The distributed optimizer cuts each gradient buffer into contiguous ranges, one per rank of
its data-parallel group (for experts: the expert-data-parallel group), that ignore parameter
boundaries; a rank keeps the fp32 main parameter and the Adam moments of its range only. When
an expert moves to a home slot with another local index, other ranks own its pieces there. So
for a move each parameter's state is first made whole on every rank of the group (each rank
fills the range it owns, one all-reduce adds them up), travels with the weights between EP
ranks, and each rank keeps the range it owns of the target slot.

Read and written through the optimizer's own accessors (``_get_model_param_range_map``,
``_get_main_param_and_optimizer_states``, ``_set_main_param_and_optimizer_states``: what its
reshardable checkpoint uses). What they return is checked once per move against the layout
handled here (fp32 ``param``, ``exp_avg``, ``exp_avg_sq`` over the owned range; scalar state
such as ``step`` stays with the target, all parameters step together).
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist

MOVED = ("param", "exp_avg", "exp_avg_sq")  # per element of the owned range, in this order


def distributed_optimizers(optimizer: Any) -> list[Any]:
    """The ``DistributedOptimizer``s in ``optimizer`` (itself, or inside a ``ChainedOptimizer``)."""
    from megatron.core.optimizer.distrib_optimizer import DistributedOptimizer

    if isinstance(optimizer, DistributedOptimizer):
        return [optimizer]
    return [inner for o in getattr(optimizer, "chained_optimizers", ()) for inner in distributed_optimizers(o)]


def _check_settings(holder: Any) -> None:
    """The settings whose state layout this module handles; any other is refused by name."""
    config = holder.config
    if config.optimizer != "adam":
        raise NotImplementedError(f"rlweave.replay_balance moves Adam's state under Megatron's distributed optimizer, "
                                  f"not {config.optimizer}'s: set optimizer='adam' in OptimizerConfig")
    for setting in ("use_precision_aware_optimizer", "optimizer_cpu_offload"):
        if getattr(config, setting, False):
            raise NotImplementedError(f"rlweave.replay_balance does not support {setting}=True with Megatron's "
                                      f"distributed optimizer yet (its state is not moved with an expert): set "
                                      f"{setting}=False in OptimizerConfig")


class ShardedExpertState:
    """The whole fp32 main parameter and Adam moments of ``params`` (the moved slots' parameters
    on this rank), gathered from the distributed optimizer's shards."""

    def __init__(self, optimizers: list[Any], params: list[torch.nn.Parameter]) -> None:
        self.holder = {p: self._holder(optimizers, p) for p in params}
        for holder in {id(h): h for h in self.holder.values()}.values():
            _check_settings(holder)
        self.whole = {p: torch.zeros(len(MOVED), p.numel(), dtype=torch.float32, device=p.device) for p in params}
        for p in params:
            _, owned = self._states(p)
            if owned:
                start, end = self._range(p)
                for key, piece in owned.items():
                    self.whole[p][MOVED.index(key), start:end] = piece.reshape(-1)
        for holder in {id(h): h for h in self.holder.values()}.values():
            mine = [p for p in params if self.holder[p] is holder]
            flat = torch.cat([self.whole[p].reshape(-1) for p in mine])
            dist.all_reduce(flat, group=holder.data_parallel_group)  # owned ranges are disjoint
            offset = 0
            for p in mine:
                self.whole[p].copy_(flat[offset : offset + self.whole[p].numel()].view_as(self.whole[p]))
                offset += self.whole[p].numel()

    @staticmethod
    def _holder(optimizers: list[Any], p: torch.nn.Parameter) -> Any:
        for o in optimizers:  # its buffers hold every parameter it shards, owned here or not
            if any(p in buffer.param_index_map for buffer in o.buffers):
                return o
        raise NotImplementedError("rlweave.replay_balance moves the distributed optimizer's state of this layer's "
                                  "experts: give rebalance_step the optimizer built over the model's DDP chunks")

    def _range(self, p: torch.nn.Parameter) -> tuple[int, int]:
        owned = self.holder[p]._get_model_param_range_map(p)["param"]
        return owned.start, owned.end

    def _states(self, p: torch.nn.Parameter) -> tuple[dict[str, Any], dict[str, torch.Tensor]]:
        """The optimizer's state of this rank's range of ``p`` (all of it, as it is written back)
        and, of that, the pieces that move (both empty where it owns none); fails on a layout
        other than the one handled (module doc)."""
        holder = self.holder[p]
        if p not in holder.model_param_group_index_map:
            return {}, {}
        start, end = self._range(p)
        tensors = dict(holder._get_main_param_and_optimizer_states(p))
        pieces = {k: v for k, v in tensors.items() if torch.is_tensor(v) and v.dim() > 0}
        if "param" not in pieces or not set(pieces) <= set(MOVED) or any(
                v.numel() != end - start for v in pieces.values()):
            raise NotImplementedError(
                f"rlweave.replay_balance: Megatron's distributed optimizer keeps state "
                f"{ {k: tuple(v.shape) for k, v in pieces.items()} } for a parameter shard of {end - start} "
                f"elements; moves handle {MOVED} over the shard only (Adam, not precision-aware): use that "
                f"optimizer or use_distributed_optimizer=False")
        return tensors, pieces

    def tensors(self, p: torch.nn.Parameter) -> list[torch.Tensor]:
        """What travels with ``p``: its whole main parameter and moments (views, written in place)."""
        return list(self.whole[p])

    @torch.no_grad()
    def keep_owned(self, params: list[torch.nn.Parameter]) -> None:
        """After the transfer: hand each rank's range of the targets' whole state to the optimizer."""
        for p in params:
            tensors, pieces = self._states(p)
            if not pieces:
                continue
            start, end = self._range(p)
            for key, piece in pieces.items():
                tensors[key] = self.whole[p][MOVED.index(key), start:end].view_as(piece)
            self.holder[p]._set_main_param_and_optimizer_states(p, tensors)
