"""A plugin that verl cannot run is refused however it was enabled: through ``RLWEAVE__*``
environment variables alone (no ``+rlweave.*`` on the command line), ``import verl`` stops with
rlweave's one message, as the command line's ``+rlweave.<plugin>.enable=true`` does; a plugin
verl can run, enabled the same way, still loads (the verl adapter in a verl process)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest


def import_verl(**env: str) -> subprocess.CompletedProcess:
    base = {k: v for k, v in os.environ.items() if not k.startswith("RLWEAVE")}
    return subprocess.run([sys.executable, "-W", "ignore", "-c", "import verl; print('loaded')"], env=base | env,
                          capture_output=True, text=True, timeout=240)


@pytest.mark.timeout(300)
@pytest.mark.parametrize("plugin", ["replay_balance", "overlap"])
def test_a_plugin_enabled_only_by_environment_variable_is_refused_in_a_verl_process(plugin):
    proc = import_verl(**{f"RLWEAVE__{plugin.upper()}__ENABLE": "true"})
    assert proc.returncode != 0 and "loaded" not in proc.stdout
    [line] = [line for line in proc.stderr.splitlines() if line.startswith("rlweave:")]
    assert f"rlweave.{plugin}.enable=true (from RLWEAVE__* environment variables)" in line
    assert line.endswith(f"set rlweave.{plugin}.enable=false.")


@pytest.mark.timeout(300)
def test_a_plugin_verl_can_run_enabled_by_environment_variable_loads():
    proc = import_verl(RLWEAVE__TRACING__ENABLE="true")
    assert proc.returncode == 0 and proc.stdout.strip() == "loaded", proc.stderr[-2000:]
