"""Memory: long runs of requests and of host add/remove cycles hold no more memory than
after warm-up (tracemalloc), with and without health refresh; the replica cache stays
within its entries and its byte budget whatever the routing keys' size.

CI runs 50,000 requests and 200 add/remove cycles per case;
``ADAPTIVE_LB_RELIABILITY_SCALE=200`` runs the full scale (10,000,000 requests, 40,000
cycles): see docs/reliability.md for its figures.
"""

from __future__ import annotations

import gc
import os
import random
import tracemalloc

import pytest
from cassandra.policies import DCAwareRoundRobinPolicy, TokenAwarePolicy
from cassandra.protocol import OverloadedErrorMessage, ResultMessage

from adaptive_lb import AdaptiveLoadBalancingPolicy, Config
from adaptive_lb.config import PolicyConfig
from adaptive_lb.core.clock import ManualClock
from adaptive_lb.plan.replicas import MAX_CACHED_KEY_BYTES
from adaptive_lb.runtime.attempts import Attempts
from adaptive_lb.tools.sim.driver_topology import build_cluster, murmur3_routing_keys
from tests.reliability.conftest import scaled, statement

MS = 1_000_000
CACHE_ENTRY_BUDGET = MAX_CACHED_KEY_BYTES + 256
"""Bytes one replica-cache entry may hold at most: its key plus the LRU's own overhead."""


def _request(policy, clock, key, rng) -> None:
    plan = policy.make_query_plan("ks", statement(key))
    host = next(iter(plan))
    attempts = Attempts.of(policy)
    attempts.sent(host)
    clock.advance(rng.randint(1, 5) * MS // 10)
    if rng.random() < 0.05:
        attempts.answered(host, OverloadedErrorMessage(0x1001, "busy", None))
    else:
        attempts.answered(host, ResultMessage(2))
    attempts.ended(None)


def _growth(run, warm_up) -> tuple[int, int]:
    """(bytes traced after warm-up, bytes added by ``run``), cyclic garbage collected."""
    tracemalloc.start()
    try:
        warm_up()
        gc.collect()
        baseline = tracemalloc.get_traced_memory()[0]
        run()
        gc.collect()
        after = tracemalloc.get_traced_memory()[0]
    finally:
        tracemalloc.stop()
    return baseline, after - baseline


# 20,000 requests after a warm-up of as many: the ~1.4 MB traced after it would show a leak of
# 4 bytes per request (5 %); the smallest Python object is 16.
REQUESTS, CYCLES = 20_000, 100


@pytest.mark.parametrize("refresh", [True, False], ids=["health-refresh", "no-refresh"])
def test_requests_and_host_churn_hold_no_memory(refresh):
    clock = ManualClock(0)
    rng = random.Random(5)
    keys = murmur3_routing_keys(8192, seed=7)  # twice the cache: evictions run too
    holder = {}

    def warm_up() -> None:
        model = build_cluster({"dc1": [3, 3, 3], "dc2": [3, 3, 3]}, seed=2, real_cluster=False)
        policy = AdaptiveLoadBalancingPolicy(
            TokenAwarePolicy(DCAwareRoundRobinPolicy("dc1")), clock=clock
        )
        policy.populate(model.cluster, model.metadata.all_hosts())
        holder.update(model=model, policy=policy)
        clock.advance(10_000 * MS)  # past the start-up grace
        # The same work as a CI-scale run, so that both end in the same state: bounded
        # structures (replica cache, the ring memo, histograms of active hosts) are full.
        run_cycles(CYCLES, 10_000)
        run_requests(REQUESTS)
        replay_events()

    def replay_events() -> None:
        # Each host's list of events waiting for replay is bounded (EVENTS_LIMIT) and at a
        # different length at each measurement: emptied, it is not counted as growth.
        for _, stats in holder["policy"].stats.items():
            stats.replay()

    def run_requests(count: int) -> None:
        policy = holder["policy"]
        for index in range(count):
            _request(policy, clock, keys[index % len(keys)], rng)
            if refresh and index % 1000 == 0:
                clock.advance(300 * MS)
                policy.refresh_health()

    def run_cycles(count: int, first: int) -> None:
        model, policy = holder["model"], holder["policy"]
        for serial in range(first, first + count):
            address = f"10.{serial // 62500}.{serial // 250 % 250}.{serial % 250 + 1}"
            host = model.new_host("dc1", f"r{serial % 3 + 1}", address, 2, rng)
            policy.on_add(host)
            policy.on_up(host)
            _request(policy, clock, keys[serial % len(keys)], rng)
            policy.on_down(host)
            policy.on_remove(host)
            model.remove_host(host)
            if serial % 50 == 0:
                model.rebuild_token_map()
                if refresh:
                    policy.refresh_health()

    requests, cycles = scaled(REQUESTS), scaled(CYCLES)

    def run() -> None:  # in the warm-up's order, so that both end in the same state
        run_cycles(cycles, 100_000)
        run_requests(requests)
        replay_events()

    baseline, growth = _growth(run, warm_up)
    print(
        f"\n{requests} requests + {cycles} add/remove cycles ({'with' if refresh else 'no'} "
        f"health refresh): {baseline / 1e6:.1f} MB after warm-up, growth {growth} B "
        f"({growth / baseline:+.2%})"
    )
    assert growth < 0.05 * baseline
    policy = holder["policy"]
    assert len(policy.replica_cache) <= policy.config.policy.replica_cache_size
    assert len(policy.stats) == len(holder["model"].hosts)


@pytest.mark.parametrize("key_bytes", [8, MAX_CACHED_KEY_BYTES, 64 * 1024])
def test_replica_cache_stays_within_entries_and_bytes(key_bytes):
    capacity = 4096
    model = build_cluster({"dc1": [2, 2, 2]}, seed=4, real_cluster=False)
    policy = AdaptiveLoadBalancingPolicy(
        TokenAwarePolicy(DCAwareRoundRobinPolicy("dc1")),
        Config(policy=PolicyConfig(replica_cache_size=capacity)),
    )
    policy.populate(model.cluster, model.metadata.all_hosts())
    lookups = capacity + 1000

    def run() -> None:
        for index in range(lookups):
            key = index.to_bytes(8, "big") + os.urandom(max(0, key_bytes - 8))
            next(iter(policy.make_query_plan("ks", statement(key))))

    _, growth = _growth(run, lambda: None)
    cache = policy.replica_cache
    print(f"\n{key_bytes}-byte keys: {len(cache)} entries, {growth / 1e6:.2f} MB held")
    assert len(cache) <= capacity
    assert growth < capacity * CACHE_ENTRY_BUDGET
    assert cache.hits + cache.misses + cache.bypassed == lookups
    assert policy.internal_errors == 0
