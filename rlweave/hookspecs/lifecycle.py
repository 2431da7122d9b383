"""Configuration and process lifecycle: every adapter and plugin sees these."""

from __future__ import annotations

from collections.abc import Sequence

from rlweave.config import RlweaveConfig
from rlweave.hookspecs import hookspec
from rlweave.types import FrameworkInfo, PluginNeed


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
def rlweave_needs() -> Sequence[PluginNeed]:
    """What this plugin needs of the framework that runs it (:class:`~rlweave.types.Need`), e.g. a
    streaming trainer or engine priorities.

    Called by each framework's adapter in every process it loads in: it maps the needs onto its
    framework's settings (verl: :func:`rlweave.adapters.verl_needs.verl_requirements`), checks
    them against the command line that configured rlweave before anything starts
    (:func:`rlweave.requirements.check_requirements`), and sets up what they name (verl:
    registers rlweave's trainer modes). ``rlweave doctor`` reads them the same way.
    """
