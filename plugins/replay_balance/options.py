"""The options of ``rlweave.replay_balance``, and what the host needs to know of the plugin: its section, its
options' type and the module of hooks it registers when the section is enabled."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from rlweave.plugin_api import ConfigError, PluginInfo, PluginSection


@dataclass
class ReplayBalanceConfig(PluginSection):
    """Routing-replay-guided expert reordering and in-node replication in Megatron MoE layers
    built through ``rlweave.adapters.megatron.layer_spec``.

    ``slots_per_rank``: expert weight slots per EP rank (its own experts plus spare slots for
    replicas); 0 means its own experts plus one spare. ``ranks_per_node``: EP ranks per node
    (micro-batch replicas stay inside a node; moves and step replicas may cross). ``threshold``:
    stop replicating once a micro-batch's max/mean rank load is at most this.
    """

    available: ClassVar[bool] = True
    paper: ClassVar[str] = "ReLibra"
    slots_per_rank: int = 0
    ranks_per_node: int = 8
    threshold: float = 1.02

    def finalize(self) -> None:
        if self.slots_per_rank < 0:
            raise ConfigError(f"rlweave.replay_balance.slots_per_rank={self.slots_per_rank} is negative; "
                              f"give the expert slots per rank, or 0 for its own experts plus one spare")
        if self.ranks_per_node < 1:
            raise ConfigError(f"rlweave.replay_balance.ranks_per_node={self.ranks_per_node} must be at "
                              f"least 1 (the EP ranks of one node, e.g. 8)")
        if self.threshold < 1.0:
            raise ConfigError(f"rlweave.replay_balance.threshold={self.threshold} is below 1.0, which no "
                              f"placement reaches (max/mean >= 1); use e.g. 1.02")


PLUGIN = PluginInfo("replay_balance", ReplayBalanceConfig, hooks="rlweave.plugins.replay_balance.plugin")
