"""Neutral types: what adapters hand to plugins and plugins hand back.

No framework object ever crosses a hook. Arrays are numpy; shapes are in the docstrings.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum
from typing import Any, NamedTuple

import numpy as np


@dataclass(frozen=True)
class FrameworkInfo:
    """A framework an adapter found in this process."""

    name: str  # "verl", "vllm", "megatron-core", "sglang"
    version: str
    process_role: str  # e.g. "driver", "EngineCore", "worker", "ray-actor"


class Stage(str, Enum):
    """Stages of one RL training step, in verl's order."""

    GENERATE = "generate"
    REWARD = "reward"
    OLD_LOG_PROB = "old_log_prob"
    REF = "ref"
    VALUES = "values"
    ADVANTAGE = "adv"
    UPDATE_CRITIC = "update_critic"
    UPDATE_ACTOR = "update_actor"
    WEIGHT_SYNC = "weight_sync"


@dataclass(frozen=True)
class StageContext:
    """Where a stage runs: its name, the training step and the worker (group) running it."""

    stage: Stage
    step: int
    worker: str
    batch_size: int = 0


class Need(str, Enum):
    """What a plugin needs of the framework that runs it, in neutral words. Each framework's
    adapter maps a need onto its own settings (verl: :mod:`rlweave.adapters.verl_needs`) and
    refuses, before a job starts, settings that cannot meet it or two plugins whose needs no one
    setting meets together; a plugin never names a framework setting."""

    ENGINE_PRIORITIES = "engine_priorities"  # the rollout engine serves requests by a per-request priority
    TURN_REPORTS = "turn_reports"  # the rollout reports each turn of a trajectory (rlweave's agent loops)
    STREAMING_TRAINER = "streaming_trainer"  # the trainer takes samples as they finish (rlweave's stream trainer)
    STEP_REDO = "step_redo"  # the trainer can redo the step in flight (a synchronous loop)
    HOST_SNAPSHOT = "host_snapshot"  # each rank's model and optimizer state fit one host-memory copy
    MOE_LAYERS = "moe_layers"  # training runs Megatron-core MoE layers
    ROUTING_REPLAY = "routing_replay"  # training replays the rollout's expert routing
    TP_LINEARS = "tp_linears"  # training runs Megatron-core tensor-parallel linears
    RLWEAVE_LAYERS = "rlweave_layers"  # the training engine builds its layers from rlweave's spec provider
    SEQUENTIAL_EXPERTS = "sequential_experts"  # each expert of a MoE layer holds its own weights (no grouped GEMM)
    LOCAL_TP_LINEARS = "local_tp_linears"  # the engine's spec has Megatron's local TP linears and sequence-parallel norms


@dataclass(frozen=True)
class PluginNeed:
    """One need of one plugin (its config section), with why it has it, in the plugin's words."""

    need: Need
    plugin: str
    why: str


@dataclass(frozen=True)
class SettingRequirement:
    """A framework setting that an enabled plugin needs in order to work.

    An adapter derives it from a plugin's :class:`PluginNeed`. ``key`` is the framework's dotted
    config key (verl: ``trainer.v1.trainer_mode``); its value
    must be one of ``allowed``. ``default`` is the framework's own value when the key is not set
    (``None``: not known, so an unset key is not checked). ``why`` says, in words, what breaks
    otherwise; ``plugin`` is the config section that needs it. Adapters check these before a
    run starts, so that a setting a plugin cannot honour, or two plugins that need different
    values of one setting, stop the run with one message instead of a silent no-op.
    """

    key: str
    allowed: tuple[str, ...]
    default: str | None
    why: str
    plugin: str


@dataclass(frozen=True)
class PromptInfo:
    """One prompt of a rollout batch, before generation."""

    prompt_id: str
    prompt_len: int
    group_id: str = ""  # GRPO group: samples of the same prompt
    features: dict[str, float] = field(default_factory=dict)


@dataclass(frozen=True)
class TrajectoryInfo:
    """An agentic trajectory as the scheduler sees it between turns.

    ``trajectory_id`` is the id the framework routes every turn of the trajectory by (verl: the
    agent loop's ``request_id``), so that the agent loop and the request balancer name it alike.
    """

    trajectory_id: str
    group_id: str  # samples of one prompt: its GRPO group, and the same prompt in later epochs
    turns_done: int
    tokens_so_far: int  # tokens the model generated so far (tool outputs not counted)
    instance_id: str | None = None  # engine instance of the previous turn
    task: str = ""  # task or prompt family: what the runtime predictor learns per
    prompt_len: int = 0  # tokens of the first turn's prompt
    context_len: int = 0  # tokens of the next turn's prompt: prompt, generated and tool tokens


@dataclass(frozen=True)
class InstanceLoad:
    """One engine instance's load when a request is placed."""

    instance_id: str
    running: int
    waiting: int
    kv_used_fraction: float = 0.0


class TrajectoryEventKind(str, Enum):
    """What the agent loop saw. Between a turn's end and the next one's start the trajectory is
    outside the engine (its tool calls, and the agent loop's own work)."""

    START = "start"
    TURN_START = "turn_start"  # the turn's generate call is about to be sent
    TURN_END = "turn_end"  # it returned
    FINISH = "finish"


@dataclass(frozen=True)
class TrajectoryEvent:
    kind: TrajectoryEventKind
    trajectory: TrajectoryInfo
    time_s: float


@dataclass(frozen=True)
class SampleRecord:
    """A finished rollout sample, as a stream consumer needs it."""

    sample_id: str
    group_id: str
    prompt_len: int
    response_len: int
    weight_version: int


@dataclass(frozen=True)
class StreamSettings:
    """How a streaming trainer runs (verl trainer mode ``rlweave_stream``): ``mode``
    ``"on_policy"`` (every sample generated with the weights its step started from) or
    ``"async"`` (at most ``max_staleness`` weight versions old); ``poll_s``: how often it looks
    for finished groups."""

    mode: str = "on_policy"
    max_staleness: int = 1
    poll_s: float = 0.05


@dataclass(frozen=True)
class RolloutInstance:
    """One rollout engine instance (verl: a replica's server) as a stage-fusion plugin sees it.
    ``shares_inference_devices``: the trainer's inference stage runs on its devices too, so
    while it decodes the two slow each other down; ``slots``: its batch cap (``max_num_seqs``)."""

    instance_id: str
    shares_inference_devices: bool
    slots: int


@dataclass(frozen=True)
class FusionStep:
    """A training step about to generate, for a plugin that fuses generation with inference:
    ``samples`` it generates on ``instances``, the mean prompt tokens (what a migrated sample
    re-prefills beside its output), and the inference seconds per sample measured on the step
    before, with no instance decoding on the trainer's devices and beside one (``shared_``;
    0: none measured yet). The trainer infers ``inference_batch`` samples at a time: a batch
    starts once all of its samples have finished."""

    step: int
    samples: int
    instances: tuple[RolloutInstance, ...]
    prompt_len: int = 0
    inference_s_per_sample: float = 0.0
    shared_inference_s_per_sample: float = 0.0
    inference_batch: int = 1


@dataclass(frozen=True)
class MigrationPlan:
    """RLHFuse's long-tail migration for one step: once at most ``threshold`` samples are still
    generating, the unfinished samples of ``sources`` move to ``destinations`` (aborted,
    resubmitted with their generated tokens, re-prefilled). The predicted generation+inference
    stage with the plan and without it. ``inference_waits``: the trainer holds the inference of
    samples that finish before the migration until it has freed the trainer's devices (RLHFuse
    runs inference on the devices migration frees), instead of running it beside the sources'
    generation; the step's last samples are inferred when they come either way."""

    threshold: int
    sources: tuple[str, ...]
    destinations: tuple[str, ...]
    predicted_stage_s: float
    predicted_stage_s_without: float
    inference_waits: bool = False


@dataclass(frozen=True)
class DynamicBatchRequest:
    """A streaming trainer that could take a dynamic batch now. Counts are of GRPO groups:
    ``ready_due`` and ``pending_due`` finished and still-generating groups whose staleness
    bound this step is the last to meet (the trainer drops them after it), ``ready_other`` the
    other finished groups; ``minibatch``: groups per PPO mini-batch; ``most``: groups the step
    still needs."""

    ready_due: int
    ready_other: int
    pending_due: int
    minibatch: int
    most: int


@dataclass(frozen=True)
class EngineInfo:
    """An inference engine instance and its capacity."""

    framework: str
    instance_id: str
    max_num_seqs: int
    max_num_batched_tokens: int
    num_kv_blocks: int = 0
    block_size: int = 0
    # Whether the adapter applies ScheduleDecision.preempt on this engine (vLLM: only its
    # synchronous scheduler; see rlweave.adapters.vllm.scheduler).
    can_preempt: bool = False
    # Whether a preempted request keeps its KV blocks while the engine has free blocks for the
    # requests admitted in its place (it then resumes without recompute); otherwise, or once
    # the room is needed, its KV is freed and recomputed on resume.
    keeps_preempted_kv: bool = False


class RequestView(NamedTuple):
    """One request inside an engine's scheduler.

    A named tuple, not a frozen dataclass: built for every running request every engine
    iteration, where a frozen dataclass's field-by-field ``object.__setattr__`` costs four
    times the build of a tuple (0.9 against 0.25 us)."""

    request_id: str
    arrival_s: float
    prompt_len: int
    output_len: int  # tokens generated so far
    max_tokens: int | None
    priority: int = 0  # explicit priority (vLLM ``priority``): smaller is served first
    num_preemptions: int = 0  # times the engine preempted it so far
    num_computed_tokens: int = 0  # tokens whose KV the engine holds (0 after a recompute preemption)
    num_recomputed_tokens: int = 0  # tokens re-prefilled so far because preemptions freed their KV


class EngineStep(NamedTuple):
    """One engine iteration, reported when its output has been processed: wall-clock ``start_s``
    (scheduling began) and ``end_s`` (outputs applied), and the queues after it.

    A named tuple for the reason :class:`RequestView` is one: built every iteration (0.3 us
    against a frozen dataclass's 1.3)."""

    instance_id: str
    num_running: int
    num_waiting: int
    num_scheduled_tokens: int
    start_s: float
    end_s: float
    scheduled: tuple[str, ...] = ()  # ids of the requests the iteration computed
    # rlweave's own time in start..end: its decision and applying it (schedule_overhead_s),
    # and the previous iteration's observation hooks (observe_overhead_s: this one's are
    # reported with the next)
    schedule_overhead_s: float = 0.0
    num_recomputed_tokens: int = 0  # tokens of preempted requests this iteration re-prefilled
    num_free_kv_blocks: int = 0  # KV blocks free (or evictable) after the iteration
    decided: bool = False  # a plugin's rlweave_schedule decision ordered this iteration
    observe_overhead_s: float = 0.0


@dataclass(frozen=True, slots=True)  # built every engine iteration: slots make that cheaper
class ScheduleDecision:
    """A plugin's scheduling decision for one iteration.

    ``waiting_order``: request ids of the waiting queue, first = admitted first; ids that are
    not listed keep their relative order behind the listed ones (so listing the few that the
    free slots will take is enough).
    ``preempt``: ids of running requests to take off the engine before this iteration. They
    rejoin the waiting queue and are not re-admitted in the same iteration. Where
    ``EngineInfo.keeps_preempted_kv`` and the engine has room they keep their KV and resume
    without recompute; otherwise they lose it (vLLM recomputes it when they resume, from its
    prefix cache where the blocks survive). Only allowed where ``EngineInfo.can_preempt``; an
    adapter that cannot apply it raises.
    """

    waiting_order: tuple[str, ...] = ()
    preempt: tuple[str, ...] = ()


@dataclass(frozen=True)
class ExpertTopology:
    """Expert-parallel layout: ``nodes`` x ``ranks_per_node`` ranks, ``slots_per_rank``
    physical expert slots each (>= logical experts per rank; the surplus holds replicas).
    ``expert_bytes``: bytes of one expert's weights (0 = unknown), for costing moves."""

    num_logical_experts: int
    nodes: int
    ranks_per_node: int
    slots_per_rank: int
    expert_bytes: int = 0

    @property
    def num_ranks(self) -> int:
        return self.nodes * self.ranks_per_node


@dataclass(frozen=True)
class RoutingTrace:
    """Routed experts of a batch of tokens.

    ``topk_ids``: int array [tokens, layers, top_k] of logical expert ids.
    ``microbatch_bounds``: token offsets, ``[0, ..., tokens]``, one micro-batch per interval.
    """

    topk_ids: np.ndarray
    microbatch_bounds: tuple[int, ...]
    source: str = ""  # "vllm", "megatron-replay", "synthetic"


@dataclass(frozen=True)
class ExpertPlacement:
    """Logical -> physical expert mapping.

    ``physical_to_logical``: int array [layers, num_ranks * slots_per_rank]; -1 = empty slot.
    ``token_share``: float array of the same shape, the fraction of its logical expert's tokens
    each physical slot serves (replicas split their expert's tokens).
    """

    physical_to_logical: np.ndarray
    token_share: np.ndarray


@dataclass(frozen=True)
class TPDevice:
    """Where a tensor-parallel group runs, as the adapter probed it.

    ``backends``: the overlap backends that can run here (``"ring"``: decomposed ring over
    point-to-point; ``"symm_mem"``: torch's fused symmetric-memory ops; ``"tile"``: rlweave's
    Triton kernels); ``missing``: one ``"backend: why not"`` line per backend that cannot.
    """

    name: str  # "cpu", or the CUDA device name ("NVIDIA H200")
    comm_backend: str  # the process group's backend: "gloo", "nccl"
    backends: tuple[str, ...]
    missing: tuple[str, ...] = ()


@dataclass(frozen=True)
class LinearInfo:
    """One tensor-parallel linear of Megatron with sequence parallelism, at the first forward
    of an input shape.

    ``column``: AllGather of the input, then GEMM (its backward: GEMM, then ReduceScatter of
    the input gradient); ``row``: GEMM, then ReduceScatter (backward: AllGather of the output
    gradient, then GEMM). ``tokens``: rows of the gathered activation (sequence x micro-batch).
    """

    kind: str  # "column" or "row"
    input_size: int
    output_size: int
    tp_size: int
    tp_rank: int
    sequence_parallel: bool
    tokens: int
    dtype_bytes: int
    device: TPDevice


@dataclass(frozen=True)
class CommGemmSchedule:
    """How one rank runs one overlapped collective+GEMM.

    ``op``: ``"ag_gemm"`` (AllGather, then GEMM) or ``"gemm_rs"`` (GEMM, then ReduceScatter).
    Each rank's shard (AllGather) or output block (ReduceScatter) is cut into
    ``chunks_per_rank`` row pieces. ``order``: per ring step, the rank whose shard this rank
    multiplies (``ag_gemm``: its own first, then rank+1, rank+2, ...) or the output block whose
    partial it computes (``gemm_rs``: rank+1, rank+2, ..., its own last). Data flows along the
    ring: received from ``recv_from``, sent to ``send_to`` at every step.
    """

    op: str
    chunks_per_rank: int
    order: tuple[int, ...]
    recv_from: int
    send_to: int
    predicted_s: float = 0.0  # the timeline model's time of this op with this schedule
    sequential_s: float = 0.0  # ... and of the collective followed by the unsplit GEMM


@dataclass(frozen=True)
class TPLinearPlan:
    """The overlap plugin's decision for one linear and input shape: the backend and the
    schedules of its forward and of its input-gradient (backward) collective+GEMM."""

    backend: str  # "ring", "symm_mem" or "tile"
    forward: CommGemmSchedule
    backward: CommGemmSchedule


# --- resilience (MegaScale): liveness, progress, incidents, recovery, checkpoints -------------


@dataclass(frozen=True)
class SectionTime:
    """One finished section of a worker's work (a trainer rank's ``update_actor``, say), timed
    in the worker by a sync-free clock: ``start_s`` wall-clock, ``duration_s`` monotonic."""

    section: str
    step: int
    start_s: float
    duration_s: float


@dataclass(frozen=True)
class Heartbeat:
    """A worker's liveness and progress, as the monitor received it.

    ``worker`` is ``"<role>:<rank>"`` (``trainer:1``, ``rollout:0``, ``rollout:0/engine``,
    ``agent_loop:0``). ``time_s`` is when the monitor received it, on its own clock, so silence is
    measured on one clock. ``section`` is the section in progress (``""``: between sections) and
    ``section_s`` how long it has run; ``collective`` the last collective it entered, with its
    sequence number (``"all_reduce#42"``); ``finished`` the sections completed since the last
    beat. ``alive=False``: the adapter saw the process exit (a crash is known at once);
    ``retired``: the adapter ended the process itself (a recovery replaces it), so its silence
    and its exit are no incident.
    """

    worker: str
    time_s: float
    pid: int = 0
    host: str = ""
    seq: int = 0
    step: int = -1
    section: str = ""
    section_s: float = 0.0
    collective: str = ""
    finished: tuple[SectionTime, ...] = ()
    alive: bool = True
    retired: bool = False
    detail: str = ""

    @property
    def role(self) -> str:
        return self.worker.split(":", 1)[0]

    @property
    def group(self) -> str:
        """Workers that are compared with each other: the role, and the engine of a replica
        apart from the replica's server (``rollout/engine``)."""
        return self.role + ("/" + self.worker.split("/", 1)[1] if "/" in self.worker else "")


class Health(str, Enum):
    HEALTHY = "healthy"
    STRAGGLER = "straggler"
    HUNG = "hung"
    DEAD = "dead"


@dataclass(frozen=True)
class WorkerIncident:
    """A worker that is not healthy, localised: which worker, since when, in which section
    and step. ``culprit`` is False for a worker that only waits on another one (a rank blocked
    in a collective whose peer stopped); ``score`` is a straggler's median-rank time over its
    own (1 = typical, 0.5 = twice as slow). Times are wall-clock seconds."""

    worker: str
    kind: Health
    step: int
    detected_s: float
    since_s: float
    section: str = ""
    collective: str = ""
    culprit: bool = True
    score: float = 1.0
    pid: int = 0
    host: str = ""
    detail: str = ""

    @property
    def role(self) -> str:
        return self.worker.split(":", 1)[0]


class RecoveryKind(str, Enum):
    """What an adapter does about an incident. ``kill``: end the worker's process (a hang
    becomes a crash the framework notices); ``replace``: a fresh rollout replica, weights
    re-synced, its requests resubmitted; ``rebuild``: a new trainer worker group restored from
    the newest snapshot, the step in flight redone; ``report``: record it only; ``abort``: give
    up and let the job fail as it would without rlweave."""

    REPORT = "report"
    KILL = "kill"
    REPLACE = "replace"
    REBUILD = "rebuild"
    ABORT = "abort"


@dataclass(frozen=True)
class RecoveryAction:
    kind: RecoveryKind
    reason: str = ""


@dataclass(frozen=True)
class RecoveryRecord:
    """A recovery an adapter carried out: the incident, the action, when the fault was injected
    (``fault_s``, 0 when not known), detected, and when recovery started and ended (wall-clock
    seconds); the steps redone and the requests resubmitted; ``ok`` False if it failed."""

    incident: WorkerIncident
    action: RecoveryAction
    start_s: float
    end_s: float
    fault_s: float = 0.0
    steps_redone: int = 0
    requests_resubmitted: int = 0
    ok: bool = True
    detail: str = ""


@dataclass(frozen=True)
class FaultSpec:
    """A fault to inject (rlweave's chaos tool): ``action`` ``kill`` (SIGKILL), ``stop``
    (SIGSTOP: a hang), ``slow`` (the worker's sections take ``factor`` times as long) or
    ``corrupt`` (the newest persisted checkpoint). ``worker`` is ``"<role>:<rank>"``, with
    ``/engine`` for a rollout replica's engine process. It fires once the worker is in ``step``
    (and in ``section``, if given), ``delay_s`` later."""

    action: str
    worker: str = ""
    step: int = 1
    section: str = ""
    delay_s: float = 0.0
    factor: float = 1.0


@dataclass(frozen=True)
class ResilienceSettings:
    """What the adapters of an enabled resilience plugin run: heartbeats every ``heartbeat_s``
    (the monitor checks health every ``check_s``), a host-memory snapshot every
    ``snapshot_every`` steps under ``snapshot_dir``, at most ``max_recoveries`` recoveries per
    run, each given ``recovery_timeout_s``."""

    heartbeat_s: float
    check_s: float
    snapshot_every: int
    snapshot_dir: str
    max_recoveries: int
    recovery_timeout_s: float


@dataclass(frozen=True)
class CheckpointCandidate:
    """A persisted checkpoint found on resume: its step, folder, and what its verification
    found wrong (``()``: every file present with its recorded size and checksum)."""

    step: int
    path: str
    problems: tuple[str, ...] = ()
