"""Plans and request tracking from many threads at once: does throughput hold, or do locks
convoy?

    python benchmarks/threads.py

Under the GIL, a Python lock held across a thread switch makes the other threads block on
it, and each hand-over then costs a futex wait and wake: code that takes a lock per
operation can lose most of its throughput to that as soon as a second thread runs it (and a
driver always runs two: the application's and its event loop's). For 3 s per figure, this
prints what 1, 2 and 8 threads get through together:

* first-host plans (45 nodes, 100,000 keys, as ``adaptive-lb bench``) of stock
  TokenAware(DCAware) and of adaptive-lb wrapping it;
* tracking events: ``on_send`` then ``on_success`` (with a latency sample) on the
  ``HostStats`` of 9 hosts in turn, what every request does.

It is a worst case: the threads do nothing else, where an application's threads spend most
of their time elsewhere.
"""

from __future__ import annotations

import argparse
import sys
import threading
import time
from typing import Any

from cassandra.policies import DCAwareRoundRobinPolicy, TokenAwarePolicy
from cassandra.query import SimpleStatement

from adaptive_lb import AdaptiveLoadBalancingPolicy, Config
from adaptive_lb.core.clock import SYSTEM_CLOCK
from adaptive_lb.stats.registry import StatsRegistry
from adaptive_lb.tools.bench import cluster_45, driver_name, routed_statements
from adaptive_lb.tools.cli_format import HelpFormatter

SECONDS = 3.0


def per_second(work: Any, threads: int) -> float:
    """Operations per second made by ``threads`` threads running ``work(index, stop)``
    together; ``work`` returns how many it made."""
    stop = threading.Event()
    made = [0] * threads

    def run(index: int) -> None:
        made[index] = work(index, stop)

    workers = [threading.Thread(target=run, args=(i,)) for i in range(threads)]
    for worker in workers:
        worker.start()
    time.sleep(SECONDS)
    stop.set()
    for worker in workers:
        worker.join()
    return sum(made) / SECONDS


def planning(policy: Any, statements: list[SimpleStatement]) -> Any:
    """Work: first-host plans of ``policy``, each thread from its own place in the keys."""

    def work(index: int, stop: threading.Event) -> int:
        make = policy.make_query_plan
        position = index * 10_007
        count = 0
        while not stop.is_set():
            next(iter(make("ks", statements[position % len(statements)])))
            position += 1
            count += 1
        return count

    return work


def tracking(hosts: list[Any]) -> Any:
    """Work: one request's tracking events (send, success with a 0.5-2 ms latency) on each
    host in turn."""

    def work(index: int, stop: threading.Event) -> int:
        count = 0
        position = index
        while not stop.is_set():
            stats = hosts[position % len(hosts)]
            stats.on_send()
            stats.on_success(500_000 + (position % 1500) * 1000)
            position += 1
            count += 1
        return count

    return work


def main(argv: list[str] | None = None) -> int:
    """Measure and print. (No options: ``--help`` describes the benchmark.)"""
    argparse.ArgumentParser(description=__doc__, formatter_class=HelpFormatter).parse_args(argv)
    statements = routed_statements(100_000)
    model = cluster_45()
    hosts = model.metadata.all_hosts()
    print(f"{driver_name()}: thousands per second, all threads together")
    for threads in (1, 2, 8):
        stock = TokenAwarePolicy(DCAwareRoundRobinPolicy("dc1"))
        stock.populate(model.cluster, hosts)
        adaptive = AdaptiveLoadBalancingPolicy(TokenAwarePolicy(DCAwareRoundRobinPolicy("dc1")))
        adaptive.populate(model.cluster, hosts)
        stats = StatsRegistry(Config().tracking, SYSTEM_CLOCK)
        rates = (
            per_second(planning(stock, statements), threads),
            per_second(planning(adaptive, statements), threads),
            per_second(tracking([stats.get(i) for i in range(9)]), threads),
        )
        stock_rate, adaptive_rate, tracking_rate = (rate / 1000 for rate in rates)
        print(
            f"  {threads} thread(s): plans stock {stock_rate:.0f}, adaptive {adaptive_rate:.0f};"
            f" tracked requests {tracking_rate:.0f}"
        )
    model.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
