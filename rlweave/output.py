"""What a person reads: rlweave's progress and tables on the terminal, the frameworks' logs in a file.

``rlweave bench`` and ``rlweave demo`` run inside :func:`frameworks_log_to`. Output is routed by
who writes it:

- file descriptors 1 and 2 point at the log file, so every subprocess (vLLM engine cores, Ray
  workers, verl's trainer) and native code writes there;
- ``sys.stdout`` and ``sys.stderr`` are routers: a write made by a framework's module (vLLM,
  verl, Ray, torch, transformers, ...), by :mod:`logging` or by :mod:`warnings` goes to the log
  file; everything else (rlweave, rich, tqdm) goes to the terminal. So framework loggers go to
  the file however and whenever the framework configured them, and no benchmark has to change.
- exceptions that Python can only report as "Exception ignored in ..." (``__del__`` and the
  like) go to the log file too, until the process exits.

On the way out, objects that frameworks left in reference cycles are collected while their
modules are still loaded. Some cannot be: vLLM 0.32 keeps the ImportError of a missing
torchcodec in a module global (``vllm.multimodal.media.audio._torchcodec_import_exc``), and its
traceback holds every frame that was on the stack at vLLM's first import, with their locals.
An engine created in such a frame lives until interpreter exit, when ``AsyncLLM.__del__`` calls
``shutdown()`` again after module globals are cleared and raises ``TypeError: 'NoneType' object
is not callable``. The engine was already shut down by its owner, so this is noise: it goes to
the log, not the terminal.
"""

from __future__ import annotations

import gc
import io
import os
import sys
import traceback
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, TextIO

# Top-level packages whose writes to sys.stdout/sys.stderr are framework logs.
LOGGED_PACKAGES = frozenset({
    "logging", "warnings", "vllm", "verl", "ray", "torch", "transformers", "tokenizers",
    "sglang", "megatron", "hydra", "omegaconf", "tensordict", "datasets", "accelerate",
    "huggingface_hub", "triton", "uvicorn", "fastapi", "transfer_queue", "codetiming",
})


class _Router(io.TextIOBase):
    """A text stream that sends each write to the log or the terminal, by the writer's module."""

    def __init__(self, terminal: TextIO, log: TextIO) -> None:
        self.terminal, self.log = terminal, log

    def write(self, text: str) -> int:
        writer = sys._getframe(1).f_globals.get("__name__", "")
        target = self.log if writer.partition(".")[0] in LOGGED_PACKAGES else self.terminal
        return target.write(text)

    def flush(self) -> None:
        self.terminal.flush()
        self.log.flush()

    def isatty(self) -> bool:
        return self.terminal.isatty()

    def fileno(self) -> int:
        return self.terminal.fileno()

    @property
    def encoding(self) -> str:  # type: ignore[override]
        return self.terminal.encoding


def _unraisable_to(log: TextIO) -> Any:
    def hook(unraisable: Any) -> None:
        log.write(f"{unraisable.err_msg or 'Exception ignored in'}: {unraisable.object!r}\n")
        traceback.print_exception(unraisable.exc_type, unraisable.exc_value, unraisable.exc_traceback,
                                  file=log)
    return hook


@contextmanager
def frameworks_log_to(path: Path, *, stdout_is_data: bool = False) -> Iterator[TextIO]:
    """Route the frameworks' output to ``path`` (rewritten) for the enclosed block; yields the
    terminal's stdout. With ``stdout_is_data`` (``--json``) everything for a person goes to
    the terminal's stderr, and the yielded stream is the only writer of stdout.

    A framework that kept ``sys.stdout`` in a log handler keeps a router past the block; it then
    still sends framework writes to the log file (left open) and others to the real streams.
    Unraisable exceptions go to the log until the process exits (frameworks' finalizers run
    at exit)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    saved = sys.stdout, sys.stderr
    for stream in saved[:2]:
        stream.flush()
    saved_fds = os.dup(1), os.dup(2)
    terminal_out = os.fdopen(os.dup(saved_fds[0]), "w", buffering=1, encoding="utf-8")
    terminal_err = os.fdopen(os.dup(saved_fds[1]), "w", buffering=1, encoding="utf-8")
    log = path.open("w", buffering=1, encoding="utf-8")
    os.dup2(log.fileno(), 1)
    os.dup2(log.fileno(), 2)
    out = _Router(terminal_err if stdout_is_data else terminal_out, log)
    err = _Router(terminal_err, log)
    sys.stdout, sys.stderr, sys.unraisablehook = out, err, _unraisable_to(log)
    try:
        yield terminal_out
    finally:
        gc.collect()  # framework objects in cycles, finalized while their modules are alive
        out.flush()
        err.flush()
        sys.stdout, sys.stderr = saved
        out.terminal, err.terminal = saved[0], saved[1]
        os.dup2(saved_fds[0], 1)
        os.dup2(saved_fds[1], 2)
        for fd in saved_fds:
            os.close(fd)
        terminal_out.close()
        terminal_err.close()
