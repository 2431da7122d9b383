"""The ``rlweave`` command: ``doctor``, ``bench <name>``, ``plan <trace>``, ``plan stream``, ``fusion schedule``,
``demo``, ``models``, ``chaos``.

Commands that need a framework this interpreter lacks re-launch themselves in the environment
that has it (see :mod:`rlweave.environments`).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import sys
import traceback
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from rlweave.environments import ensure_modules
from rlweave.output import frameworks_log_to

# The runtime wheel ships without the benchmarks and without plotting; these come with the extra.
BENCH_EXTRA = "pip install 'rlweave[bench]'"
BENCH_MODULES = ("rlweave.benchmarks", "matplotlib")


def missing_bench_module() -> str | None:
    """The first module of the bench extra this interpreter lacks, or None when it has them."""
    for name in BENCH_MODULES:
        try:
            if importlib.util.find_spec(name) is None:
                return name
        except ModuleNotFoundError:  # a parent package is missing
            return name
    return None


def benchmarks() -> dict[str, Any]:
    """``rlweave bench``'s table; empty where the bench extra is not installed."""
    if missing_bench_module():
        return {}
    from rlweave.benchmarks import BENCHMARKS

    return BENCHMARKS



def console() -> Console:
    """Wide enough for rlweave's tables even when the output is piped (rich assumes 80)."""
    return Console(width=max(Console().width, 132))


def table_of(title: str, rows: list[list[str]]) -> Table:
    table = Table(title=title, title_justify="left")
    for header in rows[0]:
        table.add_column(header, overflow="fold")
    for row in rows[1:]:
        table.add_row(*row)
    return table


def cmd_doctor(args: argparse.Namespace) -> int:
    from rlweave.doctor import report

    tables = report(here_only=args.here)
    if args.json:  # {title: [{column: value}]}
        print(json.dumps({title: [dict(zip(rows[0], row)) for row in rows[1:]] for title, rows in tables}))
        return 0
    out = console()
    for title, rows in tables:
        out.print(table_of(title, rows))
    return 0


def cmd_bench(args: argparse.Namespace, argv: list[str]) -> int:
    bench = benchmarks()[args.name]
    ensure_modules(bench.needs, bench.env, argv)
    import random

    import numpy as np

    random.seed(args.seed)
    np.random.seed(args.seed)
    out_dir = Path(args.out)
    log = out_dir / f"{args.name}.log"
    with frameworks_log_to(log, stdout_is_data=args.json) as stdout:
        print(f"[rlweave] frameworks' logs: {log}", file=sys.stderr)
        try:
            result = bench.run(args)
        except Exception as error:  # one line here; the traceback goes to the log
            traceback.print_exc()
            print(f"rlweave bench {args.name} failed: {type(error).__name__}: {error} "
                  f"(traceback in {log})", file=sys.stderr)
            return 1
        png = bench.plot(result, out_dir / f"{args.name}.png")
        record = {"benchmark": args.name, "argv": argv, "regime": result.regime, "headline": result.headline,
                  "details": result.details, "png": str(png), "log": str(log)}
        (out_dir / f"{args.name}.json").write_text(json.dumps(record, indent=2))
        if args.json:
            print(json.dumps(result.headline), file=stdout)
        else:
            out = console()
            out.print(table_of(f"rlweave bench {args.name}", result.rows))
            out.print(f"regime: {result.regime}")
            out.print(f"wrote {out_dir / (args.name + '.json')} and {png}")
    return 0


def cmd_demo(args: argparse.Namespace, argv: list[str]) -> int:
    ensure_modules(("verl", "vllm"), ".venv-verl", argv)
    from rlweave.benchmarks.demo import run_demo

    out = Path(args.out)
    with frameworks_log_to(out / "demo.log"):
        ui = console()
        ui.print(f"frameworks' logs: {out / 'demo.log'}")
        return run_demo(ui, out)


def cmd_fusion(args: argparse.Namespace) -> int:
    from rlweave.plugins.stage_fusion.command import run
    from rlweave.plugins.stage_fusion.problem import ProblemError

    try:
        return run(args)
    except ProblemError as error:
        print(f"rlweave fusion schedule: {error}", file=sys.stderr)
        return 2


def cmd_plan(args: argparse.Namespace) -> int:
    from rlweave.plugins.stream_generation.plan_command import run
    from rlweave.plugins.stream_generation.planner import PlanError

    try:
        result = run(args)
    except PlanError as error:
        print(f"rlweave plan stream: {error}", file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps({k: v for k, v in result.items() if k != "describe"}))
    else:
        print(result["describe"])
        print("(predicted by the planner's model from the measured profiles: a planning figure, not a measurement)")
    return 0


def cmd_trace(args: argparse.Namespace) -> int:
    from rlweave.tracing import export

    try:
        chrome, png, lanes = export(Path(args.dir), Path(args.out or args.dir))
    except FileNotFoundError as error:
        print(f"rlweave trace: {error}", file=sys.stderr)
        return 2
    except ModuleNotFoundError as error:  # trace.json is written before the PNG is drawn
        if error.name != "matplotlib":
            raise
        print(f"rlweave trace: wrote {Path(args.out or args.dir) / 'trace.json'}; the timeline PNG needs "
              f"matplotlib, which comes with the bench extra: {BENCH_EXTRA}", file=sys.stderr)
        return 2
    out = console()
    out.print(table_of("busy share per worker (start-up cut)", [["worker", "busy", "busy s"]] + [
        [lane.worker, f"{lane.busy_fraction:.0%}", f"{lane.busy_s:.2f}"] for lane in lanes]))
    out.print(f"wrote {chrome} (open in ui.perfetto.dev) and {png}")
    return 0


def cmd_models(args: argparse.Namespace) -> int:
    from rlweave.tiny_models import MODEL_NAMES, ensure_tiny_model

    for name in args.names or MODEL_NAMES:
        print(ensure_tiny_model(name))
    return 0


def cmd_chaos(args: argparse.Namespace, argv: list[str]) -> int:
    """Faults into a verl job (resilience): see :mod:`rlweave.adapters.verl.chaos`."""
    ensure_modules(("ray", "psutil"), ".venv-verl", argv)
    from rlweave.adapters.verl import chaos
    from rlweave.chaos import parse_faults

    if args.action == "inject":
        try:
            faults = parse_faults(args.faults)
        except ValueError as error:
            raise SystemExit(f"rlweave chaos: {error}") from None
        chaos.inject(faults, args.address)
        print(f"handed {len(faults)} fault(s) to the job's resilience monitor")
    elif args.action in ("kill", "stop", "cont"):
        pids = chaos.signal_now(args.worker, args.action, args.job)
        if not pids:
            where = f"under process {args.job}" if args.job else "on this machine"
            raise SystemExit(f"rlweave chaos: no process of {args.worker} {where}")
        print(f"{args.action} {args.worker}: pid {', '.join(map(str, pids))}")
    elif args.action == "corrupt":
        print(chaos.corrupt_newest(args.folder, args.how, args.step))
    else:
        print(json.dumps(chaos.status(args.address), indent=1, default=str))
    return 0


def add_chaos_parser(sub: argparse._SubParsersAction) -> None:
    chaos = sub.add_parser("chaos", help="inject faults into a verl job (kill, hang, slow, corrupt a checkpoint)")
    actions = chaos.add_subparsers(dest="action", required=True)
    inject = actions.add_parser("inject", help="faults for the resilience monitor of a running job started with "
                                               "the chaos plugin (RLWEAVE_PLUGIN_MODULES=rlweave.benchmarks.resilience_chaos) "
                                               "to fire at a step, e.g. "
                                               "'kill:trainer:1@3.update_actor+0.5;slow:trainer:0@2x3'")
    inject.add_argument("faults")
    for name, what in (("kill", "SIGKILL"), ("stop", "SIGSTOP (a hang)"), ("cont", "SIGCONT")):
        now = actions.add_parser(name, help=f"{what} a worker's process now (trainer:R, rollout:R, rollout:R.engine)")
        now.add_argument("worker", type=lambda w: w.replace(".engine", "/engine"))
        now.add_argument("--job", type=int, default=None,
                         help="the pid of the job's driver (verl's main_ppo), where several jobs run here")
    corrupt = actions.add_parser("corrupt", help="corrupt the newest persisted checkpoint of a verl checkpoint folder")
    corrupt.add_argument("folder", help="verl's trainer.default_local_dir")
    corrupt.add_argument("--how", choices=("flip", "truncate", "delete"), default="flip")
    corrupt.add_argument("--step", type=int, default=None)
    actions.add_parser("status", help="what the resilience monitor of a running job started with "
                                      "the chaos plugin sees")
    for p in (inject, actions.choices["status"]):
        p.add_argument("--address", default="auto", help="the job's Ray cluster (default: this machine's)")


def add_bench_parser(sub: argparse._SubParsersAction) -> None:
    """One subcommand per benchmark; without the bench extra, a bare ``bench`` that
    :func:`main` answers with the fix."""
    table = benchmarks()
    bench = sub.add_parser("bench", help="run one benchmark side by side with the framework default"
                           + ("" if table else f" (needs the bench extra: {BENCH_EXTRA})"))
    if not table:
        bench.add_argument("rest", nargs=argparse.REMAINDER)
        return
    bench_sub = bench.add_subparsers(dest="name", required=True)
    for b in table.values():
        p = bench_sub.add_parser(b.name, help=b.summary)
        p.add_argument("--json", action="store_true", help="print one JSON object on stdout")
        p.add_argument("--seed", type=int, default=0)
        p.add_argument("--out", default="bench-results", help="folder for the JSON and PNG")
        b.add_arguments(p)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="rlweave", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    doctor = sub.add_parser("doctor", help="frameworks, versions, entry points, which plugins work, patches")
    doctor.add_argument("--here", action="store_true",
                        help="this interpreter only, not every environment of the CPU rig")
    doctor.add_argument("--json", action="store_true", help="print the tables as one JSON object")
    add_bench_parser(sub)
    plan = sub.add_parser("plan", help="plan resources from measured profiles (simulated)",
                          description="rlweave plan TRACE --cluster FILE: a traced job's step on another "
                                      "cluster (docs/plan.md); rlweave plan stream: StreamRL's pools.")
    plan_sub = plan.add_subparsers(dest="planner", required=True)
    from rlweave.plugins.stream_generation import plan_command

    plan_command.add_arguments(plan_sub.add_parser(
        "stream", help="StreamRL: generation and training instances per pool, and the predicted step"))
    fusion = sub.add_parser("fusion", help="RLHFuse: search a fused actor-critic pipeline schedule")
    from rlweave.plugins.stage_fusion import command as fusion_command

    fusion_command.add_arguments(fusion.add_subparsers(dest="fusion", required=True).add_parser(
        "schedule", help="the fused schedule, its lower bound and the baselines (simulated)"))
    demo = sub.add_parser("demo", help="the end-to-end showcase on CPU")
    demo.add_argument("--out", default="bench-results/demo")
    trace = sub.add_parser("trace", help="a tracing plugin's folder as a Perfetto trace and a timeline PNG")
    trace.add_argument("dir", help="the folder rlweave.tracing.dir named")
    trace.add_argument("--out", help="where to write trace.json and timeline.png (default: the folder)")
    models = sub.add_parser("models", help="build the tiny random-weight models (cached)")
    models.add_argument("names", nargs="*")
    add_chaos_parser(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["plan"] and argv[1:2] and argv[1] not in ("stream", "-h", "--help"):
        from rlweave.plan.command import main as plan_trace  # a trace, not a planner's name

        return plan_trace(argv[1:])
    args = build_parser().parse_args(argv)
    if args.command in ("bench", "demo") and (missing := missing_bench_module()):
        print(f"rlweave {args.command}: needs the bench extra ({missing} is not installed): {BENCH_EXTRA}",
              file=sys.stderr)
        return 2
    if args.command == "doctor":
        return cmd_doctor(args)
    if args.command == "bench":
        return cmd_bench(args, argv)
    if args.command == "demo":
        return cmd_demo(args, argv)
    if args.command == "plan":
        return cmd_plan(args)
    if args.command == "fusion":
        return cmd_fusion(args)
    if args.command == "chaos":
        return cmd_chaos(args, argv)
    if args.command == "trace":
        return cmd_trace(args)
    return cmd_models(args)


if __name__ == "__main__":
    sys.exit(main())
