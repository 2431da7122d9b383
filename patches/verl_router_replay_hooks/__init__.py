"""verl tells rlweave when it hands replayed routing to Megatron (ReLibra's two timescales).

verl's Megatron engine has no callback around router replay, so three names in
``verl.workers.engine.megatron.transformer_impl`` are wrapped, each calling the original
unchanged and then :mod:`rlweave.adapters.verl.router_replay`:

- ``MegatronEngine.forward_backward_batch``: marks a training call (``forward_only=False``) of
  an engine that replays routing, so the next wrapper knows a step is starting and has the
  engine's model and optimizer;
- ``make_batch_generator(micro_batches, ...)``: inside such a call the step's micro-batches are
  final: ``rebalance_before_step`` runs before Megatron's schedule starts;
- ``set_router_replay_data(..., model=chunk)``: after verl set the micro-batch's targets on the
  routers, ``plan_microbatch`` plans every ReLibra layer for them.

Applied only when a plugin decides expert placement (``rlweave.replay_balance``), and only in
processes where verl's Megatron engine imports (megatron-core installed): it runs nowhere else.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from functools import wraps
from typing import Any

from rlweave.patches import Revert

_training_engine: ContextVar[Any] = ContextVar("rlweave_replay_training_engine", default=None)


@contextmanager
def training_call(engine: Any) -> Iterator[None]:
    """Inside a training ``forward_backward_batch`` of ``engine`` (``None``: not one)."""
    token = _training_engine.set(engine)
    try:
        yield
    finally:
        _training_engine.reset(token)


def apply() -> Revert:
    try:
        import verl.workers.engine.megatron.transformer_impl as impl
    except ImportError:  # no megatron-core here, so verl cannot run its Megatron engine in this process
        return lambda: None

    engine_cls = impl.MegatronEngine
    originals = {"set_router_replay_data": impl.set_router_replay_data,
                 "make_batch_generator": impl.make_batch_generator}
    original_step = engine_cls.__dict__["forward_backward_batch"]

    @wraps(original_step)
    def forward_backward_batch(self: Any, data: Any, loss_function: Any, forward_only: bool = False) -> Any:
        with training_call(self if self.enable_routing_replay and not forward_only else None):
            return original_step(self, data, loss_function, forward_only)

    @wraps(originals["make_batch_generator"])
    def make_batch_generator(micro_batches: Any, *args: Any, **kwargs: Any) -> Any:
        engine = _training_engine.get()
        if engine is not None:
            from rlweave.adapters.verl.router_replay import rebalance_before_step

            rebalance_before_step(engine.module, micro_batches, engine.tf_config,
                                  getattr(engine, "optimizer", None))
        return originals["make_batch_generator"](micro_batches, *args, **kwargs)

    @wraps(originals["set_router_replay_data"])
    def set_router_replay_data(*args: Any, **kwargs: Any) -> None:
        originals["set_router_replay_data"](*args, **kwargs)
        model = kwargs.get("model")
        if model is not None:  # verl 0.9 always passes the forwarded chunk
            from rlweave.adapters.verl.router_replay import plan_microbatch

            plan_microbatch(model)

    engine_cls.forward_backward_batch = forward_backward_batch
    impl.make_batch_generator = make_batch_generator
    impl.set_router_replay_data = set_router_replay_data

    def revert() -> None:
        engine_cls.forward_backward_batch = original_step
        for name, function in originals.items():
            setattr(impl, name, function)

    return revert
