"""Configuration and process lifecycle: every adapter and plugin sees these."""

from __future__ import annotations

from collections.abc import Sequence

from rlweave.config import RlweaveConfig
from rlweave.hookspecs import hookspec
from rlweave.types import FrameworkInfo, SettingRequirement


@hookspec(historic=True)
def rlweave_configure(config: RlweaveConfig) -> None:
    """Receive the validated ``rlweave`` config section once per process.

    Called by the host when it is activated (from verl's config, from ``RLWEAVE__*`` environment
    variables, or programmatically). Historic: a plugin registered later still receives it.
    """


@hookspec
def rlweave_framework_loaded(framework: FrameworkInfo) -> None:
    """An adapter found its framework in this process and checked its version.

    Called once per process and framework by the adapter that the framework's own plugin
    mechanism loaded (``verl.plugins``, ``vllm.general_plugins``, ``sglang.srt.plugins``) or,
    for Megatron, by rlweave's spec provider.
    """


@hookspec
def rlweave_framework_requirements(framework: str) -> Sequence[SettingRequirement]:
    """Settings of ``framework`` (``"verl"``) that this plugin needs, e.g. a trainer mode or an
    engine scheduling policy.

    Called by the framework's adapter in every process it loads in: in the process whose
    command line configured rlweave it checks them against that command line before anything
    starts (:func:`rlweave.requirements.check_requirements`), and everywhere it sets up what
    they name (verl: registers rlweave's trainer modes). Return ``[]`` for a framework the
    plugin has no requirement of.
    """
