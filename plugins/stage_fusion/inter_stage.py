"""Hook implementations of stage fusion's inter-stage part (RLHFuse): each step's long-tail
migration plan, from the cost model (:mod:`.migration`) and the lengths of the samples the
step before generated.

The plugin runs where verl's stream trainer runs (``trainer.v1.trainer_mode=rlweave_stream``,
which it requires): that process fires ``rlweave_sample_finished`` for every sample and asks
``rlweave_migration_plan`` at each step's start. Without stream generation enabled the trainer
streams on-policy with its default settings (this plugin's ``rlweave_stream_settings``, asked
last, so that stream generation's own answer wins when both are on).
"""

from __future__ import annotations

import logging
from collections import defaultdict
from collections.abc import Sequence

from rlweave.config import RlweaveConfig
from rlweave.hookspecs import hookimpl
from rlweave.plugins.stage_fusion.migration import InferenceCost, engine_cost, plan_migration, roles
from rlweave.types import FusionStep, MigrationPlan, Need, PluginNeed, SampleRecord, StreamSettings

logger = logging.getLogger(__name__)
logger.setLevel(logging.INFO)  # what it decides belongs in the run's log, as verl's own INFO lines

NEEDS = (
    PluginNeed(Need.STREAMING_TRAINER, "stage_fusion",
               "inter-stage fusion runs each sample's inference as it finishes"),
)


class _State:
    def __init__(self) -> None:
        self.migration = True
        self.threshold = 0
        self.engine = engine_cost(2e-3, 1e-4, 2e-5)
        self.inference_s = 0.0  # 0: the trainer's measurement of the previous step
        self.shared_slowdown = 2.0
        self.inference_waits: bool | None = None  # None: where the cost model predicts it pays
        self.lengths: dict[int, list[int]] = defaultdict(list)  # step -> output lengths seen


state = _State()


@hookimpl
def rlweave_configure(config: RlweaveConfig) -> None:
    global state
    c = config.stage_fusion
    state = _State()
    state.migration, state.threshold = c.migration, c.migrate_threshold
    state.engine = engine_cost(c.decode_base_ms / 1e3, c.decode_per_seq_ms / 1e3, c.prefill_us_per_token / 1e6)
    state.inference_s, state.shared_slowdown = c.inference_ms_per_sample / 1e3, c.shared_slowdown
    state.inference_waits = {"auto": None, "always": True, "never": False}[c.inference_waits]


@hookimpl
def rlweave_needs() -> Sequence[PluginNeed]:
    return NEEDS


@hookimpl(trylast=True)
def rlweave_stream_settings() -> StreamSettings:
    return StreamSettings()


@hookimpl
def rlweave_sample_finished(sample: SampleRecord) -> None:
    state.lengths[sample.weight_version].append(sample.response_len)


@hookimpl
def rlweave_migration_plan(step: FusionStep) -> MigrationPlan | None:
    """The plan for ``step`` on the previous step's lengths; logged with its prediction."""
    if not state.migration:
        return None
    seen = [s for s in state.lengths if s < step.step]
    lengths = state.lengths[max(seen)] if seen else []
    for old in [s for s in state.lengths if s < step.step - 1]:
        del state.lengths[old]
    per_sample = (state.inference_s or step.inference_s_per_sample
                  or step.shared_inference_s_per_sample / state.shared_slowdown)
    if per_sample <= 0:
        lengths = []  # no inference measured yet: nothing to predict with
    sources, others = roles(step.instances)
    cost = InferenceCost(per_sample or 1.0, state.shared_slowdown, max(1, step.inference_batch))
    plan = plan_migration(step, lengths, state.engine, cost, threshold=state.threshold, seed=step.step,
                          inference_waits=state.inference_waits)
    if plan is None:
        why = ("no instance runs on the trainer's devices, so none would free them" if not sources else
               "every instance runs on the trainer's devices, so none is left to migrate onto" if not others else
               "no step seen yet to predict it from" if not lengths else "the cost model predicts no gain")
        logger.info("rlweave stage fusion: step %d does not migrate: %s", step.step, why)
        return None
    logger.info("rlweave stage fusion: step %d migrates the tail of %s to %s once <= %d of %d samples remain, "
                "inference %s; predicted generation+inference %.3f s (%.3f s without)", step.step,
                list(plan.sources), list(plan.destinations), plan.threshold, step.samples,
                "waiting for the freed devices" if plan.inference_waits else "as samples finish",
                plan.predicted_stage_s, plan.predicted_stage_s_without)
    return plan
