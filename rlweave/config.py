"""The ``rlweave`` config section: typed, validated, and traceable to where each value came from.

One section, three doors, later ones overriding earlier ones:
1. environment variables ``RLWEAVE__<PLUGIN>__<OPTION>=value`` (processes that never see verl's
   config: vLLM engine processes, Megatron launched alone; the host exports them to children);
2. Hydra overrides on a verl command line, ``+rlweave.<plugin>.<option>=value``;
3. a mapping passed programmatically (verl's ``config.rlweave``, tests).

A wrong key or value raises :class:`ConfigError` naming the key, what is allowed and the source.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar

from omegaconf import OmegaConf
from omegaconf.errors import OmegaConfBaseException

ENV_PREFIX = "RLWEAVE__"


class ConfigError(ValueError):
    """A bad ``rlweave`` setting. The message names the key, the fix and the source."""


@dataclass
class PluginSection:
    """Options every plugin has. ``available`` is False until the plugin's issue lands, so that
    enabling it fails loudly instead of silently doing nothing."""

    enable: bool = False
    available: ClassVar[bool] = False
    paper: ClassVar[str] = ""

    def finalize(self) -> None:
        """Normalise values once all settings are applied (e.g. make paths absolute, so that
        child processes with another working directory agree)."""


@dataclass
class TracingConfig(PluginSection):
    """Span/event recording of every hook, exported as Chrome/Perfetto JSON and a timeline PNG."""

    available: ClassVar[bool] = True
    paper: ClassVar[str] = "(rlweave's own timeline)"
    dir: str = "bench-results/traces"

    def finalize(self) -> None:
        self.dir = os.path.abspath(self.dir)


@dataclass
class StageFusionConfig(PluginSection):
    """RLHFuse's stage fusion (rlweave.plugins.stage_fusion). In verl (trainer mode
    ``rlweave_stream``): each sample's inference as it finishes, and the generation tail
    migrated onto the instances off the trainer's devices so that theirs run the inference.

    ``migration``: migrate at all. ``migrate_threshold``: migrate once at most this many of the
    step's samples remain (0: the threshold and destinations the cost model predicts fastest, from
    the previous step's lengths). The cost model: a decode iteration with ``b`` sequences takes
    ``decode_base_ms + decode_per_seq_ms * b``, re-prefill ``prefill_us_per_token`` per token;
    inference ``inference_ms_per_sample`` (0: measured on the previous step), ``shared_slowdown``
    times slower (and the engine too) while an engine decodes on the trainer's devices.
    ``rlweave bench fusion-inter`` measures them on the real engine and trainer.
    ``inference_waits``: whether the samples that finish before the migration wait for the
    devices it frees, instead of being inferred beside the generation (``auto``: where the cost
    model predicts it pays; ``always``; ``never``).
    """

    available: ClassVar[bool] = True
    paper: ClassVar[str] = "RLHFuse (NSDI'25)"
    WAITS: ClassVar[tuple[str, ...]] = ("auto", "always", "never")
    migration: bool = True
    migrate_threshold: int = 0
    decode_base_ms: float = 2.0
    decode_per_seq_ms: float = 0.1
    prefill_us_per_token: float = 20.0
    inference_ms_per_sample: float = 0.0
    shared_slowdown: float = 2.0
    inference_waits: str = "auto"

    def finalize(self) -> None:
        if self.inference_waits not in self.WAITS:
            raise ConfigError(f"unknown rlweave.stage_fusion.inference_waits '{self.inference_waits}'; allowed: "
                              f"{', '.join(self.WAITS)}.")
        for option, value, ok, allowed in (
            ("migrate_threshold", self.migrate_threshold, self.migrate_threshold >= 0,
             ">= 0 (0 = chosen by the cost model)"),
            ("decode_base_ms", self.decode_base_ms, self.decode_base_ms > 0, "> 0"),
            ("decode_per_seq_ms", self.decode_per_seq_ms, self.decode_per_seq_ms >= 0, ">= 0"),
            ("prefill_us_per_token", self.prefill_us_per_token, self.prefill_us_per_token >= 0, ">= 0"),
            ("inference_ms_per_sample", self.inference_ms_per_sample, self.inference_ms_per_sample >= 0,
             ">= 0 (0 = measured on the previous step)"),
            ("shared_slowdown", self.shared_slowdown, self.shared_slowdown >= 1, ">= 1"),
        ):
            if not ok:
                raise ConfigError(f"bad value {value!r} for 'rlweave.stage_fusion.{option}'; allowed: {allowed}.")


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


@dataclass
class AgenticRolloutConfig(PluginSection):
    """Heddle's trajectory-level priority, placement and migration (rlweave.plugins.agentic_rollout).

    The engine cost model (``iteration_base_ms + iteration_per_seq_ms * batch`` per decode
    iteration, ``slots`` sequences per instance, ``prefill_us_per_token``) turns predicted tokens
    into seconds and is what placement balances; ``rlweave bench agentic`` measures it on the
    real engine and prints the values to set. ``prior_tool_ms``: the tool time per call assumed
    before any is observed. ``history_decay``: the weight of the previous rollout batch's
    observations relative to this one's (the predictor keeps ``history`` per task and group).
    ``replan_s``: how often the placement plan is refreshed. ``migrate_fraction``: a trajectory
    moves at a tool call only if re-prefilling its context costs less than this fraction of its
    predicted remaining time.
    """

    available: ClassVar[bool] = True
    paper: ClassVar[str] = "Heddle (arXiv 2603.28101)"
    iteration_base_ms: float = 2.0
    iteration_per_seq_ms: float = 0.1
    slots: int = 256
    prefill_us_per_token: float = 20.0
    prior_tool_ms: float = 500.0
    history_decay: float = 0.5
    history: int = 2048
    replan_s: float = 0.25
    migrate_fraction: float = 0.1

    def finalize(self) -> None:
        for option, ok, allowed in (
            ("iteration_base_ms", self.iteration_base_ms > 0, "> 0"),
            ("iteration_per_seq_ms", self.iteration_per_seq_ms >= 0, ">= 0"),
            ("slots", self.slots >= 1, ">= 1 (the engine's max_num_seqs)"),
            ("prefill_us_per_token", self.prefill_us_per_token >= 0, ">= 0"),
            ("prior_tool_ms", self.prior_tool_ms >= 0, ">= 0"),
            ("history_decay", 0 < self.history_decay <= 1, "in (0, 1] (1 = never forget)"),
            ("history", self.history >= 1, ">= 1"),
            ("replan_s", self.replan_s >= 0, ">= 0"),
            ("migrate_fraction", 0 <= self.migrate_fraction <= 1, "between 0 and 1 (0 = never migrate)"),
        ):
            if not ok:
                raise ConfigError(f"bad value {getattr(self, option)!r} for "
                                  f"'rlweave.agentic_rollout.{option}'; allowed: {allowed}.")


@dataclass
class PreemptiveServingConfig(PluginSection):
    """FastServe's skip-join MLFQ in the engine scheduler (rlweave.plugins.preemptive_serving).

    Level ``p`` has quantum ``base_quantum_ms * quantum_ratio**p``; ``base_quantum_ms = 0``
    takes the shortest iteration measured on the running engine (FastServe's choice). A request
    not served for ``starvation_s`` is promoted to the top level. ``policy``: ``adaptive``
    levels requests by their expected remaining work, learnt from the lengths the engine has
    served (preempts only where that pays); ``skip_join_mlfq`` is FastServe's (join by prefill
    time, demote by attained service); ``mlfq`` joins every request at the top level.
    """

    available: ClassVar[bool] = True
    paper: ClassVar[str] = "FastServe (skip-join MLFQ)"
    POLICIES: ClassVar[tuple[str, ...]] = ("adaptive", "skip_join_mlfq", "mlfq")
    policy: str = "adaptive"
    base_quantum_ms: float = 0.0
    quantum_ratio: float = 2.0
    num_levels: int = 10
    starvation_s: float = 3.0

    def finalize(self) -> None:
        key = "rlweave.preemptive_serving"
        if self.policy not in self.POLICIES:
            raise ConfigError(f"unknown {key}.policy '{self.policy}'; allowed: "
                              f"{', '.join(self.POLICIES)} (adaptive = by expected remaining work, "
                              "skip_join_mlfq = FastServe's, mlfq = every request joins the top level).")
        for option, value, ok, allowed in (
            ("base_quantum_ms", self.base_quantum_ms, self.base_quantum_ms >= 0,
             ">= 0 (0 = the engine's shortest measured iteration)"),
            ("quantum_ratio", self.quantum_ratio, self.quantum_ratio > 1, "> 1"),
            ("num_levels", self.num_levels, self.num_levels >= 1, ">= 1"),
            ("starvation_s", self.starvation_s, self.starvation_s > 0, "> 0"),
        ):
            if not ok:
                raise ConfigError(f"bad value {value!r} for '{key}.{option}'; allowed: {allowed}.")


@dataclass
class ReplayBalanceConfig(PluginSection):
    """Routing-replay-guided expert reordering and in-node replication in Megatron MoE layers
    built through ``rlweave.adapters.megatron.layer_spec``.

    ``slots_per_rank``: expert weight slots per EP rank (its own experts plus spare slots for
    replicas); 0 means its own experts plus one spare. ``ranks_per_node``: EP ranks per node
    (micro-batch replicas stay inside a node; moves and step replicas may cross). ``threshold``:
    stop replicating once a micro-batch's max/mean rank load is at most this.
    """

    available: ClassVar[bool] = True
    paper: ClassVar[str] = "ReLibra"
    slots_per_rank: int = 0
    ranks_per_node: int = 8
    threshold: float = 1.02

    def finalize(self) -> None:
        if self.slots_per_rank < 0:
            raise ConfigError(f"rlweave.replay_balance.slots_per_rank={self.slots_per_rank} is negative; "
                              f"give the expert slots per rank, or 0 for its own experts plus one spare")
        if self.ranks_per_node < 1:
            raise ConfigError(f"rlweave.replay_balance.ranks_per_node={self.ranks_per_node} must be at "
                              f"least 1 (the EP ranks of one node, e.g. 8)")
        if self.threshold < 1.0:
            raise ConfigError(f"rlweave.replay_balance.threshold={self.threshold} is below 1.0, which no "
                              f"placement reaches (max/mean >= 1); use e.g. 1.02")


@dataclass
class OverlapConfig(PluginSection):
    """FLUX's overlapped AllGather+GEMM and GEMM+ReduceScatter in Megatron's sequence-parallel
    TP linears built through ``rlweave.adapters.megatron.layer_spec`` (rlweave.plugins.overlap).

    ``backend``: ``auto`` (the fastest the timeline model predicts among those the device runs,
    and Megatron's own where none beats the collective followed by the GEMM), or one of ``ring``,
    ``symm_mem``, ``tile`` (an error where the device cannot run it). ``profile``: the GEMM and
    link speeds the model uses: ``auto`` (a built-in profile for the device), a built-in name, or
    a JSON file (``rlweave bench overlap`` and ``scripts/gpu_check_overlap.sh`` write them).
    ``max_chunks_per_rank``: the most pieces one rank's shard is cut into; ``chunks_per_rank``:
    a fixed number of pieces instead of the model's choice (0 = the model chooses).
    """

    available: ClassVar[bool] = True
    paper: ClassVar[str] = "FLUX (arXiv 2406.06858)"
    BACKENDS: ClassVar[tuple[str, ...]] = ("auto", "ring", "symm_mem", "tile")
    backend: str = "auto"
    profile: str = "auto"
    max_chunks_per_rank: int = 8
    chunks_per_rank: int = 0

    def finalize(self) -> None:
        key = "rlweave.overlap"
        if self.chunks_per_rank < 0:
            raise ConfigError(f"bad value {self.chunks_per_rank!r} for '{key}.chunks_per_rank'; "
                              f"allowed: >= 0 (0 = chosen by the timeline model).")
        if self.backend not in self.BACKENDS:
            raise ConfigError(f"unknown {key}.backend '{self.backend}'; allowed: {', '.join(self.BACKENDS)}.")
        if self.max_chunks_per_rank < 1:
            raise ConfigError(f"bad value {self.max_chunks_per_rank!r} for '{key}.max_chunks_per_rank'; "
                              f"allowed: >= 1 (1 = one piece per rank's shard).")
        if self.profile.endswith(".json"):
            self.profile = os.path.abspath(self.profile)
            if not os.path.isfile(self.profile):
                raise ConfigError(f"{key}.profile={self.profile} does not exist; give a profile JSON "
                                  f"(rlweave bench overlap writes bench-results/overlap-profile-cpu.json) "
                                  f"or a built-in profile name, or auto.")


@dataclass
class ResilienceConfig(PluginSection):
    """MegaScale's fault tolerance for verl jobs (rlweave.plugins.resilience).

    Every worker beats every ``heartbeat_s``; the monitor checks every ``check_s`` (a worker
    process on the monitor's node that ends is seen at once, without waiting for a check). A worker
    silent for ``safety_factor`` times the longest gap seen (at least ``min_timeout_s``;
    ``initial_timeout_s`` until calibrated), or in one section for ``safety_factor`` times its
    longest (at least ``section_floor_s``), is hung. A section ``1/straggler_threshold`` times
    slower than the median rank's makes a straggler, reported; ``evict_stragglers`` replaces it.
    Trainer state is snapshot to host memory (``snapshot_dir``) every ``snapshot_every`` steps;
    verl's ``save_freq`` checkpoints are staged there and persisted in the background. At most
    ``max_recoveries`` recoveries per run, each within ``recovery_timeout_s``. ``chaos``: the
    chaos tool, for tests and benchmarks only (off: the monitor injects no fault and answers no
    request from the network); ``faults``: faults to inject (:mod:`rlweave.chaos`), e.g.
    ``kill:trainer:1@3.update_actor``, which need ``chaos``.
    """

    available: ClassVar[bool] = True
    paper: ClassVar[str] = "MegaScale (NSDI'24)"
    heartbeat_s: float = 0.5
    check_s: float = 0.5
    safety_factor: float = 5.0
    min_timeout_s: float = 3.0
    initial_timeout_s: float = 60.0
    section_floor_s: float = 10.0
    straggler_threshold: float = 0.75
    evict_stragglers: bool = False
    snapshot_every: int = 1
    snapshot_dir: str = "/dev/shm/rlweave-snapshots"
    max_recoveries: int = 5
    recovery_timeout_s: float = 300.0
    chaos: bool = False
    faults: str = ""

    def finalize(self) -> None:
        from rlweave.chaos import parse_faults

        key = "rlweave.resilience"
        for option, ok, allowed in (
            ("heartbeat_s", 0 < self.heartbeat_s <= 10, "in (0, 10] seconds"),
            ("check_s", 0 < self.check_s <= self.heartbeat_s, "in (0, heartbeat_s] seconds"),
            ("safety_factor", self.safety_factor >= 1, ">= 1"),
            ("min_timeout_s", self.min_timeout_s > self.heartbeat_s, "> heartbeat_s"),
            ("initial_timeout_s", self.initial_timeout_s >= self.min_timeout_s, ">= min_timeout_s"),
            ("section_floor_s", self.section_floor_s > 0, "> 0 seconds"),
            ("straggler_threshold", 0 < self.straggler_threshold < 1, "in (0, 1)"),
            ("snapshot_every", self.snapshot_every >= 1, ">= 1 (steps between host-memory snapshots)"),
            ("max_recoveries", self.max_recoveries >= 0, ">= 0"),
            ("recovery_timeout_s", self.recovery_timeout_s > 0, "> 0 seconds"),
        ):
            if not ok:
                raise ConfigError(f"bad value {getattr(self, option)!r} for '{key}.{option}'; allowed: {allowed}.")
        try:
            parse_faults(self.faults or "")
        except ValueError as error:
            raise ConfigError(f"bad value for '{key}.faults': {error}") from None
        if self.faults and not self.chaos:
            raise ConfigError(f"'{key}.faults' injects faults, which only a job with the chaos tool enabled "
                              f"does; add +{key}.chaos=true (tests and benchmarks only), or drop the faults.")
        self.snapshot_dir = os.path.abspath(self.snapshot_dir)


@dataclass
class RlweaveConfig:
    """The whole ``rlweave`` section: one sub-section per plugin."""

    tracing: TracingConfig = field(default_factory=TracingConfig)
    stage_fusion: StageFusionConfig = field(default_factory=StageFusionConfig)
    stream_generation: StreamGenerationConfig = field(default_factory=StreamGenerationConfig)
    agentic_rollout: AgenticRolloutConfig = field(default_factory=AgenticRolloutConfig)
    preemptive_serving: PreemptiveServingConfig = field(default_factory=PreemptiveServingConfig)
    replay_balance: ReplayBalanceConfig = field(default_factory=ReplayBalanceConfig)
    overlap: OverlapConfig = field(default_factory=OverlapConfig)
    resilience: ResilienceConfig = field(default_factory=ResilienceConfig)

    def sections(self) -> Iterator[tuple[str, PluginSection]]:
        for f in dataclasses.fields(self):
            yield f.name, getattr(self, f.name)

    def enabled(self) -> list[str]:
        return [name for name, section in self.sections() if section.enable]


@dataclass(frozen=True)
class Setting:
    """One ``section.option = value`` with where it came from (for error messages)."""

    key: str  # "tracing.enable"
    value: Any
    source: str


def _parse_value(text: str) -> Any:
    """Parse a command-line or environment value as Hydra does ("true" -> True, "3" -> 3)."""
    return OmegaConf.from_dotlist([f"v={text}"]).v


def settings_from_env(environ: Mapping[str, str] | None = None) -> list[Setting]:
    environ = os.environ if environ is None else environ
    out = []
    for name, value in sorted(environ.items()):
        if name.startswith(ENV_PREFIX):
            key = name[len(ENV_PREFIX) :].lower().replace("__", ".")
            out.append(Setting(key, _parse_value(value), f"environment variable {name}"))
    return out


def settings_from_mapping(mapping: Mapping[str, Any] | Any, source: str) -> list[Setting]:
    """Flatten ``{"tracing": {"enable": True}}`` (a dict or an OmegaConf node) into settings."""
    if OmegaConf.is_config(mapping):
        mapping = OmegaConf.to_container(mapping, resolve=True)
    out = []
    for section, options in (mapping or {}).items():
        if not isinstance(options, Mapping):
            out.append(Setting(str(section), options, source))
            continue
        for option, value in options.items():
            out.append(Setting(f"{section}.{option}", value, source))
    return out


def settings_from_overrides(args: Iterable[str], source: str = "command line") -> list[Setting]:
    """Pick ``[+|++]rlweave.<section>.<option>=<value>`` out of Hydra-style overrides."""
    out = []
    for arg in args:
        stripped = arg.lstrip("+")
        if not stripped.startswith("rlweave.") or "=" not in stripped:
            continue
        key, value = stripped[len("rlweave.") :].split("=", 1)
        out.append(Setting(key, _parse_value(value), f"{source} '{arg}'"))
    return out


def _allowed_values(section: PluginSection, option: str) -> str:
    kind = {f.name: f.type for f in dataclasses.fields(section)}[option]
    return {"bool": "true or false", "int": "an integer", "float": "a number", "str": "a string"}.get(
        str(kind), str(kind)
    )


def build_config(settings: Iterable[Setting]) -> RlweaveConfig:
    """Apply settings in order onto the defaults, validating each one."""
    config = RlweaveConfig()
    section_names = [name for name, _ in config.sections()]
    for s in settings:
        parts = s.key.split(".")
        if len(parts) != 2 or parts[0] not in section_names:
            raise ConfigError(
                f"unknown rlweave setting 'rlweave.{s.key}' (from {s.source}). "
                f"Settings are rlweave.<plugin>.<option>, plugin one of: {', '.join(section_names)}."
            )
        section_name, option = parts
        section = getattr(config, section_name)
        options = [f.name for f in dataclasses.fields(section)]
        if option not in options:
            raise ConfigError(
                f"unknown option 'rlweave.{s.key}' (from {s.source}). "
                f"Options of rlweave.{section_name}: {', '.join(options)}."
            )
        node = OmegaConf.structured(section)
        try:
            setattr(node, option, s.value)
        except OmegaConfBaseException:
            raise ConfigError(
                f"bad value {s.value!r} for 'rlweave.{s.key}' (from {s.source}); "
                f"allowed: {_allowed_values(section, option)}."
            ) from None
        setattr(section, option, getattr(node, option))
    for name, section in config.sections():
        section.finalize()
        if section.enable and not section.available:
            available = [n for n, sec in config.sections() if sec.available]
            raise ConfigError(
                f"rlweave.{name} ({section.paper}) is not available in this version of rlweave, "
                f"so enabling it would do nothing. Remove 'rlweave.{name}.enable' or pick one of "
                f"the available plugins: {', '.join(available)}."
            )
    return config


def to_env(config: RlweaveConfig) -> dict[str, str]:
    """Environment variables that reproduce ``config`` in a child process (the non-default
    options of enabled plugins: a disabled plugin leaves no trace)."""
    env = {}
    for name, section in config.sections():
        if not section.enable:
            continue
        default = type(section)()
        for f in dataclasses.fields(section):
            value = getattr(section, f.name)
            if value != getattr(default, f.name):
                text = str(value).lower() if isinstance(value, bool) else str(value)
                env[f"{ENV_PREFIX}{name.upper()}__{f.name.upper()}"] = text
    return env
