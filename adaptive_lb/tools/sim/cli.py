"""``adaptive-lb demo`` and ``adaptive-lb simulate SCENARIO.yaml``.

The lead's ``adaptive_lb/tools/cli.py`` calls :func:`add_subcommands` on its argparse
subparsers; each command's handler (``args.handler(args)``) returns an exit code::

    adaptive-lb demo                       # the default scenario set, tables + PNGs
    adaptive-lb demo --scenario overload --requests 10000 --json
    adaptive-lb simulate gc-pause --seed 7 --out /tmp/gc   # a stock scenario, or a file

Every (scenario, policy) pair runs on a worker process (``--jobs``, default one per CPU).
Same ``--seed`` -> identical numbers (and byte-identical ``--json``).

May import the simulator, the config and the CLI's formatter; the library never imports a
tool.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any

import attrs

from adaptive_lb.config import ConfigError
from adaptive_lb.tools.cli_format import HelpFormatter, format_written
from adaptive_lb.tools.sim.progress import ProgressBar
from adaptive_lb.tools.sim.report import (
    ScenarioReport,
    check_targets,
    format_markdown,
    format_table,
    format_tally,
    to_json,
    write_plots,
    write_sweep,
)
from adaptive_lb.tools.sim.runner import run_many
from adaptive_lb.tools.sim.scenario import POLICY_NAMES, Scenario, load_scenario, scenario_dir
from adaptive_lb.tools.sim.tracing import TraceSpec

__all__ = [
    "DEMO_SCENARIOS",
    "FLEET_SCENARIOS",
    "LARGE_FLEETS",
    "add_subcommands",
    "main",
    "run_demo",
    "run_simulate",
    "write_results",
]

DEMO_SCENARIOS = (
    "local-one",
    "local-quorum",
    "slow-coordinator",
    "gc-pause",
    "node-restart",
    "overload",
    "one-loaded-node",
    "fast-failing-node",
    "hot-partition",
    "local-one-auto",
    "far-racks",
    "thin-slow",
    "thin-slightly-slow",
    "thin-barely-slow",
    "thin-equal",
    "thin-many-clients",
    "thin-stall",
    "thin-stall-1rps",
    "busy-node",
    "busy-node-no-pools",
    "busy-node-moderate",
    "noisy-client",
    "noisy-client-thin",
)
"""The scenarios ``adaptive-lb demo`` runs, from ``adaptive_lb/tools/sim/scenarios/<name>.yaml``."""
FLEET_SCENARIOS = (
    "fleet-healthy",
    "fleet-half-capacity",
    "fleet-stall",
    "fleet-rolling-restart",
    "fleet-surge",
    "fleet-size-10",
    "fleet-size-100",
    "fleet-size-1000",
)
"""Issue 34's fleets (hundreds of clients, each with its own policy objects): opt-in
(``adaptive-lb demo --fleet``, or ``--scenario NAME``), for they take minutes."""
LARGE_FLEETS = ("fleet-500x30",)
"""Fleets too large for ``--fleet`` (8 minutes of their own): ``--scenario NAME`` only."""


def _common(parser: argparse.ArgumentParser, default_out: str) -> None:
    parser.add_argument(
        "--seed",
        type=int,
        default=None,
        metavar="N",
        help="seed for every scenario (default: each scenario's own)",
    )
    parser.add_argument(
        "--requests",
        type=int,
        default=None,
        metavar="N",
        help="measured requests per policy (default: each scenario's own)",
    )
    parser.add_argument(
        "--json", action="store_true", help="print JSON to stdout instead of tables"
    )
    parser.add_argument(
        "--out",
        default=default_out,
        metavar="DIR",
        help="folder for results.json, results.md and the PNG plots; created if missing, "
        "files in it overwritten",
    )
    parser.add_argument("--no-plots", action="store_true", help="skip the PNG plots")
    parser.add_argument(
        "--jobs",
        type=int,
        default=None,
        metavar="N",
        help="worker processes (default: one per CPU)",
    )
    parser.add_argument(
        "--quiet", action="store_true", help="no progress lines on stderr (runs, then plots)"
    )
    parser.add_argument(
        "--otlp-endpoint",
        default=None,
        metavar="URL",
        help="send sampled request spans with adaptive-lb's decisions over OTLP, e.g. to "
        "Jaeger at http://127.0.0.1:4318 (virtual time mapped to real time) "
        "(default: none, nothing sent)",
    )
    parser.add_argument(
        "--otlp-protocol",
        choices=("http", "grpc"),
        default="http",
        help="OTLP transport of --otlp-endpoint",
    )
    parser.add_argument(
        "--trace-requests",
        type=int,
        default=100,
        metavar="N",
        help="with --otlp-endpoint: requests traced per scenario and policy",
    )


def add_subcommands(subparsers: Any) -> None:
    """Register ``demo`` and ``simulate`` on an argparse subparsers object."""
    demo = subparsers.add_parser(
        "demo",
        help="simulate the default scenario set under every policy and compare",
        description=(
            "Run the discrete-event cluster simulator (real driver policy objects on a "
            "virtual clock) over the default scenarios and print one table per scenario; "
            "write results.json, results.md and two PNG plots per scenario to --out, then "
            "list the files written."
        ),
        formatter_class=HelpFormatter,
    )
    _common(demo, "adaptive-lb-demo")
    demo.add_argument(
        "--scenario",
        action="append",
        choices=DEMO_SCENARIOS + FLEET_SCENARIOS + LARGE_FLEETS,
        metavar="NAME",
        help="run only this scenario, repeatable: "
        f"{', '.join(DEMO_SCENARIOS + FLEET_SCENARIOS + LARGE_FLEETS)} (default: the default set)",
    )
    demo.add_argument(
        "--fleet",
        action="store_true",
        help="run the fleet scenarios (issue 34: 10 to 1,000 clients, minutes of CPU): "
        f"{', '.join(FLEET_SCENARIOS)}; alone, or with --scenario after them",
    )
    demo.add_argument(
        "--scenarios-dir",
        default=None,
        metavar="DIR",
        help="where the scenario files are (default: the package's tools/sim/scenarios)",
    )
    demo.set_defaults(handler=run_demo)

    simulate = subparsers.add_parser(
        "simulate",
        help="simulate one scenario file under every policy and compare",
        description="Run one scenario (YAML, see adaptive_lb/tools/sim/scenarios/) and print its "
        "table; write results.json, results.md and its PNG plots to --out, then list the files "
        "written.",
        formatter_class=HelpFormatter,
    )
    simulate.add_argument(
        "scenario_file",
        metavar="SCENARIO",
        help="a scenario file, or the name of a stock one (e.g. gc-pause)",
    )
    _common(simulate, "adaptive-lb-simulate")
    simulate.add_argument(
        "--policy",
        action="append",
        choices=POLICY_NAMES,
        metavar="NAME",
        help=f"run only this policy, repeatable: {', '.join(POLICY_NAMES)} "
        "(default: the scenario's list)",
    )
    simulate.set_defaults(handler=run_simulate)


def run_demo(args: argparse.Namespace) -> int:
    """Handler of ``adaptive-lb demo``."""
    directory = Path(args.scenarios_dir) if args.scenarios_dir else scenario_dir()
    if directory is None:
        print(
            "adaptive-lb demo: no scenario folder found (the package's tools/sim/scenarios); "
            "pass --scenarios-dir",
            file=sys.stderr,
        )
        return 2
    names = list(args.scenario or ())
    if args.fleet:
        names = [*FLEET_SCENARIOS, *(n for n in names if n not in FLEET_SCENARIOS)]
    names = names or list(DEMO_SCENARIOS)
    scenarios = []
    try:
        for name in names:
            scenarios.append(load_scenario(directory / f"{name}.yaml"))
    except ConfigError as exc:
        print(f"adaptive-lb demo: {exc}", file=sys.stderr)
        return 2
    return _run(scenarios, args)


def run_simulate(args: argparse.Namespace) -> int:
    """Handler of ``adaptive-lb simulate``."""
    path = Path(args.scenario_file)
    directory = scenario_dir()
    if not path.exists() and path.suffix == "" and directory is not None:
        path = directory / f"{path.name}.yaml"  # a stock scenario by name: gc-pause
    try:
        scenario = load_scenario(path)
    except ConfigError as exc:
        print(f"adaptive-lb simulate: {exc}", file=sys.stderr)
        return 2
    if args.policy:
        scenario = attrs.evolve(scenario, policies=list(args.policy))
    return _run([scenario], args)


def _run(scenarios: list[Scenario], args: argparse.Namespace) -> int:
    if args.requests is not None and args.requests < 1:
        print("--requests must be >= 1", file=sys.stderr)
        return 2
    jobs = [(scenario, policy) for scenario in scenarios for policy in scenario.policies]
    bar = None if args.quiet else ProgressBar(len(jobs))

    def done(scenario: Scenario, policy: str, result: Any) -> None:
        if bar is not None:
            bar.step(f"{scenario.name}/{policy} ({result.wall_s:.1f}s)")

    trace = None
    if args.otlp_endpoint:
        if args.trace_requests < 1:
            print("--trace-requests must be >= 1", file=sys.stderr)
            return 2
        trace = TraceSpec(
            endpoint=args.otlp_endpoint,
            epoch_ns=time.time_ns(),
            requests=args.trace_requests,
            protocol=args.otlp_protocol,
        )
    results = run_many(
        jobs,
        seed=args.seed,
        requests=args.requests,
        workers=args.jobs,
        on_done=done,
        trace=trace,
    )
    reports = []
    index = 0
    for scenario in scenarios:
        count = len(scenario.policies)
        if args.requests is not None:
            scenario = attrs.evolve(scenario, requests=args.requests)
        seed = args.seed if args.seed is not None else scenario.seed
        reports.append(ScenarioReport(scenario, seed, results[index : index + count]))
        index += count

    plots = not args.no_plots
    written, notes = write_results(reports, Path(args.out), plots=plots, quiet=args.quiet)

    if args.json:
        sys.stdout.write(to_json(reports))
    else:
        for report in reports:
            print(format_table(report))
            for check in check_targets(report, reports):
                mark = "met   " if check.met else "MISSED"
                print(f"   target {mark} {check.target}: {check.detail}")
            print()
    for note in notes:
        print(note, file=sys.stderr)
    # Standard output is the JSON document alone with --json: the listing goes to stderr.
    print(format_written(written), file=sys.stderr if args.json else sys.stdout)
    # Last, where a reader looks: every missed target by name.
    print(format_tally(reports), file=sys.stderr if args.json else sys.stdout)
    return 0


def write_results(
    reports: list[ScenarioReport], out: Path, *, plots: bool = True, quiet: bool = False
) -> tuple[list[Path], list[str]]:
    """Write ``results.json``, ``results.md`` and (``plots``) each scenario's PNG plots to
    ``out``, created if missing; one progress line per scenario plotted on stderr unless
    ``quiet``. Returns the paths written (results.json, results.md, then the plots in
    scenario order) and the notes to show (e.g. matplotlib missing)."""
    out.mkdir(parents=True, exist_ok=True)
    results_json, results_md = out / "results.json", out / "results.md"
    results_json.write_text(to_json(reports), encoding="utf-8")
    markdown = []
    for report in reports:
        markdown.append(f"### {report.scenario.name} (seed {report.seed})\n")
        markdown.append(format_markdown(report) + "\n")
    results_md.write_text("\n".join(markdown), encoding="utf-8")
    written = [results_json, results_md]
    notes: list[str] = []
    if not plots:
        return written, notes
    bar = None if quiet else ProgressBar(len(reports), title="plots")
    for report in reports:
        made = write_plots(report, out)
        if isinstance(made, str):  # no matplotlib: the same note for every scenario
            if made not in notes:
                notes.append(made)
            label = f"{report.scenario.name}: skipped"
        else:
            written.extend(made)
            label = f"{report.scenario.name} ({len(made)} PNGs)"
        if bar is not None:
            bar.step(label)
    written.extend(write_sweep(reports, out))
    return written, notes


def main(argv: list[str] | None = None) -> int:
    """``python -m adaptive_lb.tools.sim demo|simulate ...`` (the same commands, standalone)."""
    parser = argparse.ArgumentParser(
        prog="python -m adaptive_lb.tools.sim",
        description="The simulator's commands, as 'adaptive-lb demo' and 'adaptive-lb simulate'.",
        formatter_class=HelpFormatter,
    )
    subparsers = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    add_subcommands(subparsers)
    args = parser.parse_args(argv)
    return args.handler(args)
