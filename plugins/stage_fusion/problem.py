"""The fused actor–critic pipeline problem (RLHFuse intra-stage fusion, FlexFusion's formulation).

PPO trains the actor and the critic on the same experiences, independently. RLHFuse co-locates
both pipelines on the same GPUs, the critic running in the reverse direction, so that each
model's compute fills the other's pipeline bubbles.

- Actor: ``actor_pp`` stages, stage ``s`` on GPU ``s``; ``actor_mb`` micro-batches.
- Critic: ``critic_pp`` stages with ``actor_pp = k * critic_pp``, replicated ``k`` times
  (data parallel); replica ``i`` spans GPUs ``i*critic_pp .. (i+1)*critic_pp - 1`` in reverse
  order (its stage 0 on GPU ``(i+1)*critic_pp - 1``); ``critic_mb`` micro-batches per replica.
  Critic micro-batches are numbered globally: micro-batch ``b`` belongs to replica
  ``b // critic_mb``.
- A micro-batch's forward runs stage by stage, then its backward in reverse. Forward costs
  ``fwd`` per stage, backward ``bwd`` (``2 * fwd`` unless given).

A :class:`Task` is one (model, micro-batch, stage, phase); a schedule is, per GPU, an order of
all the tasks that GPU holds (:mod:`.schedule`).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import NamedTuple

ACTOR, CRITIC = "actor", "critic"
MODELS = (ACTOR, CRITIC)
FORWARD, BACKWARD = "F", "B"


class ProblemError(ValueError):
    """A configuration that is not a fused pipeline problem; the message names cause and fix."""


class Task(NamedTuple):
    """One unit of pipeline work. ``micro_batch`` is global (critic: replica * critic_mb + i)."""

    model: str
    micro_batch: int
    stage: int
    phase: str


@dataclass(frozen=True)
class StageCosts:
    """Per-stage durations of one model: ``fwd[s]`` and ``bwd[s]`` for stage ``s`` (any unit).

    The sweep uses uniform integer costs; the executor's prediction uses costs measured on
    each real stage (the first holds the embedding, the last the head and the loss)."""

    fwd: tuple[float, ...]
    bwd: tuple[float, ...]

    @classmethod
    def uniform(cls, stages: int, fwd: float, bwd: float | None = None) -> StageCosts:
        return cls((fwd,) * stages, ((2 * fwd) if bwd is None else bwd,) * stages)


@dataclass(frozen=True)
class FusedPipelineProblem:
    """Sizes and costs of one fused actor–critic training step (see the module docstring)."""

    actor_pp: int
    critic_pp: int
    actor_mb: int
    critic_mb: int
    actor_costs: StageCosts
    critic_costs: StageCosts

    @classmethod
    def uniform(cls, actor_pp: int, critic_pp: int, actor_mb: int, critic_mb: int,
                actor_fwd: float, critic_fwd: float) -> FusedPipelineProblem:
        """The paper's setting: the same forward cost on every stage, backward twice that.
        Raises :class:`ProblemError` for a configuration that cannot be fused."""
        validate_sizes(actor_pp, critic_pp, actor_mb, critic_mb, actor_fwd, critic_fwd)
        return cls(actor_pp, critic_pp, actor_mb, critic_mb,
                   StageCosts.uniform(actor_pp, actor_fwd), StageCosts.uniform(critic_pp, critic_fwd))

    def __post_init__(self) -> None:
        validate_sizes(self.actor_pp, self.critic_pp, self.actor_mb, self.critic_mb,
                       min(self.actor_costs.fwd), min(self.critic_costs.fwd))
        for name, costs, stages in ((ACTOR, self.actor_costs, self.actor_pp),
                                    (CRITIC, self.critic_costs, self.critic_pp)):
            if len(costs.fwd) != stages or len(costs.bwd) != stages or min(costs.bwd) <= 0:
                raise ProblemError(f"{name} costs must give a positive forward and backward time "
                                   f"for each of its {stages} stages.")

    @property
    def gpus(self) -> int:
        return self.actor_pp

    @property
    def replicas(self) -> int:
        """``k``: critic pipeline replicas (``actor_pp // critic_pp``)."""
        return self.actor_pp // self.critic_pp

    def stages(self, model: str) -> int:
        return self.actor_pp if model == ACTOR else self.critic_pp

    def micro_batches(self, model: str) -> int:
        """All micro-batches of ``model`` (the critic's summed over its replicas)."""
        return self.actor_mb if model == ACTOR else self.critic_mb * self.replicas

    def costs(self, model: str) -> StageCosts:
        return self.actor_costs if model == ACTOR else self.critic_costs

    def duration(self, task: Task) -> float:
        costs = self.costs(task.model)
        return (costs.fwd if task.phase == FORWARD else costs.bwd)[task.stage]

    def gpu(self, model: str, micro_batch: int, stage: int) -> int:
        """The GPU that holds ``stage`` of the pipeline (replica) ``micro_batch`` runs on."""
        if model == ACTOR:
            return stage
        replica = micro_batch // self.critic_mb
        return (replica + 1) * self.critic_pp - 1 - stage

    def critic_stage(self, gpu: int) -> int:
        """The critic stage GPU ``gpu`` holds (in its replica's reversed order)."""
        return self.critic_pp - 1 - gpu % self.critic_pp

    def critic_replica(self, gpu: int) -> int:
        return gpu // self.critic_pp

    def tasks(self, gpu: int) -> Iterator[Task]:
        """Every task that ``gpu`` must run, in no particular order."""
        for phase in (FORWARD, BACKWARD):
            for b in range(self.actor_mb):
                yield Task(ACTOR, b, gpu, phase)
            first = self.critic_replica(gpu) * self.critic_mb
            for b in range(first, first + self.critic_mb):
                yield Task(CRITIC, b, self.critic_stage(gpu), phase)

    def predecessor(self, task: Task) -> Task | None:
        """The task of the same micro-batch that must end before ``task`` starts."""
        model, b, s, phase = task
        if phase == FORWARD:
            return Task(model, b, s - 1, FORWARD) if s > 0 else None
        if s == self.stages(model) - 1:
            return Task(model, b, s, FORWARD)
        return Task(model, b, s + 1, BACKWARD)


def validate_sizes(actor_pp: int, critic_pp: int, actor_mb: int, critic_mb: int,
                   actor_fwd: float, critic_fwd: float) -> None:
    """One clear :class:`ProblemError` for the first thing wrong with a configuration."""
    for name, value in (("actor pipeline stages (--actor-pp)", actor_pp),
                        ("critic pipeline stages (--critic-pp)", critic_pp),
                        ("actor micro-batches (--actor-mb)", actor_mb),
                        ("critic micro-batches (--critic-mb)", critic_mb)):
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise ProblemError(f"{name} must be a positive integer, got {value!r}.")
    for name, value in (("actor forward time (--actor-fwd)", actor_fwd),
                        ("critic forward time (--critic-fwd)", critic_fwd)):
        if not value > 0:
            raise ProblemError(f"{name} must be positive, got {value!r}.")
    if actor_pp % critic_pp:
        raise ProblemError(
            f"the actor's {actor_pp} pipeline stages are not a multiple of the critic's "
            f"{critic_pp}: fusion places k = actor_pp / critic_pp critic replicas on the actor's "
            f"GPUs; choose a critic pipeline size that divides {actor_pp}.")

