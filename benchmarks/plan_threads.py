"""Query plans from many threads at once: does throughput hold, or do locks convoy?

    python benchmarks/plan_threads.py

Under the GIL, a Python lock held across a thread switch makes the other threads block on
it, and each hand-over then costs a futex wait and wake: code that takes a lock per
operation can lose most of its throughput to that as soon as a second thread runs it. This
benchmark makes first-host plans (45 nodes, 100,000 keys, as ``adaptive-lb bench``) from 1
and then 8 threads for 3 s each and prints the plans per second made in all, for stock
TokenAware(DCAware) and adaptive-lb wrapping it. It is a worst case: the threads do nothing
but make plans, where an application's threads spend most of their time elsewhere.
"""

from __future__ import annotations

import sys
import threading
import time
from typing import Any

from cassandra.policies import DCAwareRoundRobinPolicy, TokenAwarePolicy
from cassandra.query import SimpleStatement

from adaptive_lb import AdaptiveLoadBalancingPolicy
from adaptive_lb.bench import driver_name
from adaptive_lb.sim.cluster import build_cluster, murmur3_routing_keys

SECONDS = 3.0


def plans_per_second(policy: Any, statements: list[SimpleStatement], threads: int) -> float:
    """First-host plans per second made by ``threads`` threads together."""
    stop = threading.Event()
    made = [0] * threads

    def planner(index: int) -> None:
        make = policy.make_query_plan
        position = index * 10_007
        count = 0
        while not stop.is_set():
            next(iter(make("ks", statements[position % len(statements)])))
            position += 1
            count += 1
        made[index] = count

    workers = [threading.Thread(target=planner, args=(i,)) for i in range(threads)]
    for worker in workers:
        worker.start()
    time.sleep(SECONDS)
    stop.set()
    for worker in workers:
        worker.join()
    return sum(made) / SECONDS


def main() -> int:
    """Measure and print."""
    statements = [
        SimpleStatement("SELECT v FROM ks.t WHERE k = ?", routing_key=k, keyspace="ks")
        for k in murmur3_routing_keys(100_000, seed=1)
    ]
    model = build_cluster({f"dc{i}": [3, 3, 3] for i in range(1, 6)}, vnodes=16, seed=1)
    hosts = model.metadata.all_hosts()
    print(f"{driver_name()}, 45 nodes, first host, Kplans/s made by all threads together:")
    for threads in (1, 8):
        stock = TokenAwarePolicy(DCAwareRoundRobinPolicy("dc1"))
        stock.populate(model.cluster, hosts)
        adaptive = AdaptiveLoadBalancingPolicy(TokenAwarePolicy(DCAwareRoundRobinPolicy("dc1")))
        adaptive.populate(model.cluster, hosts)
        stock_rate = plans_per_second(stock, statements, threads)
        adaptive_rate = plans_per_second(adaptive, statements, threads)
        print(
            f"  {threads} thread(s): stock {stock_rate / 1000:.0f}, "
            f"adaptive {adaptive_rate / 1000:.0f}"
        )
    model.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
