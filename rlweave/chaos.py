"""The fault schedule of rlweave's chaos tool, as a user writes it.

One fault is ``ACTION:WORKER@STEP[.SECTION][+DELAY][xFACTOR]``; several are separated by
``;`` (quote the value on a Hydra command line):

- ``kill:trainer:1@3.update_actor+0.5``: SIGKILL trainer rank 1 half a second into step 3's
  ``update_actor``;
- ``stop:trainer:0@4.update_actor``: SIGSTOP it there (a hang);
- ``kill:rollout:0.engine@2.generate+1``: kill rollout replica 0's engine process one second
  into step 2's generation (``rollout:0`` alone is the replica's server process);
- ``slow:trainer:1@2x3``: from step 2 on, rank 1's sections take three times as long;
- ``corrupt:checkpoint@4``: once step 4's checkpoint is persisted, corrupt it.

Framework-free: the config validates with it, the verl adapter injects what it parses, and
``rlweave chaos`` uses it on a running job.
"""

from __future__ import annotations

import re

from rlweave.types import FaultSpec

ACTIONS = ("kill", "stop", "slow", "corrupt")
_FAULT = re.compile(
    r"^(?P<action>[a-z]+):(?P<role>[a-z_]+)(?::(?P<rank>\d+))?(?:\.(?P<part>engine))?"
    r"@(?P<step>\d+)(?:\.(?P<section>[a-z_]+))?(?:\+(?P<delay>\d+(?:\.\d*)?))?(?:x(?P<factor>\d+(?:\.\d*)?))?$")
FORMAT = "ACTION:ROLE[:RANK][.engine]@STEP[.SECTION][+DELAY_S][xFACTOR], several separated by ';'"


def parse_fault(text: str) -> FaultSpec:
    """One fault; ``ValueError`` naming the format when it does not parse."""
    m = _FAULT.match(text.strip())
    if not m or m["action"] not in ACTIONS:
        raise ValueError(f"cannot read the fault {text!r}: expected {FORMAT}, ACTION one of "
                         f"{', '.join(ACTIONS)} (e.g. kill:trainer:1@3.update_actor+0.5)")
    action = m["action"]
    if action == "corrupt":
        if m["role"] != "checkpoint":
            raise ValueError(f"corrupt takes 'checkpoint' (corrupt:checkpoint@STEP), not {text!r}")
        return FaultSpec("corrupt", "checkpoint", int(m["step"]))
    if m["rank"] is None:
        raise ValueError(f"the fault {text!r} names no rank: write ROLE:RANK, e.g. trainer:1")
    if action == "slow" and not m["factor"]:
        raise ValueError(f"slow needs a factor (xFACTOR, e.g. slow:trainer:1@2x3), in {text!r}")
    worker = f"{m['role']}:{m['rank']}" + ("/engine" if m["part"] else "")
    return FaultSpec(action, worker, int(m["step"]), m["section"] or "", float(m["delay"] or 0.0),
                     float(m["factor"] or 1.0))


def parse_faults(text: str) -> tuple[FaultSpec, ...]:
    return tuple(parse_fault(part) for part in text.split(";") if part.strip())


def format_fault(fault: FaultSpec) -> str:
    role, _, rest = fault.worker.partition(":")
    rank, _, part = rest.partition("/")
    out = f"{fault.action}:{role}" + (f":{rank}" if rank else "") + (f".{part}" if part else "")
    out += f"@{fault.step}" + (f".{fault.section}" if fault.section else "")
    out += f"+{fault.delay_s:g}" if fault.delay_s else ""
    return out + (f"x{fault.factor:g}" if fault.action == "slow" else "")
