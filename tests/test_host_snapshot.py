"""Resilience's stage-1 host snapshot: what a rebuilt rank restores equals what the rank had, a
snapshot cut short leaves the one before it whole, and a snapshot that does not fit is refused."""

from __future__ import annotations

import pytest
import torch

from rlweave.adapters.verl.host_snapshot import HostSnapshots


def _model(seed: int) -> tuple[torch.nn.Module, torch.optim.Optimizer, torch.optim.lr_scheduler.LRScheduler]:
    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(5, 7), torch.nn.LayerNorm(7), torch.nn.Linear(7, 3, bias=False))
    model[2].weight.data = model[2].weight.data.to(torch.bfloat16).float()  # a dtype other than the first
    model.register_buffer("calls", torch.zeros((), dtype=torch.int64))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2, weight_decay=0.1)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1.0 / (1 + step))
    return model, optimizer, scheduler


def _train(model: torch.nn.Module, optimizer: torch.optim.Optimizer, scheduler, step: int) -> None:
    data = torch.randn(4, 5, generator=torch.Generator().manual_seed(step))
    optimizer.zero_grad()
    model(data).square().mean().backward()
    optimizer.step()
    scheduler.step()
    model.calls += 1


def _state(model: torch.nn.Module, optimizer: torch.optim.Optimizer, scheduler) -> list[torch.Tensor]:
    tensors = [t.clone() for t in model.state_dict().values()]
    tensors += [v.clone() for s in optimizer.state.values() for v in s.values()]
    return tensors + [torch.tensor(scheduler.get_last_lr())]


def _same(a: list[torch.Tensor], b: list[torch.Tensor]) -> bool:
    return len(a) == len(b) and all(torch.equal(x, y) for x, y in zip(a, b, strict=True))


def test_a_rebuilt_rank_restores_the_state_and_trains_on_exactly_as_the_original(tmp_path):
    model, optimizer, scheduler = _model(0)
    snapshots = HostSnapshots(tmp_path, rank=0)
    for step in (1, 2):
        _train(model, optimizer, scheduler, step)
        snapshots.save(step, model, optimizer, scheduler, rng={"step": step})
    at_two = _state(model, optimizer, scheduler)
    _train(model, optimizer, scheduler, 3)
    after_three = _state(model, optimizer, scheduler)

    rebuilt, rebuilt_optimizer, rebuilt_scheduler = _model(1)  # another process: other weights, no optimizer state
    rng = HostSnapshots(tmp_path, rank=0).restore(2, rebuilt, rebuilt_optimizer, rebuilt_scheduler)
    assert rng == {"step": 2}
    assert _same(_state(rebuilt, rebuilt_optimizer, rebuilt_scheduler), at_two)
    _train(rebuilt, rebuilt_optimizer, rebuilt_scheduler, 3)
    assert _same(_state(rebuilt, rebuilt_optimizer, rebuilt_scheduler), after_three)


def test_a_snapshot_cut_short_leaves_the_one_before_it_restorable(tmp_path, monkeypatch):
    model, optimizer, scheduler = _model(0)
    snapshots = HostSnapshots(tmp_path, rank=3)
    _train(model, optimizer, scheduler, 1)
    snapshots.save(1, model, optimizer, scheduler, rng={})
    at_one = _state(model, optimizer, scheduler)
    _train(model, optimizer, scheduler, 2)
    snapshots.save(2, model, optimizer, scheduler, rng={})
    _train(model, optimizer, scheduler, 3)

    def die(*args, **kwargs):  # the rank dies after copying, before its commit is renamed in
        raise SystemExit("killed")

    monkeypatch.setattr("rlweave.adapters.verl.host_snapshot.os.replace", die)
    with pytest.raises(SystemExit):
        snapshots.save(3, model, optimizer, scheduler, rng={})  # overwrites step 1's slot
    monkeypatch.undo()
    assert HostSnapshots(tmp_path, rank=3).steps() == [2]
    with pytest.raises(RuntimeError, match="no host snapshot of step 1 .* holds \\[2\\]"):
        HostSnapshots(tmp_path, rank=3).restore(1, *_model(1))
    _train(model, optimizer, scheduler, 4)
    snapshots.save(4, model, optimizer, scheduler, rng={})  # into the slot step 3 never committed
    assert snapshots.steps() == [2, 4]
    assert not _same(at_one, _state(model, optimizer, scheduler))


def test_a_snapshot_of_another_model_is_refused_with_the_fix(tmp_path):
    model, optimizer, scheduler = _model(0)
    _train(model, optimizer, scheduler, 1)
    HostSnapshots(tmp_path, rank=0).save(1, model, optimizer, scheduler, rng={})
    other = torch.nn.Linear(5, 3)
    with pytest.raises(RuntimeError, match="does not match the host snapshot of step 1.*persisted checkpoint"):
        HostSnapshots(tmp_path, rank=0).restore(1, other, torch.optim.AdamW(other.parameters()), None)


def test_a_larger_state_gets_a_new_slot_file_and_each_rank_its_own(tmp_path):
    small, small_optimizer, _ = _model(0)
    big = torch.nn.Linear(64, 64)
    big_optimizer = torch.optim.SGD(big.parameters(), lr=0.1, momentum=0.9)
    _train(small, small_optimizer, torch.optim.lr_scheduler.LambdaLR(small_optimizer, lambda s: 1.0), 1)
    big(torch.ones(1, 64)).sum().backward()
    big_optimizer.step()
    a, b = HostSnapshots(tmp_path, rank=0), HostSnapshots(tmp_path, rank=1)
    for step in (1, 2, 3):
        a.save(step, small if step < 3 else big, small_optimizer if step < 3 else big_optimizer, None, rng={})
        b.save(step, small, small_optimizer, None, rng={})
    assert a.steps() == [2, 3] and b.steps() == [2, 3]
    restored = torch.nn.Linear(64, 64)
    HostSnapshots(tmp_path, rank=0).restore(3, restored, torch.optim.SGD(restored.parameters(), lr=0.1, momentum=0.9),
                                            None)
    assert torch.equal(restored.weight, big.weight)
