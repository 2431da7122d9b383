"""rlweave's framework environments and re-launching a command in the one that holds a framework.

``scripts/setup_envs.sh`` builds them beside each other in the checkout: ``.venv`` (core: verl,
Ray), ``.venv-vllm``, ``.venv-mcore`` and ``.venv-sglang``. ``RLWEAVE_ENVS_DIR`` points
elsewhere when they live elsewhere.
"""

from __future__ import annotations

import importlib.util
import os
import sys
from pathlib import Path

# Environment folder name -> the import that marks it.
ENVIRONMENTS: dict[str, str] = {
    ".venv": "verl",
    ".venv-vllm": "vllm",
    ".venv-mcore": "megatron.core",
    ".venv-sglang": "sglang",
}


def envs_dir() -> Path:
    if "RLWEAVE_ENVS_DIR" in os.environ:
        return Path(os.environ["RLWEAVE_ENVS_DIR"])
    prefix = Path(sys.prefix)
    if prefix.name in ENVIRONMENTS:
        return prefix.parent
    return Path(__file__).resolve().parent.parent  # an editable install: the checkout


def site_packages(env: str) -> list[Path]:
    return sorted((envs_dir() / env).glob("lib/python3*/site-packages"))


def python_of(env: str) -> Path:
    return envs_dir() / env / "bin" / "python"


def has_module(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except ModuleNotFoundError:
        return False


def env_for(module: str) -> str:
    return next(env for env, marker in ENVIRONMENTS.items() if marker == module)


def relaunch_in(module: str, argv: list[str]) -> int:
    """Run ``rlweave <argv>`` in the environment whose framework is ``module``; its exit code.

    Raises a clear error when that environment has not been built.
    """
    env = env_for(module)
    python = python_of(env)
    if not python.exists():
        raise SystemExit(
            f"rlweave: this command needs {module}, which is not importable here and no "
            f"environment {python.parent.parent} exists. Build it with scripts/setup_envs.sh."
        )
    print(f"[rlweave] running in {env} (has {module})", file=sys.stderr)
    os.execv(str(python), [str(python), "-m", "rlweave.cli", *argv])
    return 0  # not reached
