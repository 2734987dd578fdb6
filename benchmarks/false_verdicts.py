"""False verdicts on equal nodes: how often a healthy node is judged otherwise (issue 32).

    python benchmarks/false_verdicts.py                      # 6 runs x 30 s, ~4 min
    python benchmarks/false_verdicts.py --seconds 10 --runs quiet-200,hog-closed
    python benchmarks/false_verdicts.py --runs stops-all --record stops

Starts Simulacron (3 equal nodes in one DC, keyspace ``ks`` RF 2, the prepared query
answering at once; killed by PID when done) and runs, one after the other, the six runs of
the issue's table: three clients -- 10 requests a second one at a time (``thin``), 200 a
second with at most 4 in flight (``200``), a closed loop of 32 in flight (``closed``,
CPU-bound) -- each on a quiet machine (``quiet-*``) and beside two processes spinning on
the client's two cores (``hog-*``). On request (``--runs stops-all``, not in the default six):
the three at once with the client not reading answers for 3 s every 7 s, by turns holding
the GIL and keeping the driver's event loop
(:func:`~adaptive_lb.tools.peers.equal_nodes.stop_reading`). Each load is one session of
the real driver with
``attach(session)`` and the shipped defaults around
``TokenAwarePolicy(DCAwareRoundRobinPolicy("dc1"))``. It prints every transition out of
``healthy`` (each is a false verdict: nothing differs between the nodes) and the count per
run; ``--json FILE`` writes them, ``--record`` the counts to docs/figures.json
(``false_verdicts/<driver>``).
"""

from __future__ import annotations

import argparse
import itertools
import json
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import _e2e
import figures
from cassandra.policies import DCAwareRoundRobinPolicy, TokenAwarePolicy

from adaptive_lb import AdaptiveLoadBalancingPolicy
from adaptive_lb.tools.peers.equal_nodes import Load, cpu_hog, run_loads, stop_reading

LOADS = {
    "thin": Load("thin", in_flight=1, rate=10.0),
    "200": Load("200", in_flight=4, rate=200.0),
    "closed": Load("closed", in_flight=32),
}
RUNS = [f"{machine}-{load}" for machine in ("quiet", "hog") for load in LOADS]
STOPS = "stops-all"
STOP_S = 3
"""In ``stops-all``, the client stops reading answers for this many seconds..."""
STOP_EVERY_S = 7.0
"""...every this many seconds."""


def stopping(seconds: float) -> Callable[[list[tuple[Any, Any]]], None]:
    """What runs beside ``stops-all``'s loads: by turns the GIL held and the loop kept."""

    def stop(sessions: list[tuple[Any, Any]]) -> None:
        end = time.monotonic() + seconds
        for turn in itertools.count():
            if time.monotonic() + STOP_EVERY_S > end:
                return
            time.sleep(STOP_EVERY_S - STOP_S)
            stop_reading("gil" if turn % 2 == 0 else "loop", sessions, STOP_S)

    return stop


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=30.0, help="per run (30)")
    parser.add_argument(
        "--runs", default=",".join(RUNS), help=f"comma-separated ({[*RUNS, STOPS]})"
    )
    parser.add_argument("--json", type=Path, help="write the results here")
    figures.add_record_option(parser)
    args = parser.parse_args()
    runs = args.runs.split(",")
    unknown = [run for run in runs if run not in (*RUNS, STOPS)]
    if unknown:
        parser.error(f"unknown runs {unknown}; known: {[*RUNS, STOPS]}")
    sim = _e2e.Sim()
    results = {}
    try:
        sim.start()
        nodes = sim.setup_cluster()
        for run in runs:
            machine, load = run.split("-", 1)

            def policy() -> AdaptiveLoadBalancingPolicy:
                return AdaptiveLoadBalancingPolicy(
                    TokenAwarePolicy(DCAwareRoundRobinPolicy(local_dc=_e2e.DC))
                )

            loads = list(LOADS.values()) if load == "all" else [LOADS[load]]
            meanwhile = stopping(args.seconds) if machine == "stops" else None
            with cpu_hog(2 if machine == "hog" else 0):
                seen = run_loads(
                    nodes[:1], policy, _e2e.QUERY, loads, args.seconds, meanwhile=meanwhile
                )
            results[run] = {
                "answered": sum(seen.answered.values()),
                "failed": sum(seen.failed.values()),
                "false_verdicts": len(seen.departures),
                "lines": seen.departures,
            }
            print(
                f"{run:14} {results[run]['answered']:7d} answered, "
                f"{results[run]['failed']} failed, "
                f"{len(seen.departures)} false verdicts",
                flush=True,
            )
            for line in seen.departures:
                print(f"    {line}", flush=True)
    finally:
        sim.stop()
    total = sum(result["false_verdicts"] for result in results.values())
    print(f"total: {total} false verdicts in {len(results)} runs of {args.seconds:g} s")
    if args.json:
        args.json.write_text(json.dumps(results, indent=2) + "\n", encoding="utf-8")
    counts = {run: result["false_verdicts"] for run, result in results.items()}
    figures.record_run("false_verdicts", args.record, {**counts, "total": total}, None)
    return 0


if __name__ == "__main__":
    sys.exit(main())
