"""What the vLLM tests share: the engine environment and the workload whose greedy tokens every
rlweave scheduler must reproduce."""

from __future__ import annotations

import os

# More requests than batch slots, lengths 1/8x..1x, all arriving together: the waiting queue is
# never empty, so a scheduler that reorders it or preempts has every chance to change tokens.
WORKLOAD = dict(requests=8, max_tokens=32, max_num_seqs=2, repeats=1, varied=True, exact=True)


def engine_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("RLWEAVE")}
    env.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    return env | extra
