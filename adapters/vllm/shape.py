"""What shape the installed vLLM's v1 scheduler has where rlweave's scheduler relies on it.

rlweave supports vLLM 0.24 through 0.34, whose ``Scheduler`` differs where rlweave's subclass
touches it. Instead of version numbers, the differences are found once, from the scheduler's
own source (``vllm/v1/core/sched/scheduler.py``), so a release that changes one shows up in
the engine's log and in ``rlweave doctor`` rather than as a silent drift. This module imports
no vLLM: doctor reads the file of any environment it inspects.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

SCHEDULER_FILE = Path("vllm", "v1", "core", "sched", "scheduler.py")
# Waiting queues beside ``waiting`` that vLLM serves but rlweave's decisions do not order.
OTHER_QUEUES = ("skipped_waiting", "async_kv_waiting")


@dataclass(frozen=True)
class SchedulerShape:
    # _preempt_request frees a request's KV only through _free_request_blocks (0.24-0.34), so
    # rlweave can park a request by calling it with that one step held back.
    parks_by_upstream: bool
    # reset_preempted_req_ids (0.32+) tells the model runner of preemptions made before
    # schedule(); on 0.24 rlweave adds its own to the iteration's preempted_req_ids.
    persistent_preempted_ids: bool
    # How a preempted request is resent when it resumes: "new request data" (0.34), "new request
    # data with model runner V2, else resumed cached data" (0.24-0.33). Either way the model runner
    # must have been told of the preemption (preempted_req_ids) first.
    resume_sent_as: str
    other_queues: tuple[str, ...]  # OTHER_QUEUES found (0.24: skipped_waiting; 0.34: async_kv_waiting)

    def describe(self) -> str:
        return "; ".join((
            "parks through vLLM's _preempt_request" if self.parks_by_upstream else
            "UNKNOWN _preempt_request (frees KV other than through _free_request_blocks): preempted "
            "requests are recomputed, never parked",
            "preempted ids reach the runner through " + (
                "reset_preempted_req_ids" if self.persistent_preempted_ids else "rlweave (no reset_preempted_req_ids)"),
            f"a resumed request is sent as {self.resume_sent_as}",
            "waiting queues rlweave does not order: " + (", ".join(self.other_queues) or "none"),
        ))


def _method(source: str, name: str) -> str:
    """The text of method ``name`` of a class in ``source`` ('' if absent)."""
    found = re.search(rf"\n    def {name}\(.*?(?=\n    (?:def |@|async def )|\Z)", source, re.S)
    return found.group(0) if found else ""


def shape_of(source: str) -> SchedulerShape:
    """The shape of the scheduler whose ``scheduler.py`` text is ``source``."""
    preempt = _method(source, "_preempt_request")
    cached = _method(source, "_make_cached_request_data")
    if "resumed_reqs" not in cached.split(")", 1)[0]:
        resume = "new request data"
    elif "scheduled_new_reqs.extend(scheduled_resumed_reqs)" in source:
        resume = "new request data with model runner V2, else resumed cached data"
    else:
        resume = "resumed cached data"
    return SchedulerShape(
        parks_by_upstream="self._free_request_blocks(request)" in preempt
        and "kv_cache_manager.free(" not in preempt,
        persistent_preempted_ids="self.reset_preempted_req_ids" in source,
        resume_sent_as=resume,
        other_queues=tuple(q for q in OTHER_QUEUES if re.search(rf"self\.{q}\s*[:=]", source)),
    )


def shape_in(paths: list[str]) -> SchedulerShape | None:
    """The shape of the vLLM installed under one of the site-packages ``paths`` (None: none)."""
    for folder in paths:
        file = Path(folder, SCHEDULER_FILE)
        if file.is_file():
            return shape_of(file.read_text())
    return None
