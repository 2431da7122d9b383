"""verl on CPU: one gloo backend instead of ``cpu:gloo,cpu:gloo``.

``initialize_global_process_group_ray`` builds ``f"cpu:gloo,{device}:{backend}"``; with the CPU
platform that names the cpu device twice and torch raises ``ValueError: Duplicate device type
cpu``. The wrapper passes ``backend="cpu:gloo"`` when the caller gave none, which is what the
string means on a machine whose only device is the CPU.
"""

from __future__ import annotations

from rlweave.patches import Revert


def apply() -> Revert:
    import verl.utils.distributed as dist_utils

    original = dist_utils.initialize_global_process_group_ray

    def initialize_global_process_group_ray(timeout_second=None, backend=None):  # type: ignore[no-untyped-def]
        return original(timeout_second=timeout_second, backend=backend or "cpu:gloo")

    dist_utils.initialize_global_process_group_ray = initialize_global_process_group_ray

    def revert() -> None:
        dist_utils.initialize_global_process_group_ray = original

    return revert
