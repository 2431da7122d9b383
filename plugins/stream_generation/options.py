"""The options of ``rlweave.stream_generation``, and what the host needs to know of the plugin: its section, its
options' type and the module of hooks it registers when the section is enabled."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from rlweave.plugin_api import ConfigError, PluginInfo, PluginSection


@dataclass
class StreamGenerationConfig(PluginSection):
    """StreamRL's streamed rollout (rlweave.plugins.stream_generation), verl trainer mode
    ``rlweave_stream``.

    ``mode``: ``on_policy`` (every trained sample was generated with the weights the step
    started from) or ``async`` (at most ``max_staleness`` weight versions old; generation goes
    on while the trainer trains). ``skewness_dispatch``: order each batch's prompts by the
    length ranker's prediction, once it has learned from ``ranker_min_samples`` finished
    samples: on-policy, the predicted-longest ``long_tail_fraction`` of the batch first and the
    rest shortest first (the trainer consumes this batch as it streams, so early finishes
    shorten the step); async, longest first (only the batch's makespan matters).
    ``ranker_decay`` discounts older samples per new one (1 = keep all equally). ``poll_s``:
    how often finished groups are looked for (verl's own replay buffer polls every 2 s).
    """

    available: ClassVar[bool] = True
    paper: ClassVar[str] = "StreamRL (arXiv 2504.15930)"
    MODES: ClassVar[tuple[str, ...]] = ("on_policy", "async")
    mode: str = "on_policy"
    max_staleness: int = 1
    skewness_dispatch: bool = True
    ranker_min_samples: int = 32
    ranker_decay: float = 1.0
    long_tail_fraction: float = 0.125
    poll_s: float = 0.05

    def finalize(self) -> None:
        key = "rlweave.stream_generation"
        if self.mode not in self.MODES:
            raise ConfigError(f"unknown {key}.mode '{self.mode}'; allowed: {', '.join(self.MODES)}.")
        for option, value, ok, allowed in (
            ("max_staleness", self.max_staleness, self.max_staleness >= 1,
             ">= 1 (staleness 0 is mode=on_policy)"),
            ("ranker_min_samples", self.ranker_min_samples, self.ranker_min_samples >= 1, ">= 1"),
            ("ranker_decay", self.ranker_decay, 0 < self.ranker_decay <= 1, "in (0, 1]"),
            ("long_tail_fraction", self.long_tail_fraction, 0 < self.long_tail_fraction <= 1,
             "in (0, 1] (1: the whole batch longest first)"),
            ("poll_s", self.poll_s, 0 < self.poll_s <= 10, "in (0, 10] seconds"),
        ):
            if not ok:
                raise ConfigError(f"bad value {value!r} for '{key}.{option}'; allowed: {allowed}.")


PLUGIN = PluginInfo("stream_generation", StreamGenerationConfig, hooks="rlweave.plugins.stream_generation.plugin")
