from __future__ import annotations

import pytest

from rlweave import host


@pytest.fixture(autouse=True)
def clean_host(monkeypatch: pytest.MonkeyPatch):
    """Each test starts with no RLWEAVE__* settings and no host, and leaves none behind."""
    import os

    for name in list(os.environ):
        if name.startswith("RLWEAVE"):
            monkeypatch.delenv(name)
    host.reset()
    yield
    host.reset()
