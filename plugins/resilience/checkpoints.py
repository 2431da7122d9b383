"""Which persisted checkpoint to resume from: the newest one whose verification found nothing
wrong. A corrupt or partial one (a checksum that differs, a file missing or cut short) is
skipped for the previous good one, and the adapter says so."""

from __future__ import annotations

from collections.abc import Sequence

from rlweave.types import CheckpointCandidate


def newest_good(candidates: Sequence[CheckpointCandidate]) -> CheckpointCandidate | None:
    """The newest candidate without problems; ``None`` if there is none."""
    good = [c for c in candidates if not c.problems]
    return max(good, key=lambda c: c.step) if good else None
