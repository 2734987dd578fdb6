"""Per-request cost of request tracking, through the real driver path.

    python benchmarks/tracking_overhead.py             # k = 11, as 3,500 requests/s on 3 nodes
    python benchmarks/tracking_overhead.py --one-in 1  # every request tracked

The driver's own ``Session.execute_async`` runs for each request, on a ``Session`` subclass
whose network-facing steps are no-ops (there is no server here;
:mod:`adaptive_lb.tools.offline_session`): it creates a real ``ResponseFuture`` subclass
whose plan comes from the policy (as ``ResponseFuture.__init__`` makes it), calls the
session's ``_on_request`` (the driver's: the request-init listeners, adaptive-lb's among
them), then "sends" it: ``future._query(host)``, the response
delivered to ``future._set_result(...)`` with a real ``ResultMessage``, then
``_set_final_result``. Two sessions, each with its own identical policy, one attached with
``adaptive_lb.instrument`` and one not, are timed in the same run, so the difference is what
tracking adds: the listener and its sampler's pick on every request and, on one request in
``--one-in`` (adaptive_lb.stats.sampling: the k a policy measures, pinned here; 11 is what a
client sending 3,500 requests a second to 3 nodes gets with the default
``tracking.samples_per_host``), the hook, count in, record latency (HdrHistogram),
count out. 35 rounds of 10,000 requests, each round timed without then with tracking; the
cost is the median of the 35 paired differences (a round slowed by a noisy neighbour on a
shared machine moves both halves of its pair), with its interquartile range. The cyclic GC
is off while timing.
"""

from __future__ import annotations

import argparse
import gc
import json
import statistics
import sys
import time

import figures
from cassandra.policies import DCAwareRoundRobinPolicy, TokenAwarePolicy
from cassandra.query import SimpleStatement

from adaptive_lb import AdaptiveLoadBalancingPolicy, instrument
from adaptive_lb.runtime._driver import pool_in_flight_reader
from adaptive_lb.tools.cli_format import HelpFormatter
from adaptive_lb.tools.offline_session import OfflineSession
from adaptive_lb.tools.sim.driver_topology import build_cluster

COUNT = 10_000
"""Requests per timed run."""
ROUNDS = 35
"""Paired rounds."""


def run_once(session, statement, count: int) -> float:
    execute_async = session.execute_async
    gc.collect()
    gc.disable()
    try:
        start = time.perf_counter()
        for _ in range(count):
            execute_async(statement)
        return (time.perf_counter() - start) / count
    finally:
        gc.enable()


def _policy(model) -> AdaptiveLoadBalancingPolicy:
    policy = AdaptiveLoadBalancingPolicy(TokenAwarePolicy(DCAwareRoundRobinPolicy("dc1")))
    policy.populate(model.cluster, model.metadata.all_hosts())
    return policy


def main(argv: list[str] | None = None) -> int:
    """Measure and print JSON (``--help`` describes the benchmark)."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=HelpFormatter)
    parser.add_argument(
        "--one-in", type=int, default=11, help="track one request in K (1: every request)"
    )
    figures.add_record_option(parser)
    args = parser.parse_args(argv)
    one_in = args.one_in
    model = build_cluster({"dc1": [2, 2, 2]}, real_cluster=False)
    policy, reference = _policy(model), _policy(model)
    session, untracked = OfflineSession(policy), OfflineSession(reference)
    # The reference reads in-flight from its session's pools too (the plan's cost, not
    # tracking's), and is told tracking reaches it (no "not attached" warning per plan).
    reference.stats.add_in_flight_source(pool_in_flight_reader(untracked))
    reference.tracking_attached()
    tracker = instrument(session)
    assert tracker.sampling and not tracker.problems
    policy.stop_health_refresh()  # not part of the per-request cost
    if one_in == 1:
        policy.sampler.configure(0)  # every request, never re-measured
    policy.sampler.every = one_in
    policy.sampler.now_ns = policy.sampler._last_ns.__int__  # k pinned: a frozen clock
    statement = SimpleStatement("SELECT v FROM ks.t WHERE k = 1")
    count, rounds = COUNT, ROUNDS
    base, tracked, cost = [], [], []
    for _ in range(rounds):
        untracked_s = run_once(untracked, statement, count)
        tracked_s = run_once(session, statement, count)
        base.append(untracked_s)
        tracked.append(tracked_s)
        cost.append(tracked_s - untracked_s)
    stats = [policy.stats.get(host) for host in model.hosts]
    expected = rounds * count / one_in
    assert sum(s.counted_in_flight for s in stats) == 0
    assert abs(sum(s.requests_total for s in stats) - expected) <= 0.05 * expected
    assert tracker.untracked_requests == 0
    tracker.close()
    quartiles = statistics.quantiles(cost, n=4)
    result = {
        "one_in": one_in,
        "untracked_us": round(statistics.median(base) * 1e6, 3),
        "tracked_us": round(statistics.median(tracked) * 1e6, 3),
        "tracking_cost_us": round(statistics.median(cost) * 1e6, 3),
        "tracking_cost_iqr_us": [round(quartiles[0] * 1e6, 3), round(quartiles[2] * 1e6, 3)],
    }
    print(json.dumps(result))
    figures.record_run("tracking_overhead", args.record, result, argv)
    return 0


if __name__ == "__main__":
    sys.exit(main())
