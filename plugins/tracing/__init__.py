"""Tracing: records every hook the adapters fire as spans and events (rlweave's own timeline).

Enable with ``+rlweave.tracing.enable=true`` (or ``RLWEAVE__TRACING__ENABLE=true``).
"""
