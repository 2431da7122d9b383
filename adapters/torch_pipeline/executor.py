"""One rank's part of a fused actor–critic pipeline step, over gloo (CPU) or any p2p backend.

Each rank holds actor stage ``rank`` and one critic stage (see :mod:`.placement`) and runs its
order entry by entry:

- forward: stage 0 reads its micro-batch, other stages ``recv`` the activation from the rank
  of the previous stage; the output goes to the next stage with ``isend`` (so a rank never
  blocks on a send), or on the last stage becomes the micro-batch's loss;
- backward: the last stage backpropagates its loss, other stages ``recv`` the output gradient
  from the next stage; the input's gradient goes back to the previous stage.

Messages are tagged by model, phase and micro-batch, so the actor's activations and the
critic's gradients that share a link in the same direction never mix. Receives are blocking
and in the rank's order; with non-blocking sends an order that passes
:func:`~.placement.check_orders` cannot deadlock. The critic's replicas are data-parallel:
:meth:`FusedPipelineExecutor.reduce_critic_grads` sums their gradients (all-reduce among the
ranks holding the same critic stage).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field

import torch
import torch.distributed as dist

from rlweave.adapters.torch_pipeline.placement import Entry, Placement, check_orders
from rlweave.adapters.torch_pipeline.stages import Stage, micro_batch_loss

PHASES = {"F": 0, "B": 1}
MODEL_IDS = {"actor": 0, "critic": 1}


@dataclass
class StepTrace:
    """Seconds from the step's start: each entry's ``(entry, start, end)``, and the rank's end."""

    spans: list[tuple[Entry, float, float]] = field(default_factory=list)
    end: float = 0.0


class FusedPipelineExecutor:
    """Runs orders on this rank's two stages (collective constructor: call it on every rank)."""

    def __init__(self, placement: Placement, actor: Stage, critic: Stage,
                 activation_shape: Sequence[int]) -> None:
        self.placement, self.rank = placement, dist.get_rank()
        self.stages = {"actor": actor, "critic": critic}
        self.shape = tuple(activation_shape)
        self.critic_mb_total = placement.critic_mb * placement.actor_pp // placement.critic_pp
        # ranks holding the same critic stage (one per replica); every rank creates every group
        self.critic_group = None
        for stage in range(placement.critic_pp):
            ranks = sorted(placement.rank("critic", r * placement.critic_mb, stage)
                           for r in range(placement.actor_pp // placement.critic_pp))
            group = dist.new_group(ranks) if len(ranks) > 1 else None
            if self.rank in ranks:
                self.critic_group = group

    def step(self, orders: Sequence[Sequence[Sequence[object]]],
             batches: dict[str, Sequence[dict[str, torch.Tensor]]]) -> StepTrace:
        """Run this rank's order of ``orders`` (all ranks' orders, checked first on every rank,
        so a bad schedule is refused everywhere before any message is sent). ``batches``:
        per model, every micro-batch by its global index."""
        order = check_orders(self.placement, orders)[self.rank]
        pending: list[dist.Work] = []
        keep: list[torch.Tensor] = []  # sent tensors stay alive until their send completes
        saved: dict[tuple[str, int], tuple[torch.Tensor, torch.Tensor]] = {}
        trace = StepTrace()
        t0 = time.perf_counter()
        for entry in order:
            model, b, s, phase = entry
            start = time.perf_counter() - t0
            stage = self.stages[model]
            if phase == "F":
                x = batches[model][b]["input_ids"] if s == 0 else self._recv(model, b, s - 1, "F")
                out = stage(x)
                if stage.is_last:
                    count = self.placement.actor_mb if model == "actor" else self.critic_mb_total
                    out = micro_batch_loss(out, batches[model][b], stage.value_head, count)
                else:
                    keep.append(out.detach())
                    pending.append(self._send(keep[-1], model, b, s + 1, "F"))
                saved[(model, b)] = (x, out)
            else:
                x, out = saved.pop((model, b))
                if stage.is_last:
                    out.backward()
                else:
                    torch.autograd.backward(out, self._recv(model, b, s + 1, "B"))
                if s > 0:
                    keep.append(x.grad)
                    pending.append(self._send(x.grad, model, b, s - 1, "B"))
            trace.spans.append((entry, start, time.perf_counter() - t0))
        for work in pending:
            work.wait()
        trace.end = time.perf_counter() - t0
        return trace

    def reduce_critic_grads(self) -> None:
        if self.critic_group is None:
            return
        for p in self.stages["critic"].parameters():
            if p.grad is not None:
                dist.all_reduce(p.grad, group=self.critic_group)

    def _tag(self, model: str, b: int, phase: str) -> int:
        return ((MODEL_IDS[model] * 2 + PHASES[phase]) << 20) + b

    def _send(self, tensor: torch.Tensor, model: str, b: int, stage: int, phase: str) -> dist.Work:
        peer = self.placement.rank(model, b, stage)
        return dist.isend(tensor.contiguous(), peer, tag=self._tag(model, b, phase))

    def _recv(self, model: str, b: int, stage: int, phase: str) -> torch.Tensor:
        buffer = torch.empty(self.shape)
        dist.recv(buffer, self.placement.rank(model, b, stage), tag=self._tag(model, b, phase))
        return buffer.requires_grad_(phase == "F")
