"""The verl trainer's one stage seam (adapters/verl/trainer.py), on a stand-in for verl's trainer
class: the seam is plain Python over the trainer's methods, so its composition is checked here;
verl's own trainers go through it in the verl_trainer group (tracing, resilience, stream mode)."""

from __future__ import annotations

import os
from typing import Any

import pytest

from rlweave import host
from rlweave.adapters.verl.trainer import STAGE_METHODS, with_seam
from rlweave.types import Stage


class _Batch:
    keys = ["a", "b", "c"]


class _Calls:
    def __init__(self, name: str, log: list[str]) -> None:
        self.name, self.log = name, log

    def __call__(self, *args: Any, **kwargs: Any) -> str:
        self.log.append(self.name)
        return self.name


class StandInTrainer:
    """What the seam touches of verl's trainer: the stage methods, the replay buffer's sample,
    the checkpoint manager's weight push, ``_setup`` and ``_compute_metrics``."""

    def __init__(self) -> None:
        self.log: list[str] = []
        self.global_steps = 4
        self.replay_buffer = type("ReplayBuffer", (), {})()
        self.replay_buffer.sample = _Calls("sample", self.log)

    def _setup(self) -> None:
        self.checkpoint_manager = type("CheckpointManager", (), {})()
        self.checkpoint_manager.update_weights = _Calls("update_weights", self.log)

    def _compute_metrics(self, batch: Any, metrics: dict, timing_raw: dict, global_steps: int, epoch: int) -> None:
        return None


for _name in STAGE_METHODS:
    setattr(StandInTrainer, _name, lambda self, batch=None, _n=_name: _Calls(_n, self.log)())


@pytest.fixture()
def trainer(monkeypatch):
    for key in [k for k in os.environ if k.startswith("RLWEAVE__")]:
        monkeypatch.delenv(key)
    host.reset()
    yield with_seam(StandInTrainer)()
    host.reset()


def _around(tag: str, seen: list[tuple[str, Stage, int]]):
    def around(context, batch, run):
        seen.append((tag, context.stage, context.batch_size))
        trainer_log = run()
        seen.append((f"/{tag}", context.stage, context.step))
        return trainer_log
    return around


def test_every_stage_runs_through_the_arounds_in_attach_order_and_returns_verls_result(trainer):
    seen: list[tuple[str, Stage, int]] = []
    trainer._setup()
    trainer.rlweave_attach(_around("outer", seen))
    trainer.rlweave_attach(_around("inner", seen))
    assert trainer._update_actor(_Batch()) == "_update_actor"
    assert seen == [("outer", Stage.UPDATE_ACTOR, 3), ("inner", Stage.UPDATE_ACTOR, 3),
                    ("/inner", Stage.UPDATE_ACTOR, 4), ("/outer", Stage.UPDATE_ACTOR, 4)]
    seen.clear()
    assert trainer.replay_buffer.sample() == "sample"
    assert trainer.checkpoint_manager.update_weights(3) == "update_weights"
    assert [(tag, stage) for tag, stage, _ in seen if tag == "outer"] == [("outer", Stage.GENERATE),
                                                                          ("outer", Stage.WEIGHT_SYNC)]
    assert trainer.log == ["_update_actor", "sample", "update_weights"]  # each verl call once


def test_without_arounds_a_stage_is_verls_call_and_verls_push_stays_reachable(trainer):
    trainer._setup()
    assert trainer._compute_values(_Batch()) == "_compute_values"
    trainer.checkpoint_manager.update_weights.__wrapped__(1)  # what a recovery pushes with
    assert trainer.log == ["_compute_values", "update_weights"]


def test_the_seam_is_given_once():
    seamed = with_seam(StandInTrainer)
    assert with_seam(seamed) is seamed
    assert seamed.__mro__[2] is StandInTrainer
