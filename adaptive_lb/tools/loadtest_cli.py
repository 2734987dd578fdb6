"""The options of ``adaptive-lb loadtest`` (:mod:`adaptive_lb.tools.loadtest` runs it): the
argparse subcommand and the exit status (1 if any request failed).

Imports the load test and the CLI's formatter only; the library never imports a tool.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

from adaptive_lb.tools import loadtest

__all__ = ["add_subcommand"]


def add_subcommand(subparsers: Any) -> None:
    """Register ``loadtest`` on an argparse subparsers object."""
    from adaptive_lb.tools.cli_format import HelpFormatter, doc_description

    parser = subparsers.add_parser(
        "loadtest",
        help="load through the stock policy and/or adaptive-lb, compared",
        description=doc_description(loadtest.__doc__),
        formatter_class=HelpFormatter,
    )
    parser.add_argument(
        "--contact-points",
        default="",
        metavar="HOSTS",
        help="comma-separated addresses of your cluster (default: none; give this or --simulated)",
    )
    parser.add_argument("--port", type=int, default=9042, help="CQL port")
    parser.add_argument("--local-dc", default="dc1", metavar="DC", help="the client's datacenter")
    parser.add_argument(
        "--query",
        help="a read with at most one ? (an int key) (default: with --simulated, "
        f"{loadtest.SIMULATED_QUERY}; else SELECT release_version FROM system.local)",
    )
    parser.add_argument(
        "--key-range", type=int, default=100_000, metavar="N", help="keys drawn from 0..N-1"
    )
    loop = parser.add_mutually_exclusive_group()
    loop.add_argument(
        "--rate",
        type=_positive(float),
        default=500.0,
        metavar="R",
        help="open loop: requests sent a second, whatever the answers do (the same load for "
        "each policy)",
    )
    loop.add_argument(
        "--closed",
        type=_positive(int),
        metavar="N",
        help="a closed loop of N requests in flight instead, as fast as they are answered "
        "(default: the open loop)",
    )
    parser.add_argument(
        "--duration", type=float, default=10.0, metavar="SECONDS", help="seconds per policy"
    )
    parser.add_argument(
        "--timeout", type=float, default=2.0, metavar="SECONDS", help="request timeout"
    )
    parser.add_argument(
        "--policy",
        choices=("stock", "adaptive"),
        default="adaptive",
        help="the policy run (without --compare)",
    )
    parser.add_argument(
        "--config", metavar="FILE", help="adaptive-lb YAML config (default: built-in defaults)"
    )
    parser.add_argument("--compare", action="store_true", help="stock, then adaptive")
    parser.add_argument(
        "--prometheus-port",
        type=int,
        metavar="PORT",
        help="serve adaptive-lb's metrics on 127.0.0.1:PORT (default: not served)",
    )
    parser.add_argument(
        "--otlp-endpoint",
        metavar="URL",
        help="send decision traces over OTLP/HTTP (default: none, nothing sent)",
    )
    parser.add_argument(
        "--simulated",
        action="store_true",
        help="start a Simulacron cluster (Java and Maven needed) and load it",
    )
    parser.add_argument(
        "--slow-node",
        type=int,
        choices=(1, 2, 3),
        metavar="{1,2,3}",
        help="with --simulated: the dc1 node slowed (default: none)",
    )
    parser.add_argument(
        "--delay",
        type=int,
        default=20,
        dest="delay_ms",
        metavar="MS",
        help="milliseconds added to the --slow-node's answers",
    )
    parser.add_argument("--seed", type=int, default=1, metavar="N", help="seed of the key draws")
    parser.add_argument(
        "--json",
        action="store_true",
        help="print the reports as JSON instead of tables (with each adaptive run's snapshot)",
    )
    parser.add_argument(
        "--snapshot",
        action="store_true",
        help="after the tables, print the adaptive policy's snapshot() as JSON "
        "(see docs/observability.md, The snapshot)",
    )
    parser.set_defaults(handler=_handle)


def _positive(kind: type) -> Any:
    """An argparse type: a number of ``kind`` above 0, else a clear error."""

    def parse(text: str) -> Any:
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
        if not value > 0:
            raise argparse.ArgumentTypeError(f"must be > 0, got {text}")
        return value

    return parse


def _handle(args: argparse.Namespace) -> int:
    options = loadtest.LoadtestOptions(
        contact_points=[c for c in args.contact_points.split(",") if c],
        port=args.port,
        local_dc=args.local_dc,
        query=args.query,
        key_range=args.key_range,
        rate=args.rate,
        closed=args.closed,
        duration=args.duration,
        timeout=args.timeout,
        policy=args.policy,
        config=args.config,
        compare=args.compare,
        prometheus_port=args.prometheus_port,
        otlp_endpoint=args.otlp_endpoint,
        simulated=args.simulated,
        slow_node=args.slow_node,
        delay_ms=args.delay_ms,
        seed=args.seed,
        json=args.json,
        snapshot=args.snapshot,
    )
    reports = loadtest.run_loadtest(options)
    failed = sum(sum(report.errors.values()) for report in reports)
    if failed:
        sys.stderr.write(f"adaptive-lb loadtest: {failed:,} requests failed\n")
    return 1 if failed else 0
