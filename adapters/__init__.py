"""Adapters: the only code that imports a framework. Each translates framework events into hook
calls and applies the plugins' decisions. Frameworks are imported lazily, inside functions, so
importing an adapter never imports its framework."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager


@contextmanager
def refusals_exit() -> Iterator[None]:
    """Around a framework's call into an adapter: rlweave's own refusals (a bad flag, a version
    outside the range, a patch that does not fit) leave as ``SystemExit`` with rlweave's one
    message. Frameworks log a plugin's exception with its traceback and go on without it (verl,
    SGLang) or show it inside their own traceback (vLLM); ``SystemExit`` is no ``Exception``, so
    it passes their handlers and stops the process with the message alone."""
    from rlweave.config import ConfigError
    from rlweave.frameworks import UnsupportedFrameworkError
    from rlweave.patches import PatchVersionError

    try:
        yield
    except (ConfigError, UnsupportedFrameworkError, PatchVersionError) as error:
        raise SystemExit(f"rlweave: {error}") from None
