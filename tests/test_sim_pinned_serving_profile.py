"""FastServe's iteration profile keeps its figures on the shared engine model: the numbers below
were produced by the profile's own least-squares line (commit b20d70b) on this stream of
iterations, before its line became a fitted :class:`rlweave.sim.EngineModel`. They also pin the
refit cadence: the line moves only every ``refit_every`` (64) samples."""

from __future__ import annotations

import numpy as np
import pytest

from rlweave.plugins.preemptive_serving.profile import IterationProfile

# iteration index -> ((fixed_s, per_token_s), prefill_s(300))
PINNED = {
    49: ((0.0039992875253013205, 2.9766182260944455e-05), 0.012929142203584657),
    99: ((0.0039992875253013205, 2.9766182260944455e-05), 0.012929142203584657),
    149: ((0.004025366772930962, 2.9627557266878418e-05), 0.012913633952994486),
    199: ((0.004025366772930962, 2.9627557266878418e-05), 0.012913633952994486),
    249: ((0.003941658079645072, 3.019393867559838e-05), 0.012999839682324585),
    299: ((0.003941658079645072, 3.019393867559838e-05), 0.012999839682324585),
    349: ((0.004034439251191685, 2.9772395043133387e-05), 0.012966157764131701),
    399: ((0.004034439251191685, 2.9772395043133387e-05), 0.012966157764131701),
}


def test_the_profile_keeps_its_line_and_its_cadence() -> None:
    rng = np.random.default_rng(5)
    profile, got = IterationProfile(), {}
    for k in range(400):
        tokens = int(rng.choice([1, 2, 3, 4, 8, 30, 64, 200, 512])) if k % 3 else int(rng.integers(1, 16))
        profile.observe(tokens, 0.004 + 3e-5 * tokens + float(rng.normal(0, 5e-4)))
        if profile.ready and k % 50 == 49:
            got[k] = (profile.line(), profile.prefill_s(300))
    assert got.keys() == PINNED.keys()
    for k, (line, prefill) in PINNED.items():
        assert got[k][0] == pytest.approx(line, rel=1e-9)
        assert got[k][1] == pytest.approx(prefill, rel=1e-9)
    assert profile.shortest_s == pytest.approx(0.0026476072306765024, rel=1e-12)
