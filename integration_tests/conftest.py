"""What every integration group shares: a fresh process that sees a framework version just
outside rlweave's declared range for it, to show that the framework's own loader refuses it.

Only the installed version that rlweave reads (``Framework.find_version``) is pretended: the
framework itself is the real one of the group's environment, and no other version of it can be
installed beside it.
"""

from __future__ import annotations

import os
import subprocess
import sys

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


def run_pretending(name: str, version: str, code: str, **env: str) -> subprocess.CompletedProcess:
    """Run ``code`` in a fresh interpreter that reports ``version`` of framework ``name``, with
    ``env`` on top of this environment's variables (those naming rlweave removed)."""
    base = {k: v for k, v in os.environ.items() if not k.startswith("RLWEAVE")}
    base.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    return subprocess.run([sys.executable, "-c", PRETEND.format(name=name, version=version) + code],
                          env=base | env, capture_output=True, text=True, timeout=240)


@pytest.fixture(scope="session")
def version_gate():
    """``(versions_outside, run_pretending)``: see this module's docstring."""
    return versions_outside, run_pretending
