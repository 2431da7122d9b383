"""The contract between adapters and plugins.

Adapters (the only code that imports a framework) call these hooks at framework moments;
plugins (pure algorithms) implement them and return decisions that the adapter applies. Data
flows one way: framework event -> adapter -> hook -> plugin decision -> adapter applies it.

Three shapes, as in pytest:
- ``firstresult`` hooks ask "who decides": the first plugin that returns something other than
  ``None`` wins; ``None`` from every plugin means "the framework's own behaviour".
- wrapper hooks surround a stage: rlweave's trylast default implementation runs the stage, and
  a plugin may wrap it (``@hookimpl(wrapper=True)``) to time, reorder or replace it.
- ``historic`` hooks carry configuration, so a plugin registered late still receives it.

Every argument is a neutral type from :mod:`rlweave.types` (dataclasses, numpy arrays, plain
Python values) so plugins never see a framework object. Always call hooks with keywords.
"""

from __future__ import annotations

import pluggy

PROJECT = "rlweave"
hookspec = pluggy.HookspecMarker(PROJECT)
hookimpl = pluggy.HookimplMarker(PROJECT)

# One spec module per surface; the host adds all of them.
SPEC_MODULES = (
    "rlweave.hookspecs.lifecycle",
    "rlweave.hookspecs.trainer",
    "rlweave.hookspecs.rollout",
    "rlweave.hookspecs.engine",
    "rlweave.hookspecs.moe",
    "rlweave.hookspecs.linear",
    "rlweave.hookspecs.resilience",
)
