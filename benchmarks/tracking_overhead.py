"""Per-request cost of request tracking, through the real hook path.

    python benchmarks/tracking_overhead.py             # k = 11, as 3,500 requests/s on 3 nodes
    python benchmarks/tracking_overhead.py --one-in 1  # every request tracked

A real ``cassandra.cluster.ResponseFuture`` goes through exactly what the driver does for a
one-attempt request -- the request-init listener (``RequestTracker._on_request``: hooks the
future), ``future._query(host)`` (send), the response
delivered to ``future._set_result(...)`` with a real ``ResultMessage``, then the final
``_set_final_result`` -- with and without tracking, in the same run. The network, the
connection and the driver's own request logic are replaced by no-op stand-ins on a
subclass of the future (there is no server here), so the difference is what tracking adds:
count in, record latency (HdrHistogram), count out, plus the hook installation -- on one
request in ``--one-in`` (adaptive_lb.sampling: the k a policy measures, pinned here; 11 is
what a client sending 3,500 requests a second to 3 nodes gets with the default
``tracking.samples_per_host``), and the sampling test on every request. 35 rounds
of 10,000 requests, each round timed without then with tracking; the cost is the median of
the 35 paired differences (a round slowed by a noisy neighbour on a shared machine moves
both halves of its pair), with its interquartile range. The cyclic GC is off while timing.
"""

from __future__ import annotations

import argparse
import gc
import json
import statistics
import sys
import threading
import time

import figures
from cassandra.cluster import ResponseFuture
from cassandra.policies import DCAwareRoundRobinPolicy, TokenAwarePolicy
from cassandra.protocol import ResultMessage

from adaptive_lb import AdaptiveLoadBalancingPolicy
from adaptive_lb.tools.cli_format import HelpFormatter
from adaptive_lb.tools.sim.driver_topology import build_cluster
from adaptive_lb.tracking import RequestTracker


class _Listeners:
    """The two Session methods RequestTracker calls, and a session's (empty) pools: no
    live session without a server."""

    _pools: dict = {}

    def add_request_init_listener(self, fn, *args, **kwargs):
        self.listener = fn

    def remove_request_init_listener(self, fn, *args, **kwargs):
        pass


class _NoNetworkFuture(ResponseFuture):
    """A real ResponseFuture whose network-facing steps are no-ops (there is no server)."""

    def _query(self, host, message=None, cb=None):
        return 1  # the driver's send

    def _set_result(self, host, connection, pool, response):
        return None

    def _set_final_result(self, response):
        return None

    def _set_final_exception(self, response, *args, **kwargs):
        return None


def _future(policy) -> ResponseFuture:
    future = _NoNetworkFuture.__new__(_NoNetworkFuture)
    future._load_balancer = policy
    future._callback_lock = threading.Lock()
    future._callbacks = []
    future._errbacks = []
    future._final_result = ResponseFuture._final_result
    future._final_exception = None
    return future


def run_once(policy, host, response, count: int, tracked: bool, listener) -> float:
    futures = [_future(policy) for _ in range(count)]
    gc.collect()
    gc.disable()
    try:
        start = time.perf_counter()
        for future in futures:
            if tracked:
                listener(future)
            future._query(host)
            future._set_result(host, None, None, response)
            future._set_final_result(None)
        return (time.perf_counter() - start) / count
    finally:
        gc.enable()


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
    policy = AdaptiveLoadBalancingPolicy(TokenAwarePolicy(DCAwareRoundRobinPolicy("dc1")))
    policy.populate(model.cluster, model.metadata.all_hosts())
    registry = _Listeners()
    tracker = RequestTracker(registry)
    assert tracker.sampling
    policy.sampler.every = one_in
    policy.sampler.now_ns = policy.sampler._last_ns.__int__  # k pinned: a frozen clock
    host = model.hosts[0]
    response = ResultMessage(2)
    count = 10_000
    rounds = 35
    base, tracked, cost = [], [], []
    for _ in range(rounds):
        untracked_s = run_once(policy, host, response, count, False, registry.listener)
        tracked_s = run_once(policy, host, response, count, True, registry.listener)
        base.append(untracked_s)
        tracked.append(tracked_s)
        cost.append(tracked_s - untracked_s)
    stats = policy.stats.get(host)
    assert stats.counted_in_flight == 0
    assert abs(stats.requests_total - rounds * count / one_in) <= 0.05 * rounds * count / one_in
    assert tracker.untracked_requests == 0
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
