"""verl builds rlweave's request load balancer when a plugin places trajectories.

verl chooses its load balancer in ``verl.workers.rollout.router.get_router_handle``: a YAML
plugin from ``rollout.router_config_path``, else a class its trainer injects, else its own
sticky least-in-flight balancer. A flag-only opt-in (``+rlweave.agentic_rollout.enable=true``)
needs a default to change without a YAML file; the wrapper passes
:class:`rlweave.adapters.verl.router.RlweaveLoadBalancer` as the class when a plugin implements
``rlweave_choose_instance`` and neither of verl's two choices was made. An explicit choice wins.
"""

from __future__ import annotations

from typing import Any

from rlweave.patches import Revert


def apply() -> Revert:
    import verl.workers.rollout.router as router

    original = router.get_router_handle

    def get_router_handle(servers: dict[str, Any], router_config_path: str | None = None,
                          full_determinism: bool = False,
                          load_balancer_cls: type | None = None) -> Any:
        from rlweave.host import get_host

        if not router_config_path and load_balancer_cls is None \
                and get_host().implements("rlweave_choose_instance"):
            from rlweave.adapters.verl.router import RlweaveLoadBalancer

            load_balancer_cls = RlweaveLoadBalancer
        return original(servers, router_config_path=router_config_path,
                        full_determinism=full_determinism, load_balancer_cls=load_balancer_cls)

    router.get_router_handle = get_router_handle

    def revert() -> None:
        router.get_router_handle = original

    return revert
