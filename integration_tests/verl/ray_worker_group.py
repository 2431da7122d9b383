"""A verl RayWorkerGroup of two CPU workers; each runs a stage through rlweave's stage hook.

Run as a script with rlweave enabled in the environment; prints the workers' pids and results.
"""

from __future__ import annotations

import json
import os
import sys

import ray
from verl.single_controller.base import Worker
from verl.single_controller.base.decorator import Dispatch, register
from verl.single_controller.ray import RayClassWithInitArgs, RayResourcePool, RayWorkerGroup


class StageWorker(Worker):
    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def run_stage(self, step: int) -> dict:
        import verl  # noqa: F401  (a worker process loads rlweave through verl's entry point)

        from rlweave.host import get_host
        from rlweave.types import Stage, StageContext

        host = get_host()
        context = StageContext(Stage.UPDATE_ACTOR, step, f"actor-rank{self.rank}")
        result = host.hook.rlweave_run_stage(context=context, run=lambda: self.rank * 10 + step)
        from rlweave.tracing import tracer

        tracer.flush()
        return {"pid": os.getpid(), "result": result, "active": host.active}


def main() -> None:
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    pool = RayResourcePool([2], use_gpu=False, max_colocate_count=1)
    group = RayWorkerGroup(pool, RayClassWithInitArgs(cls=ray.remote(StageWorker)), device_name="cpu")
    print(json.dumps(group.run_stage(step=3)))
    sys.stdout.flush()
    ray.shutdown()


if __name__ == "__main__":
    main()
