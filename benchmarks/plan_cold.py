"""The first-host plan with the CPU caches warm, and cold as they are inside a real client.

    python benchmarks/plan_cold.py

In a loop of plans (``plan_throughput.py``) the policy's code and data stay in the CPU's
caches. In a client they do not: between two plans the driver runs ~600,000 instructions of
its own (compiled code, its buffers, the event loop), and the next plan starts cold -- so it
costs several times its loop figure, and the difference from stock grows with everything the
plan touches. This times one plan, the way ``e2e_overhead.py`` sees it:

* the topology of ``e2e_overhead.py`` (3 nodes, one DC, RF 2, the driver's real objects) and
  its statement: a real ``BoundStatement`` of ``SELECT v FROM ks.t WHERE k = ?``, a new key
  each plan (100,000 in turn), bound before the timer starts (its routing key is computed
  by the plan, as in a client);
* stock ``TokenAwarePolicy(DCAwareRoundRobinPolicy)`` and adaptive-lb wrapping the same
  (tracking attached, hosts idle, warmed up past the replica cache's verdict);
* ``hot``: plans back to back; ``cold``: before each plan, ``--evict-kib`` KiB of other
  memory are written and scattered objects read, evicting the policy from the caches.

Each round times every (policy, mode) once, in turn; figures are medians over ``--rounds``,
in microseconds per plan, the timer's own cost taken off. The cyclic GC is off while timing.
"""

from __future__ import annotations

import argparse
import gc
import json
import random
import statistics
import sys
import time
from collections.abc import Callable
from typing import Any

from cassandra.cqltypes import Int32Type
from cassandra.policies import DCAwareRoundRobinPolicy, TokenAwarePolicy
from cassandra.protocol import ColumnMetadata
from cassandra.query import PreparedStatement

from adaptive_lb import AdaptiveLoadBalancingPolicy
from adaptive_lb.tools.bench import driver_name
from adaptive_lb.tools.cli_format import HelpFormatter
from adaptive_lb.tools.sim.driver_topology import build_cluster

KEYS = 100_000


def prepared() -> PreparedStatement:
    """The benchmark's statement as the driver builds it from a PREPARE response."""
    columns = [ColumnMetadata("ks", "t", "k", Int32Type)]
    query = "SELECT v FROM ks.t WHERE k = ?"
    return PreparedStatement(columns, b"id", [0], query, "ks", 4, [], None)


def policies() -> dict[str, Any]:
    """Stock and adaptive-lb on the e2e topology, populated, warmed up."""
    model = build_cluster({"dc1": [1, 1, 1]}, replication={"dc1": 2}, seed=1)
    stock = TokenAwarePolicy(DCAwareRoundRobinPolicy("dc1"))
    adaptive = AdaptiveLoadBalancingPolicy(TokenAwarePolicy(DCAwareRoundRobinPolicy("dc1")))
    adaptive.tracking_attached()
    statement = prepared()
    for policy in (stock, adaptive):
        policy.populate(model.cluster, model.metadata.all_hosts())
        for k in range(20_000):
            next(iter(policy.make_query_plan(None, statement.bind((k,)))))
    return {"stock": stock, "adaptive": adaptive, "timer": None}


class Evictor:
    """Writes every cache line of a buffer and reads scattered small objects."""

    def __init__(self, kib: int) -> None:
        self.buffer = bytearray(kib * 1024)
        self.ones = b"\x01" * (len(self.buffer) // 64)
        self.objects = [[i] for i in range(kib * 8)]
        random.Random(1).shuffle(self.objects)
        self.turn = 0

    def __call__(self) -> None:
        if not self.buffer:
            return
        self.buffer[::64] = self.ones
        self.turn = (self.turn + 1) % 8
        for item in self.objects[self.turn :: 64]:
            item[0]


def timed(policy: Any, plans: int, first_key: int, evict: Callable[[], None]) -> float:
    """Microseconds per first-host plan, ``evict()`` before each (not timed)."""
    statement = prepared()
    make = policy.make_query_plan if policy is not None else None
    clock = time.perf_counter_ns
    total = 0
    gc.disable()
    try:
        for i in range(plans):
            evict()
            bound = statement.bind(((first_key + i) % KEYS,))
            start = clock()
            if make is not None:
                next(iter(make(None, bound)))
            total += clock() - start
    finally:
        gc.enable()
    return total / plans / 1000


def measure(rounds: int, plans: int, evict_kib: int) -> dict[str, dict[str, float]]:
    """Median microseconds per plan of each policy, hot and cold, and adaptive - stock."""
    made = policies()
    modes = {"hot": Evictor(0), "cold": Evictor(evict_kib)}
    samples: dict[str, dict[str, list[float]]] = {m: {p: [] for p in made} for m in modes}
    key = 0
    for _ in range(rounds):
        for mode, evict in modes.items():
            for name, policy in made.items():
                samples[mode][name].append(timed(policy, plans, key, evict))
                key += plans
    result: dict[str, dict[str, float]] = {}
    for mode, by_policy in samples.items():
        timer = by_policy.pop("timer")
        row = {
            name: statistics.median(v - t for v, t in zip(values, timer, strict=True))
            for name, values in by_policy.items()
        }
        row["added"] = statistics.median(
            a - s for a, s in zip(by_policy["adaptive"], by_policy["stock"], strict=True)
        )
        result[mode] = {k: round(v, 2) for k, v in row.items()}
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=HelpFormatter)
    parser.add_argument("--rounds", type=int, default=7, help="interleaved rounds")
    parser.add_argument("--plans", type=int, default=4000, help="plans per policy and mode")
    parser.add_argument("--evict-kib", type=int, default=4096, help="memory touched between plans")
    args = parser.parse_args(argv)
    result = measure(args.rounds, args.plans, args.evict_kib)
    print(f"{driver_name()}, Python {sys.version.split()[0]}; us per first-host plan (median)")
    print("| caches | stock | adaptive | added |")
    print("| --- | --- | --- | --- |")
    for mode, row in result.items():
        print(f"| {mode} | {row['stock']:.2f} | {row['adaptive']:.2f} | {row['added']:+.2f} |")
    print(json.dumps(result), file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
