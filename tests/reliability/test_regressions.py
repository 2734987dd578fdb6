"""One regression test per defect the adversarial battery found (each failed before its fix):
a reload racing completions, failures off the request path, hosts coming back from the
dead, holes in the permutation guarantee."""

from __future__ import annotations

import gc
import sys
import threading
import time
import tracemalloc

import pytest
from cassandra.policies import DCAwareRoundRobinPolicy, LoadBalancingPolicy, TokenAwarePolicy
from cassandra.protocol import ResultMessage

from adaptive_lb import AdaptiveLoadBalancingPolicy, Config
from adaptive_lb.config import HealthConfig, TrackingConfig
from adaptive_lb.core.clock import SYSTEM_CLOCK, ManualClock
from adaptive_lb.runtime.attempts import Attempts
from adaptive_lb.stats.host import HostStats
from adaptive_lb.tools.sim.driver_topology import build_cluster, murmur3_routing_keys
from tests.reliability.conftest import scaled, statement

# ---------------------------------------------------------------- a reload racing completions


def test_completions_racing_reconfigures_never_mix_layouts():
    """Before: HostStats published the new config before the histogram layout that goes
    with it, so an on_success racing a reconfigure could compute its slot from a mix of
    the two layouts and write it into the new histograms: an IndexError inside the
    driver's callback (a lost response), or a silently wrong bucket. The old code failed
    this test in 2 runs of 3 (~1 error a second); now config and layout are one object,
    read once."""
    large = TrackingConfig(significant_digits=3, latency_max=60.0)
    small = TrackingConfig(significant_digits=1, latency_max=0.01)
    stats = HostStats(large, SYSTEM_CLOCK)
    stop = threading.Event()
    errors: list[BaseException] = []
    completed = [0] * 6

    def complete(index: int) -> None:
        while not stop.is_set():
            stats.on_send()
            try:
                stats.on_success(9_000_000)  # 9 ms: inside both layouts' ranges
            except BaseException as exc:
                errors.append(exc)
                stop.set()
            completed[index] += 1

    def reconfigure() -> None:
        flip = False
        while not stop.is_set():
            stats.reconfigure(small if flip else large)
            flip = not flip
            time.sleep(0)

    old_interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)  # switch threads as often as possible
    threads = [threading.Thread(target=complete, args=(i,)) for i in range(6)]
    threads.append(threading.Thread(target=reconfigure))
    try:
        for thread in threads:
            thread.start()
        stop.wait(5.0 * scaled(1))
    finally:
        stop.set()
        for thread in threads:
            thread.join(10)
        sys.setswitchinterval(old_interval)
    assert not errors, errors[:3]
    assert stats.in_flight == 0 and stats.underflows == 0
    assert stats.requests_total == sum(completed)
    window = stats.window_stats((0.0, 100.0))  # the last window's samples: all 9 ms
    for value in window.latency.values():
        if value is not None:
            assert value == pytest.approx(0.009, rel=0.2)


# ---------------------------------------------------------------- errors off the request path


def test_failing_health_refresh_is_counted_and_logged_once(captured_logs):
    """Before: a health refresh that raised logged a traceback every refresh (5/s) and was
    not counted. Now it goes through the policy's one counted, rate-limited error path."""
    model = build_cluster({"dc1": [2, 2, 2]}, seed=3, real_cluster=False)
    config = Config(health=HealthConfig(refresh_interval=0.01))
    policy = AdaptiveLoadBalancingPolicy(DCAwareRoundRobinPolicy("dc1"), config)
    policy.populate(model.cluster, model.metadata.all_hosts())

    def broken(*args, **kwargs):
        raise RuntimeError("refresh broke")

    policy.health.maybe_refresh = broken
    policy.start_health_refresh()
    try:
        deadline = time.monotonic() + 10
        while policy.errors.counts()["health_refresh"] < 5 and time.monotonic() < deadline:
            time.sleep(0.01)
    finally:
        policy.stop_health_refresh()
    assert policy.errors.counts()["health_refresh"] >= 5
    assert policy.internal_errors == policy.errors.counts()["health_refresh"]
    logged = captured_logs.matching("internal error in health_refresh")
    assert len(logged) == 1
    assert logged[0].exc_info is not None  # the first one carries its traceback


# ---------------------------------------------------------------- hosts back from the dead


@pytest.fixture
def churn_policy():
    model = build_cluster({"dc1": [2, 2, 2]}, seed=5, real_cluster=False)
    policy = AdaptiveLoadBalancingPolicy(
        TokenAwarePolicy(DCAwareRoundRobinPolicy("dc1")), clock=ManualClock(0)
    )
    policy.populate(model.cluster, model.metadata.all_hosts())
    return model, policy


def test_on_down_for_unknown_or_removed_host_creates_nothing(churn_policy):
    model, policy = churn_policy
    host = model.hosts[0]
    stranger = build_cluster({"dc1": [1]}, seed=9, real_cluster=False).hosts[0]
    policy.on_down(stranger)
    policy.on_up(stranger)
    policy.on_remove(host)
    policy.on_down(host)
    policy.on_up(host)
    for gone in (host, stranger):
        assert policy.topology.view_of(gone) is None
        assert gone not in policy.stats
        assert policy.health.health(gone) is None
    assert policy.unknown_host_events == 4


def test_attempt_on_host_removed_after_planning_is_counted_without_state(churn_policy):
    model, policy = churn_policy
    host = model.hosts[0]
    policy.on_remove(host)
    attempts = Attempts.of(policy)
    attempts.sent(host)
    attempts.answered(host, ResultMessage(2))
    attempts.ended(None)
    assert host not in policy.stats
    assert policy.untracked_attempts == 1


def test_health_refresh_racing_a_removal_keeps_no_verdict(churn_policy):
    model, policy = churn_policy
    host = model.hosts[0]
    inputs = policy._refresh.inputs()  # taken just before the removal lands
    policy.on_remove(host)
    policy.refresh_health()  # another thread's refresh ends first
    policy._refresh.inputs = lambda: inputs
    policy.refresh_health()
    assert policy.health.health(host) is None
    assert policy.health.windows.get(host) is None


def test_removed_hosts_are_forgotten_without_any_health_refresh(churn_policy):
    """Before: with no health refresh (a policy used without instrument), every removed
    host stayed referenced for ever (~380 B per add/remove cycle)."""
    model, policy = churn_policy
    clock = policy.clock
    clock.advance(10 * 10**9)  # past the start-up grace: added hosts start WARMING
    import random

    rng = random.Random(1)

    def cycle(index: int) -> None:
        host = model.new_host("dc1", "r1", f"10.9.{index // 250}.{index % 250}", 1, rng)
        policy.on_add(host)
        policy.on_up(host)
        policy.on_down(host)
        policy.on_remove(host)
        model.remove_host(host)

    for index in range(200):  # warm-up
        cycle(index)
    gc.collect()
    tracemalloc.start()
    try:
        before = tracemalloc.take_snapshot()
        for index in range(200, 200 + scaled(2000)):
            cycle(index)
        gc.collect()
        after = tracemalloc.take_snapshot()
    finally:
        tracemalloc.stop()
    growth = sum(stat.size_diff for stat in after.compare_to(before, "filename"))
    assert growth < 50 * scaled(2000) // 10, f"{growth} bytes kept by {scaled(2000)} cycles"
    assert len(policy.stats) == len(model.hosts)
    assert not policy.health._forgotten


# ---------------------------------------------------------------- the permutation guarantee


class RepeatingPolicy(LoadBalancingPolicy):
    """A user's own policy whose plan names every host twice."""

    def populate(self, cluster, hosts):
        self.hosts = list(hosts)

    def distance(self, host):
        from cassandra.policies import HostDistance

        return HostDistance.LOCAL

    def make_query_plan(self, working_keyspace=None, query=None):
        yield from self.hosts
        yield from self.hosts

    def on_up(self, host):
        pass

    def on_down(self, host):
        pass

    def on_add(self, host):
        self.hosts.append(host)

    def on_remove(self, host):
        self.hosts.remove(host)


@pytest.mark.parametrize("routed", [True, False])
def test_a_child_repeating_a_host_gets_it_yielded_once(routed):
    model = build_cluster({"dc1": [4, 4, 4]}, seed=3, real_cluster=False)  # > sample_size
    policy = AdaptiveLoadBalancingPolicy(TokenAwarePolicy(RepeatingPolicy()))
    policy.populate(model.cluster, model.metadata.all_hosts())
    for key in murmur3_routing_keys(50, seed=2):
        query = statement(key) if routed else None
        plan = list(policy.make_query_plan("ks", query))
        assert len(plan) == len(set(plan)) == len(model.hosts)
    assert policy.internal_errors == 0


def test_one_policy_for_two_open_clusters_is_refused():
    first = build_cluster({"dc1": [1, 1, 1]}, seed=3, real_cluster=False)
    second = build_cluster({"dc1": [1, 1, 1]}, seed=4, real_cluster=False)
    policy = AdaptiveLoadBalancingPolicy(DCAwareRoundRobinPolicy("dc1"))
    policy.populate(first.cluster, first.metadata.all_hosts())
    # The same cluster again (a second execution profile sharing the policy): fine.
    policy.populate(first.cluster, first.metadata.all_hosts())
    with pytest.raises(ValueError, match="another Cluster"):
        policy.populate(second.cluster, second.metadata.all_hosts())
    assert set(policy.make_query_plan()) == set(first.hosts)
    # Once the first cluster is shut down the policy starts afresh for the next one.
    first.shutdown()
    policy.populate(second.cluster, second.metadata.all_hosts())
    for _ in range(20):
        assert set(policy.make_query_plan()) == set(second.hosts)
    assert not any(host in policy.stats for host in first.hosts)
