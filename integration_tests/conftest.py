"""What every integration group shares: a fresh process that sees a framework version just
outside rlweave's declared range for it, to show that the framework's own loader refuses it.

Only the installed version that rlweave reads (``Framework.find_version``) is pretended: the
framework itself is the real one of the group's environment, and no other version of it can be
installed beside it.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from packaging.version import Version

from rlweave.frameworks import FRAMEWORKS

PRETEND = """import rlweave.frameworks as _frameworks
_real = _frameworks.Framework.find_version
_frameworks.Framework.find_version = lambda self, paths=None: {version!r} if self.name == {name!r} else _real(self, paths)
"""


def versions_outside(name: str) -> list[str]:
    """The releases nearest to framework ``name``'s declared range on either side: just below
    its lower bound, and its excluded upper bound and that bound's first pre-release."""
    found = []
    for spec in FRAMEWORKS[name].supported:
        v = Version(spec.version)
        major, minor, micro = (*v.release, 0, 0)[:3]
        if spec.operator == ">=":
            found.append(f"{major}.{minor}.{micro - 1}" if micro else
                         f"{major}.{minor - 1}.99" if minor else f"{major - 1}.99.99")
        elif spec.operator == "<":
            found += [str(v), f"{v}rc1"]
    assert found and not any(FRAMEWORKS[name].is_supported(f) for f in found)
    return found


def _child_env() -> dict[str, str]:
    """This environment's variables for a child process, those naming rlweave removed."""
    base = {k: v for k, v in os.environ.items() if not k.startswith("RLWEAVE")}
    base.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    return base


def run_pretending(name: str, version: str, code: str, **env: str) -> subprocess.CompletedProcess:
    """Run ``code`` in a fresh interpreter that reports ``version`` of framework ``name``, with
    ``env`` on top of :func:`_child_env`."""
    return subprocess.run([sys.executable, "-c", pretend(name, version) + code],
                          env=_child_env() | env, capture_output=True, text=True, timeout=240)


# One interpreter imports the framework (most of a start-up's cost), then runs each job in a fork
# of itself: rlweave is not imported yet there (checked), so each fork loads it, reads the
# pretended version and the job's variables afresh, and exits as `python -c JOB` would.
FORKED = """import json, os, sys
exec(sys.argv[1])
assert not [m for m in sys.modules if m.split(".")[0] == "rlweave"], "the shared import loaded rlweave"
codes = []
for job in json.loads(sys.argv[2]):
    sys.stdout.flush(); sys.stderr.flush()
    pid = os.fork()
    if pid == 0:
        for fd, path in ((1, job["out"]), (2, job["err"])):
            os.dup2(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC), fd)
        os.environ.update(job["env"])
        exec(compile(job["code"], "<string>", "exec"), {"__name__": "__main__"})
        sys.exit(0)
    codes.append(os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]))
print(json.dumps(codes))
"""


def pretend(name: str, version: str) -> str:
    """Code that makes rlweave read ``version`` of framework ``name``."""
    return PRETEND.format(name=name, version=version)


def run_forked(shared: str, jobs: list[tuple[str, dict[str, str]]], workdir: Path) -> list[subprocess.CompletedProcess]:
    """Each ``(code, env)`` of ``jobs`` run as a fresh process would run it, after one shared
    ``shared`` import of the framework (see ``FORKED``); env as :func:`run_pretending`'s, but
    set after that import, so only for variables the framework does not read on import."""
    spec = [dict(code=code, env=env, out=str(workdir / f"job{i}.out"), err=str(workdir / f"job{i}.err"))
            for i, (code, env) in enumerate(jobs)]
    proc = subprocess.run([sys.executable, "-c", FORKED, shared, json.dumps(spec)], env=_child_env(),
                          capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stderr[-3000:]
    codes = json.loads(proc.stdout.strip().splitlines()[-1])
    return [subprocess.CompletedProcess(job["code"], rc, Path(job["out"]).read_text(), Path(job["err"]).read_text())
            for job, rc in zip(spec, codes)]


@pytest.fixture(scope="session")
def version_gate():
    """``(versions_outside, run_pretending)``: see this module's docstring."""
    return versions_outside, run_pretending


@pytest.fixture(scope="session")
def forked_gate():
    """``(pretend, run_forked)``: several fresh processes for the price of one framework import."""
    return pretend, run_forked
