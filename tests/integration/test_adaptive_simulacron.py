"""The real driver, wrapped by adaptive-lb and instrumented, against a simulated 3 DC x 3 node
cluster whose nodes we make slow, failing, stalled or gone (issues 3 and 7)."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import attrs
import pytest
from cassandra.cluster import ExecutionProfile
from cassandra.policies import (
    ConstantSpeculativeExecutionPolicy,
    DCAwareRoundRobinPolicy,
    TokenAwarePolicy,
)

from adaptive_lb import AdaptiveLoadBalancingPolicy, Config, instrument
from adaptive_lb.config import HealthConfig, PolicyConfig, TrackingConfig
from adaptive_lb.health.model import HealthState
from adaptive_lb.runtime._driver import is_tracked
from adaptive_lb.tools.peers.connect import wait_for_pools
from tests.integration.load import LoadResult, closed_loop
from tests.integration.simulacron import Simulacron

pytestmark = pytest.mark.integration

CLUSTER = "adaptive"
RACKS = ["r1", "r2", "r3"]
QUERY = "SELECT v FROM ks.t WHERE k = ?"
ROWS: dict[str, Any] = {"rows": [{"v": 7}], "column_types": {"v": "int"}}
PARAMS: dict[str, Any] = {"param_types": {"k": "int"}}

# The simulated racks are all on loopback, equally near: a rack learned from node speed
# (``local_rack: auto``, the default) would scale the other racks' scores by 4 and change
# the shares these tests judge (a CI run: the ERRORING node, in the learned rack, got 9 %
# of attempts). Rack learning is tested on its own (test_locality, the simulator, and the
# real cluster through a delaying proxy).
NO_RACK = PolicyConfig(local_rack=None)

# Reacts within a few hundred milliseconds, so the tests stay short.
FAST = Config(
    policy=NO_RACK,
    tracking=TrackingConfig(window=2.0, intervals=4),
    health=HealthConfig(
        refresh_interval=0.1, min_samples=20, slow_start=2.0, min_state_duration=0.5
    ),
)


# A longer window: a SLOW host is probed again only after a whole window without news.
# The median: at 32 requests in flight the Python client's own queueing (not the cluster)
# inflates every host's tail, and a 20 ms slower node stands out by its median.
STEADY = Config(
    policy=NO_RACK,
    tracking=TrackingConfig(window=10.0, intervals=5),
    health=HealthConfig(percentile=50.0, refresh_interval=0.1, min_samples=20, slow_start=2.0),
)
# FAST judging latency by the median. With one node failing, the other two carry all the
# load, and their p99 over a 2 s window swings: in 2 of 7 runs on a quiet machine one was
# judged SLOW by p99 against the other's (13.1 vs 5.9 ms), which put it at the failing
# node's penalty (64), and the failing node got 6 % of the attempts. Errors are what the
# test judges; slow nodes have their own tests.
ERRORS_ONLY = attrs.evolve(FAST, health=attrs.evolve(FAST.health, percentile=50.0))


@pytest.fixture(scope="module")
def nodes(simulacron: Simulacron) -> Iterator[dict[str, list[str]]]:
    created = simulacron.create_cluster(CLUSTER, [RACKS] * 3)
    try:
        simulacron.prime_keyspace("ks", {"dc1": 2, "dc2": 2, "dc3": 2})
        simulacron.prime(QUERY, **ROWS, **PARAMS)
        yield created
    finally:
        simulacron.remove_cluster(CLUSTER)


@pytest.fixture(autouse=True)
def clean_dc1(simulacron: Simulacron, nodes: dict[str, list[str]]) -> Iterator[None]:
    yield
    simulacron.clear_primes("dc1", cluster=CLUSTER)


def connect(driver_factory: Any, config: Config = FAST, adaptive: bool = True):
    child = TokenAwarePolicy(DCAwareRoundRobinPolicy("dc1"))
    policy = AdaptiveLoadBalancingPolicy(child, config) if adaptive else child
    cluster, session = driver_factory(policy)
    if adaptive:
        instrument(session)
    # Every local host's pool up before the load: a plan's hosts without one are skipped,
    # and a retry with none left is NoHostAvailable (seen once on scylla-driver in CI).
    wait_for_pools(session, "dc1")
    return policy, cluster, session, session.prepare(QUERY)


def run(session: Any, stmt: Any, concurrency: int, seconds: float) -> LoadResult:
    return closed_loop(session, lambda i: (stmt, [i % 5000]), concurrency, seconds)


def assert_exact_accounting(policy: AdaptiveLoadBalancingPolicy, *results: LoadResult) -> None:
    """Every attempt of a tracked request (all of them while traffic is thin, a 1-in-k
    sample above it) was counted once and released once; none of the others was
    (``results``: every load the policy's session ran)."""
    for view in policy.topology.by_id.values():
        stats = view.stats
        address = view.host.address
        assert stats.counted_in_flight == 0, address
        assert stats.underflows == 0, address
        released = stats.requests_total + stats.abandons_total
        tracked = sum(result.tracked_attempts[address] for result in results)
        assert released == tracked, (address, released, tracked, results[-1].attempts)


def test_plans_contain_exactly_the_hosts_the_child_allows(driver_factory, nodes):
    policy, cluster, _, stmt = connect(driver_factory)
    dc1 = sorted(h for h in cluster.metadata.all_hosts() if h.datacenter == "dc1")
    for k in range(300):
        bound = stmt.bind([k])
        plan = list(policy.make_query_plan("ks", bound))
        assert sorted(plan) == sorted(policy.child.make_query_plan("ks", bound)) == dc1
        replicas = [h for h in cluster.metadata.get_replicas("ks", bound.routing_key) if h in dc1]
        assert set(plan[:2]) == set(replicas)
    assert policy.internal_errors == 0


@pytest.mark.parametrize("concurrency", [8, 32])
def test_slow_node_gets_almost_nothing(simulacron, driver_factory, nodes, concurrency):
    slow = nodes["dc1"][1]
    # +50 ms: decisively slower than its peers behind a client that 32 requests in flight
    # saturate. Its own queueing puts the healthy nodes' medians at 10-20 ms, so +20 ms was
    # a ratio of 2.2-3.6, barely past `outlier_factor` 2, and with the client's jitter
    # (log-spread 0.6) the median test needed 170-290 answers (CI: 8.8 % and 9.9 % shares).
    delay = 50 if simulacron.fine_timer else 100
    simulacron.prime(
        QUERY, **ROWS, **PARAMS, delay_ms=delay, scope=simulacron.scope_of(slow, CLUSTER)
    )
    _, _, stock_session, stock_stmt = connect(driver_factory, adaptive=False)
    stock = run(stock_session, stock_stmt, concurrency, 4.0)
    policy, _, session, stmt = connect(driver_factory, STEADY)
    # The verdict (or the latency factor's ramp, which keeps the node's answers few and the
    # verdict waiting: 4 s once at concurrency 8) first, then the share.
    judged = run(session, stmt, concurrency, 3.0)
    adaptive = run(session, stmt, concurrency, 4.0)
    print(
        f"\nconcurrency {concurrency}, +{delay} ms on {slow}: stock share "
        f"{stock.share(slow):.1%} p99 {stock.percentile(99) * 1000:.1f} ms "
        f"({stock.requests} req); adaptive share {judged.share(slow):.1%} while judged, "
        f"{adaptive.share(slow):.1%} then, p99 {adaptive.percentile(99) * 1000:.1f} ms "
        f"({adaptive.requests} req)"
    )
    for view in sorted(policy.topology.local, key=lambda v: v.host.address):
        window = policy.health.windows.get(view.host)
        print(view.host.address, view.stats.health_state, window.latency, window.samples)
    assert stock.share(slow) > 0.2
    assert adaptive.share(slow) <= 0.05
    # No p99 comparison: the two runs' tails are the Python client's own queueing, and on a
    # CPU-starved machine either may be higher (85.7 vs 65.4 ms once); the share is the
    # behaviour.
    assert not adaptive.errors
    assert_exact_accounting(policy, judged, adaptive)


def test_ten_requests_a_second_see_a_node_50_ms_slower(simulacron, driver_factory, nodes):
    """Issue 24: a client sending 10 requests a second, one at a time, with the shipped
    health settings (``min_samples`` 50 in a 10 s window: never reached at ~3 answers a
    second per host). 3 s of normal traffic, then one node answers 50 ms later. Before the
    evidence rules 29 % of the requests went on to it, as stock routing's third. (The
    simulator's target is 5 %; here, a bound that a busy CI machine keeps.)"""
    slow = nodes["dc1"][1]
    delay = 50 if simulacron.fine_timer else 100
    policy, _, session, stmt = connect(driver_factory, Config(policy=NO_RACK))

    def paced(seconds: float) -> list[tuple[float, list[str]]]:
        """(seconds since the start, attempted hosts) of each request, 10 a second."""
        started, sent = time.monotonic(), []
        for i in range(round(seconds * 10)):
            at = time.monotonic() - started
            result = session.execute(stmt, [i])
            sent.append((at, [host.address for host in result.response_future.attempted_hosts]))
            time.sleep(max(0.0, started + (i + 1) * 0.1 - time.monotonic()))
        return sent

    paced(3.0)  # every host answers normally: rack distances are measured
    simulacron.prime(
        QUERY, **ROWS, **PARAMS, delay_ms=delay, scope=simulacron.scope_of(slow, CLUSTER)
    )
    after_10_s = [host for at, hosts in paced(20.0) if at >= 10.0 for host in hosts]
    share = after_10_s.count(slow) / len(after_10_s)
    states = {v.host.address: v.stats.health_state for v in policy.topology.local}
    print(f"\n+{delay} ms on {slow}, 10 req/s: its share after 10 s {share:.1%}; {states}")
    assert share <= 0.10
    assert states[slow] in (HealthState.SLOW, HealthState.WARMING)
    assert policy.internal_errors == 0


def test_failing_node_turns_erroring_then_warms_back(simulacron, driver_factory, nodes):
    failing = nodes["dc1"][0]
    scope = simulacron.scope_of(failing, CLUSTER)
    simulacron.prime_error(QUERY, "overloaded", scope=scope, **PARAMS)
    policy, cluster, session, stmt = connect(driver_factory, ERRORS_ONLY)
    host = next(h for h in cluster.metadata.all_hosts() if h.address == failing)
    stats = policy.stats.get(host)
    first = run(session, stmt, 4, 1.0)
    assert stats.health_state is HealthState.ERRORING
    assert stats.errors_total > 0
    assert not first.errors  # the retry policy moved every failed attempt to another host
    after = run(session, stmt, 4, 1.5)
    assert after.share(failing) < 0.05
    simulacron.clear_primes("dc1", cluster=CLUSTER)
    states = set()
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline and stats.health_state is not HealthState.HEALTHY:
        run(session, stmt, 4, 0.5)
        states.add(stats.health_state)
    assert HealthState.WARMING in states
    assert stats.health_state is HealthState.HEALTHY
    assert stats.counted_in_flight == 0


def test_stalled_node_is_avoided_and_traffic_returns(simulacron, driver_factory, nodes):
    stalled = nodes["dc1"][2]
    dc, node = simulacron.scope_of(stalled, CLUSTER)
    policy, _, session, stmt = connect(driver_factory)
    run(session, stmt, 8, 1.0)  # warm up: every host healthy and measured
    simulacron.pause_reads(dc, node, cluster=CLUSTER)
    try:
        during = run(session, stmt, 8, 3.0)
    finally:
        simulacron.resume_reads(dc, node, cluster=CLUSTER)
    # Only the requests already queued on it (and a few probes) may hang.
    print(f"\nstall: {during.attempts[stalled]} attempts of {during.requests} went to it")
    assert during.attempts[stalled] <= 16
    assert sum(during.errors.values()) <= 16
    recovered = LoadResult()
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline and recovered.attempts[stalled] < 50:
        part = run(session, stmt, 8, 1.0)
        recovered.attempts.update(part.attempts)
    assert recovered.attempts[stalled] >= 50
    time.sleep(0.2)
    assert all(v.stats.counted_in_flight == 0 for v in policy.topology.by_id.values())


def test_node_down_and_back_returns_through_warming(simulacron, driver_factory, nodes):
    victim = nodes["dc1"][1]
    dc, node = simulacron.scope_of(victim, CLUSTER)
    policy, cluster, session, stmt = connect(driver_factory)
    host = next(h for h in cluster.metadata.all_hosts() if h.address == victim)
    simulacron.take_down(dc, node, cluster=CLUSTER)
    try:
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline and host.is_up:
            run(session, stmt, 4, 0.3)
        assert not host.is_up
        for k in range(100):
            assert host not in list(policy.make_query_plan("ks", stmt.bind([k])))
        time.sleep(1.2)  # a real outage, not a sub-second blip
    finally:
        simulacron.rebind(dc, node, cluster=CLUSTER)
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline and not host.is_up:
        time.sleep(0.1)
    assert host.is_up
    assert policy.stats.get(host).health_state is HealthState.WARMING
    result = run(session, stmt, 4, 1.0)
    assert result.attempts[victim] > 0
    time.sleep(0.2)
    assert all(v.stats.counted_in_flight == 0 for v in policy.topology.by_id.values())


def test_speculative_executions_are_tracked_per_attempt(simulacron, driver_factory, nodes):
    slow = nodes["dc1"][0]
    simulacron.prime(
        QUERY, **ROWS, **PARAMS, delay_ms=200, scope=simulacron.scope_of(slow, CLUSTER)
    )
    _, cluster, session, _ = connect(driver_factory)
    # A second adaptive policy in its own execution profile, speculating after 20 ms.
    spec_policy = AdaptiveLoadBalancingPolicy(
        TokenAwarePolicy(DCAwareRoundRobinPolicy("dc1")), FAST
    )
    cluster.add_execution_profile(
        "spec",
        ExecutionProfile(
            load_balancing_policy=spec_policy,
            speculative_execution_policy=ConstantSpeculativeExecutionPolicy(0.02, 2),
            request_timeout=2.0,
        ),
    )
    stmt = session.prepare(QUERY)
    stmt.is_idempotent = True
    result = LoadResult()
    for k in range(300):
        future = session.execute_async(stmt, [k], execution_profile="spec")
        future.result()
        for h in future.attempted_hosts:
            result.attempts[h.address] += 1
            if is_tracked(future):
                result.tracked_attempts[h.address] += 1
    time.sleep(0.5)  # late responses of the losing attempts
    speculated = sum(result.attempts.values()) - 300
    print(f"\nspeculative: {speculated} extra attempts, per host {dict(result.attempts)}")
    assert speculated > 0
    assert_exact_accounting(spec_policy, result)
