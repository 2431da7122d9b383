"""What a plugin's prediction is, and the default step it is compared with.

Every plugin row says the predicted step with the plugin, the default step it is compared with
(usually verl's default step from :func:`rlweave.plan.scale.predict_step`; overlap's adds the
TP communication that default leaves out), the lower bound its model allows, the settings the
plugin would choose, and how the figure was produced (SIMULATED or MODELLED). A plugin whose
model cannot honestly predict from the trace gives no figure, and says why.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from rlweave.plan.cluster import Cluster
from rlweave.plan.record import JobRecord
from rlweave.plan.scale import FLOP_STAGES, StepPrediction

__all__ = ["FLOP_STAGES", "UPDATE_STAGES", "Baseline", "PluginPrediction", "no_prediction"]

UPDATE_STAGES = ("update_critic", "update_actor")


@dataclass(frozen=True)
class Baseline:
    """verl's default step on the cluster, with the recorded job and the cluster it came from."""

    job: JobRecord
    cluster: Cluster
    step: StepPrediction

    def seconds(self, *names: str) -> float:
        return sum(self.step.stages[n].seconds for n in names if n in self.step.stages)

    @property
    def generate_s(self) -> float:
        return self.seconds("generate")

    @property
    def train_s(self) -> float:
        """The GPU stages after generation: inference and updates (FLOP-bound)."""
        return self.seconds(*FLOP_STAGES)

    @property
    def mean_length(self) -> float:
        return float(self.job.output_lengths.mean())

    def effective_iteration_s(self, batch: int) -> float:
        """One decode iteration of ``batch`` sequences with each sequence's prompt prefill spread
        over its tokens (assumption ``prefill-amortized``)."""
        e = self.step.engine
        return e.iteration_s(batch) + batch * self.job.mean_prompt_tokens / self.mean_length * e.prefill_s_per_token

    def generation_bound_s(self, requests: int) -> float:
        """``requests`` of mean length on one instance at a full batch every iteration: no tail."""
        slots = self.step.engine.slots
        return requests * self.mean_length * self.effective_iteration_s(slots) / slots


@dataclass(frozen=True)
class PluginPrediction:
    """One plugin (or a composable set) on the cluster. ``step_s`` is ``None`` where the model
    cannot predict (``note`` says why); ``policies``: for agentic and serving, each policy's
    figure (FCFS, non-clairvoyant, oracle) as named in ``note``."""

    name: str
    default_s: float
    step_s: float | None
    bound_s: float | None
    label: str
    settings: dict[str, object] = field(default_factory=dict)
    note: str = ""
    policies: dict[str, float] = field(default_factory=dict)
    sensitivity: str = ""

    @property
    def ratio(self) -> float | None:
        """Predicted step over the default's (below 1: faster)."""
        return None if self.step_s is None else self.step_s / self.default_s

    @property
    def bound_ratio(self) -> float | None:
        return None if self.bound_s is None else self.bound_s / self.default_s


def no_prediction(name: str, default_s: float, reason: str) -> PluginPrediction:
    """A row that says why there is no figure rather than making one up."""
    return PluginPrediction(name, default_s, None, None, "no prediction", note=reason)
