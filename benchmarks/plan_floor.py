"""How cheap can a pure-Python token-aware plan be? The floor under the plan-throughput targets.

    python benchmarks/plan_floor.py

Times, in the same interleaved rounds as ``adaptive-lb bench`` (45 nodes, 100,000 keys):

* stock ``TokenAwarePolicy(DCAwareRoundRobinPolicy)`` (the targets' reference),
* ``AdaptiveLoadBalancingPolicy`` wrapping it,
* ``floor``: not a policy but the least work any Python plan that routes by token must do
  per statement: a generator that reads the routing key, hashes it (the driver's C
  Murmur3), bisects a list of ints and yields the first local replica from a table built
  in advance. No cache, no scoring, no load, no health, no fallback, no rest of the plan.

and prints the first-host cost of each in microseconds, with the budget a 3x target leaves.
"""

from __future__ import annotations

import argparse
import sys
from bisect import bisect_left
from collections.abc import Iterator
from typing import Any

from cassandra.policies import DCAwareRoundRobinPolicy, TokenAwarePolicy

from adaptive_lb import AdaptiveLoadBalancingPolicy
from adaptive_lb.plan._driver_policies import token_value_function
from adaptive_lb.tools.bench import cluster_45, driver_name, measure_paired, routed_statements
from adaptive_lb.tools.cli_format import HelpFormatter


class FloorPlan:
    """The first local replica of the routing key, nothing else (see the module docstring)."""

    def __init__(self, metadata: Any, keyspace: str, local_dc: str) -> None:
        token_map = metadata.token_map
        replica_map = token_map.tokens_to_hosts_by_ks[keyspace]
        self._hash = token_value_function(token_map)
        self._values = [token.value for token in token_map.ring]
        self._first_local = [
            next(host for host in replica_map[token] if host.datacenter == local_dc)
            for token in token_map.ring
        ]

    def make_query_plan(self, keyspace: str | None = None, query: Any = None) -> Iterator[Any]:
        """Yield the first local replica of ``query.routing_key``."""
        point = bisect_left(self._values, self._hash(query.routing_key))
        yield self._first_local[point if point < len(self._values) else 0]


def main(argv: list[str] | None = None) -> int:
    """Measure and print. (No options: ``--help`` describes the benchmark.)"""
    argparse.ArgumentParser(description=__doc__, formatter_class=HelpFormatter).parse_args(argv)
    statements = routed_statements(100_000)
    model = cluster_45()
    hosts = model.metadata.all_hosts()
    stock = TokenAwarePolicy(DCAwareRoundRobinPolicy("dc1"))
    stock.populate(model.cluster, hosts)
    adaptive = AdaptiveLoadBalancingPolicy(TokenAwarePolicy(DCAwareRoundRobinPolicy("dc1")))
    adaptive.populate(model.cluster, hosts)
    list(stock.make_query_plan("ks", statements[0]))  # the driver maps a keyspace lazily
    floor = FloorPlan(model.metadata, "ks", "dc1")
    policies = {"stock": stock, "adaptive": adaptive, "floor": floor}
    measured = measure_paired(policies, statements, count=20_000, repeats=7)
    model.shutdown()
    print(f"{driver_name()}, 45 nodes, first host only (median of 7 interleaved rounds):")
    for label, row in measured.items():
        print(f"  {label:9s} {1000 / row['first_kops']:.2f} us per plan")
    budget = 1000 / measured["stock"]["first_kops"] / 3
    print(f"  a 3x first-host target allows {budget:.2f} us per plan")
    return 0


if __name__ == "__main__":
    sys.exit(main())
