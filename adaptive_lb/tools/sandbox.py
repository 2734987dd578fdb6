"""``adaptive-lb sandbox``: a local simulated cluster for the README's example, until Ctrl-C.

Starts Simulacron (fetched from Maven Central on first use, cached under
``~/.cache/adaptive-lb/simulacron``; needs Java 17 and Maven) with one datacenter ``dc1`` of
N nodes in racks ``r1``, ``r2``, ... on loopback, answering ``system.local`` and
``SELECT v FROM ks.t WHERE k = ?`` (keyspace ``ks``), one node optionally slower; prints the
contact point and a line of Python to paste; stops Simulacron by its PID on Ctrl-C (or
SIGTERM, or after ``--seconds``) and leaves no file in the current directory.

May import the peers (Simulacron) and the CLI's formatter, on first use; the library never
imports a tool.
"""

from __future__ import annotations

import argparse
import signal
import sys
import threading
from typing import Any, TextIO

__all__ = ["QUERY", "add_subcommand", "run_sandbox"]

QUERY = "SELECT v FROM ks.t WHERE k = ?"
"""The table query the sandbox answers (``v = 1`` for any integer ``k``)."""


def run_sandbox(
    nodes: int,
    slow_node: int | None = None,
    delay_ms: int = 20,
    seconds: float | None = None,
    out: TextIO | None = None,
    stop: threading.Event | None = None,
) -> int:
    """Run the sandbox until ``stop`` is set, SIGINT / SIGTERM, or ``seconds`` have passed."""
    from adaptive_lb.tools.peers.simulacron import Simulacron, ensure_simulacron_jar

    out = out if out is not None else sys.stdout
    stop = stop if stop is not None else threading.Event()
    out.write(f"starting Simulacron: dc1, {nodes} nodes (the first start fetches it)...\n")
    out.flush()
    sim = Simulacron(ensure_simulacron_jar(), fine_timer=True)
    sim.start()
    try:
        racks = [f"r{i + 1}" for i in range(nodes)]
        addresses = sim.create_cluster("sandbox", [racks])["dc1"]
        sim.prime_keyspace("ks", {"dc1": min(3, nodes)})
        rows, types, params = [{"v": 1}], {"v": "int"}, {"k": "int"}
        sim.prime(QUERY, rows, types, param_types=params)
        if slow_node is not None:
            address = addresses[slow_node - 1]
            delay = delay_ms if sim.fine_timer else max(100, delay_ms)
            scope = sim.scope_of(address)
            sim.prime(QUERY, rows, types, param_types=params, delay_ms=delay, scope=scope)
            out.write(f"slow node: {address} (+{delay} ms)\n")
        out.write(
            f"nodes: {', '.join(addresses)} (datacenter dc1, racks {', '.join(racks)})\n"
            f"contact point: {addresses[0]}, port 9042; local_dc: dc1\n"
            f'  Cluster(["{addresses[0]}"], protocol_version=4, ...)  # as in the README\n'
            f"  {QUERY}  (keyspace ks, any integer k)\n"
            "Ctrl-C stops it.\n"
        )
        out.flush()
        _wait(stop, seconds)
    finally:
        sim.stop()
        out.write("Simulacron stopped.\n")
        out.flush()
    return 0


def _wait(stop: threading.Event, seconds: float | None) -> None:
    """Block until ``stop``, SIGINT or SIGTERM (main thread only), or ``seconds``."""
    previous: dict[signal.Signals, Any] = {}
    if threading.current_thread() is threading.main_thread():
        for sig in (signal.SIGINT, signal.SIGTERM):
            previous[sig] = signal.signal(sig, lambda *_: stop.set())
    try:
        stop.wait(seconds)
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def add_subcommand(subparsers: Any) -> None:
    """Register ``sandbox`` on the top-level command line."""
    from adaptive_lb.tools.cli_format import HelpFormatter

    parser = subparsers.add_parser(
        "sandbox",
        help="a local simulated cluster (Simulacron) for trying adaptive-lb, until Ctrl-C",
        description=__doc__.split("\n\n")[1],
        formatter_class=HelpFormatter,
    )
    parser.add_argument("--nodes", type=int, default=3, metavar="N", help="nodes in dc1")
    parser.add_argument(
        "--slow-node", type=int, metavar="I", help="make node I (1-based) slower (default: none)"
    )
    parser.add_argument(
        "--delay", dest="delay_ms", type=int, default=20, metavar="MS", help="its extra latency"
    )
    parser.add_argument(
        "--seconds", type=float, metavar="S", help="stop after S seconds (default: on Ctrl-C)"
    )
    parser.set_defaults(handler=_handle)


def _handle(args: argparse.Namespace) -> int:
    if not 1 <= args.nodes <= 32:
        raise SystemExit("adaptive-lb sandbox: --nodes must be 1 to 32")
    if args.slow_node is not None and not 1 <= args.slow_node <= args.nodes:
        raise SystemExit(f"adaptive-lb sandbox: --slow-node must be 1 to {args.nodes}")
    return run_sandbox(args.nodes, args.slow_node, args.delay_ms, args.seconds)
