"""vLLM picks rlweave's scheduler by default while an rlweave plugin schedules.

``SchedulerConfig.get_scheduler_cls`` runs in the EngineCore process after vLLM has loaded its
general plugins. When the user configured no ``scheduler_cls`` and this process's rlweave host
has a plugin implementing ``rlweave_schedule`` or the engine observation hooks, the default
class (``Scheduler`` or ``AsyncScheduler``) is swapped for rlweave's subclass of the same class.
A user's explicit ``scheduler_cls`` is always respected.
"""

from __future__ import annotations

from rlweave.patches import Revert


def apply() -> Revert:
    from vllm.config.scheduler import SchedulerConfig

    from rlweave.adapters.vllm.scheduler import rlweave_scheduler_for

    original = SchedulerConfig.get_scheduler_cls

    def get_scheduler_cls(self):  # type: ignore[no-untyped-def]
        cls = original(self)
        return rlweave_scheduler_for(cls) if self.scheduler_cls is None else cls

    SchedulerConfig.get_scheduler_cls = get_scheduler_cls

    def revert() -> None:
        SchedulerConfig.get_scheduler_cls = original

    return revert
