"""First-host plan cost with every host idle and with every host loaded.

    python benchmarks/plan_under_load.py

The driver's real ``Host`` / ``Metadata`` / ``TokenMap`` for 3 nodes in one DC (NTS RF 3),
100,000 distinct routing keys drawn in turn (so the 4,096-entry replica cache misses, as in
``benchmarks/e2e_overhead.py``), ``SimpleStatement`` s with their routing keys. Each plan is
made and asked for its first host only, which is what the driver usually takes. Timed, in
interleaved rounds (7) with the cyclic GC off: stock ``TokenAwarePolicy(DCAware)``;
adaptive-lb wrapping it with every host idle; and with every host at ``--in-flight``
requests in flight (11 by default: the best replica's score ``in_flight + 1`` reaches
``non_replica_penalty``, 12, so a non-replica could beat it -- the load the end-to-end
benchmark runs at). Prints one JSON line: medians over the rounds, in microseconds per plan.
"""

from __future__ import annotations

import argparse
import gc
import json
import logging
import statistics
import sys
import time

import figures
from cassandra.policies import DCAwareRoundRobinPolicy, TokenAwarePolicy
from cassandra.query import SimpleStatement

from adaptive_lb import AdaptiveLoadBalancingPolicy
from adaptive_lb.tools.cli_format import HelpFormatter
from adaptive_lb.tools.sim.driver_topology import build_cluster, murmur3_routing_keys


def first_hosts(policy, statements) -> float:
    """Seconds per plan to take the first host of each statement's plan."""
    gc.collect()
    gc.disable()
    try:
        start = time.perf_counter()
        for statement in statements:
            next(iter(policy.make_query_plan("ks", statement)))
        return (time.perf_counter() - start) / len(statements)
    finally:
        gc.enable()


def main(argv: list[str] | None = None) -> int:
    """Measure and print JSON."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=HelpFormatter)
    parser.add_argument("--in-flight", type=int, default=11, help="requests per loaded host")
    parser.add_argument("--rounds", type=int, default=7, help="interleaved rounds")
    figures.add_record_option(parser)
    args = parser.parse_args(argv)
    logging.getLogger("adaptive_lb").setLevel(logging.ERROR)  # no tracking here: no warning
    model = build_cluster({"dc1": [1, 1, 1]}, real_cluster=False)
    hosts = list(model.metadata.all_hosts())
    stock = TokenAwarePolicy(DCAwareRoundRobinPolicy("dc1"))
    stock.populate(model.cluster, hosts)
    adaptive = AdaptiveLoadBalancingPolicy(TokenAwarePolicy(DCAwareRoundRobinPolicy("dc1")))
    adaptive.populate(model.cluster, hosts)
    statements = [
        SimpleStatement("SELECT v FROM ks.t WHERE k = %s", keyspace="ks", routing_key=key)
        for key in murmur3_routing_keys(100_000, seed=1)
    ]

    def load(in_flight: int) -> None:
        for host in hosts:
            adaptive.stats.get(host).in_flight = in_flight

    timings: dict[str, list[float]] = {"stock": [], "adaptive_idle": [], "adaptive_loaded": []}
    for _ in range(args.rounds):
        timings["stock"].append(first_hosts(stock, statements))
        load(0)
        timings["adaptive_idle"].append(first_hosts(adaptive, statements))
        load(args.in_flight)
        timings["adaptive_loaded"].append(first_hosts(adaptive, statements))
    load(0)
    result = {f"{name}_us": round(statistics.median(v) * 1e6, 3) for name, v in timings.items()}
    result["in_flight"] = args.in_flight
    print(json.dumps(result))
    figures.record_run("plan_under_load", args.record, result, argv)
    return 0


if __name__ == "__main__":
    sys.exit(main())
