"""Stand-ins for SGLang's GPU-only imports, which cannot load on this CPU-only machine; importing
this module installs them. Nothing the SGLang tests check calls them.

- ``torchvision``: its PyPI wheels for this torch are CUDA builds that cannot load on CPU torch.
  SGLang 0.5.23 imports it from its engine; 0.5.12 already from ``import sglang``
  (``sglang/srt/utils/common.py``).
- ``sgl_kernel`` (the ``sglang-kernel`` distribution, CUDA kernels): SGLang 0.5.12's engine
  imports it unguarded (``sglang/srt/mem_cache/memory_pool_host.py``); 0.5.23 does not.

The finder sits last on ``sys.meta_path``, so it answers only for modules that nothing installed
provides: where a version does not import one, it is never used.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import sys
from typing import Any
from unittest import mock

GPU_ONLY = ("torchvision", "sgl_kernel")


class _GpuOnlyStandIn(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def find_spec(self, name: str, path: Any, target: Any = None) -> importlib.machinery.ModuleSpec | None:
        if name.split(".")[0] not in GPU_ONLY:
            return None
        return importlib.machinery.ModuleSpec(name, self, is_package=True)

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> Any:
        return mock.MagicMock(name=spec.name, __path__=[], __spec__=spec, __version__="0.28.0")

    def exec_module(self, module: Any) -> None:
        pass


if not any(isinstance(f, _GpuOnlyStandIn) for f in sys.meta_path):
    sys.meta_path.append(_GpuOnlyStandIn())
