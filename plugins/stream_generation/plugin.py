"""Hook implementations of the stream_generation plugin (StreamRL): how the stream trainer
streams, skewness-aware dispatch, and the size of each dynamic batch.

One :class:`LengthRanker` per process. The adapter must fire ``rlweave_dispatch_order`` and
``rlweave_sample_finished`` in the same process (the one that submits prompts to the stream),
because the ranker links a finished sample to its prompt's features by GRPO group id.
"""

from __future__ import annotations

from collections.abc import Sequence

from rlweave.config import RlweaveConfig
from rlweave.hookspecs import hookimpl
from rlweave.plugins.stream_generation.dynamic_batch import groups_to_take
from rlweave.plugins.stream_generation.ranker import LengthRanker
from rlweave.types import DynamicBatchRequest, Need, PluginNeed, PromptInfo, SampleRecord, StreamSettings

ranker: LengthRanker | None = None
skewness_dispatch = True
long_tail_fraction = 1.0
settings = StreamSettings()


def _ranker() -> LengthRanker:
    if ranker is None:
        raise RuntimeError("the stream_generation plugin was registered without rlweave_configure")
    return ranker


@hookimpl
def rlweave_configure(config: RlweaveConfig) -> None:
    global ranker, skewness_dispatch, long_tail_fraction, settings
    c = config.stream_generation
    settings = StreamSettings(c.mode, c.max_staleness, c.poll_s)
    ranker = LengthRanker(decay=c.ranker_decay, min_samples=c.ranker_min_samples)
    skewness_dispatch = c.skewness_dispatch
    # On-policy, the trainer consumes this very batch as it streams; async, it takes it a step
    # later, when only the batch's makespan matters.
    long_tail_fraction = c.long_tail_fraction if c.mode == "on_policy" else 1.0


NEEDS = (
    PluginNeed(Need.STREAMING_TRAINER, "stream_generation",
               "stream generation is a trainer that takes samples as they finish"),
)


@hookimpl
def rlweave_needs() -> Sequence[PluginNeed]:
    return NEEDS


@hookimpl
def rlweave_dispatch_order(prompts: Sequence[PromptInfo]) -> list[str] | None:
    """Predicted long tail first, then (on-policy) the rest shortest first; ``None`` (the
    framework's order) while the ranker is still learning, or with ``skewness_dispatch=false``
    (it keeps learning, for the ablation)."""
    r = _ranker()
    r.remember(prompts)
    return r.dispatch_order(prompts, long_tail_fraction) if skewness_dispatch else None


@hookimpl
def rlweave_sample_finished(sample: SampleRecord) -> None:
    _ranker().observe(sample.group_id, sample.response_len)


@hookimpl
def rlweave_stream_settings() -> StreamSettings:
    return settings


@hookimpl
def rlweave_dynamic_batch(request: DynamicBatchRequest) -> int:
    return groups_to_take(request)
