"""AdaptiveLoadBalancingPolicy against the drivers' real Host / Metadata / TokenMap objects."""

from __future__ import annotations

import collections
import random
import threading

import pytest
from cassandra import ConsistencyLevel
from cassandra.cluster import EXEC_PROFILE_DEFAULT, Cluster, ExecutionProfile
from cassandra.policies import (
    DCAwareRoundRobinPolicy,
    DefaultLoadBalancingPolicy,
    HostDistance,
    HostFilterPolicy,
    RoundRobinPolicy,
    TokenAwarePolicy,
    WhiteListRoundRobinPolicy,
)
from cassandra.query import SimpleStatement

from adaptive_lb import AdaptiveLoadBalancingPolicy, Config
from adaptive_lb.config import PolicyConfig
from adaptive_lb.core.clock import ManualClock
from adaptive_lb.health.model import HealthState
from adaptive_lb.tools.sim.driver_topology import build_cluster, murmur3_routing_keys

try:
    from cassandra.policies import RackAwareRoundRobinPolicy
except ImportError:
    RackAwareRoundRobinPolicy = None


@pytest.fixture(autouse=True)
def no_internal_errors(request):
    """Every policy made by ``populated`` must end a test without a swallowed error (the
    fallback to the child's plan would otherwise hide bugs), unless the test expects some."""
    made = []
    _made.append(made)
    yield
    _made.remove(made)
    if "expect_internal_errors" not in request.keywords:
        for policy in made:
            assert policy.internal_errors == 0


_made: list[list] = []


def populated(model, child, config=None):
    policy = AdaptiveLoadBalancingPolicy(child, config)
    policy.populate(model.cluster, model.metadata.all_hosts())
    for made in _made:
        made.append(policy)
    return policy


def statement(key: bytes, keyspace: str = "ks", **kwargs) -> SimpleStatement:
    return SimpleStatement(
        "SELECT v FROM ks.t WHERE k = %s", routing_key=key, keyspace=keyspace, **kwargs
    )


def local_replicas(model, key, dc="dc1"):
    return [h for h in model.metadata.get_replicas("ks", key) if h.datacenter == dc]


def test_replicas_first_under_equal_load(cluster_3dc):
    policy = populated(cluster_3dc, TokenAwarePolicy(DCAwareRoundRobinPolicy("dc1")))
    for key in murmur3_routing_keys(200, seed=1):
        plan = list(policy.make_query_plan("ks", statement(key)))
        replicas = local_replicas(cluster_3dc, key)
        assert len(replicas) == 3
        assert set(plan[:3]) == set(replicas)
        assert all(h.datacenter == "dc1" for h in plan)
        assert len(plan) == len(set(plan)) == 6


def test_loaded_replica_moves_behind_its_peers(cluster_3dc):
    policy = populated(cluster_3dc, TokenAwarePolicy(DCAwareRoundRobinPolicy("dc1")))
    key = murmur3_routing_keys(1, seed=3)[0]
    replicas = local_replicas(cluster_3dc, key)
    loaded = replicas[0]
    policy.stats.get(loaded).in_flight = 5
    for _ in range(200):
        plan = list(policy.make_query_plan("ks", statement(key)))
        assert set(plan[:2]) == set(replicas[1:])
        assert plan[2] is loaded
    # So loaded that a non-replica (12x penalty) is better: (60 + 1) > 12 * (0 + 1).
    policy.stats.get(loaded).in_flight = 60
    for _ in range(50):
        plan = list(policy.make_query_plan("ks", statement(key)))
        assert plan.index(loaded) > 2


def test_under_load_the_first_host_comes_before_ordering_and_the_plan_is_unchanged(
    cluster_3dc, monkeypatch
):
    """Under load no replica scores below every possible non-replica, so the planner checks
    this plan's fill hosts: when none beats the best replica, that replica is yielded
    before the candidates are ordered. The plan is the one ordering every candidate gives
    (a recorded plan always orders all of them)."""
    import adaptive_lb.plan.planner
    from adaptive_lb.plan.planner import PlanRecord

    calls = collections.Counter()
    real_order = adaptive_lb.plan.planner.order

    def counted_order(*args):
        calls["order"] += 1
        return real_order(*args)

    monkeypatch.setattr(adaptive_lb.plan.planner, "order", counted_order)
    policy = populated(cluster_3dc, TokenAwarePolicy(DCAwareRoundRobinPolicy("dc1")))
    rng = random.Random(11)
    hosts = list(cluster_3dc.metadata.all_hosts())
    early = 0
    for key in murmur3_routing_keys(300, seed=12):
        # Distinct loads, so that no order depends on a tie-break; the lightest replica is
        # at 11 in flight or more: no better than 12 x an idle non-replica's (0 + 1).
        for host, load in zip(hosts, rng.sample(range(11, 200), len(hosts)), strict=True):
            policy.stats.get(host).in_flight = load
        replicas = local_replicas(cluster_3dc, key)
        calls.clear()
        lazy = policy.make_query_plan("ks", statement(key))
        first = next(lazy)
        if first in replicas:
            assert calls["order"] == 0  # yielded before the candidates were ordered
            early += 1
        plan = [first, *lazy]
        assert calls["order"] == 1
        assert plan == list(policy._planner.plan("ks", statement(key), PlanRecord()))
    assert early > 250
    for host in hosts:
        policy.stats.get(host).in_flight = 0


def test_unhealthy_host_sinks(cluster_3dc):
    policy = populated(cluster_3dc, TokenAwarePolicy(DCAwareRoundRobinPolicy("dc1")))
    key = murmur3_routing_keys(1, seed=4)[0]
    replicas = local_replicas(cluster_3dc, key)
    sick = replicas[1]
    policy.stats.get(sick).health_penalty = 64.0
    for _ in range(200):
        plan = list(policy.make_query_plan("ks", statement(key)))
        # Healthy replicas, then the 3 healthy non-replicas (score 12), then the sick one.
        assert plan[-1] is sick or plan.index(sick) >= 5


def test_first_host_uniform_across_equal_replicas(cluster_3dc):
    policy = populated(cluster_3dc, TokenAwarePolicy(DCAwareRoundRobinPolicy("dc1")))
    key = murmur3_routing_keys(1, seed=5)[0]
    stmt = statement(key)
    counts = collections.Counter(
        next(iter(policy.make_query_plan("ks", stmt))) for _ in range(100_000)
    )
    assert set(counts) == set(local_replicas(cluster_3dc, key))
    for count in counts.values():
        assert abs(count / 100_000 - 1 / 3) <= 0.05 / 3


def test_no_routing_key_spreads_over_local_hosts(cluster_3dc):
    policy = populated(cluster_3dc, DCAwareRoundRobinPolicy("dc1"))
    counts = collections.Counter(
        next(iter(policy.make_query_plan("ks", SimpleStatement("SELECT now() FROM system.local"))))
        for _ in range(60_000)
    )
    assert len(counts) == 6
    for count in counts.values():
        assert abs(count / 60_000 - 1 / 6) < 0.02


def test_lwt_order_is_deterministic_and_unhealthy_last(cluster_3dc):
    policy = populated(cluster_3dc, TokenAwarePolicy(DCAwareRoundRobinPolicy("dc1")))
    key = murmur3_routing_keys(1, seed=6)[0]
    replicas = local_replicas(cluster_3dc, key)
    lwt = statement(key, consistency_level=ConsistencyLevel.SERIAL)
    policy.stats.get(replicas[0]).in_flight = 50  # load must NOT reorder an LWT plan
    firsts = {tuple(list(policy.make_query_plan("ks", lwt))[:3]) for _ in range(200)}
    assert firsts == {tuple(replicas)}
    policy.stats.get(replicas[0]).health_penalty = 64.0
    plans = {tuple(list(policy.make_query_plan("ks", lwt))[:3]) for _ in range(200)}
    assert plans == {(replicas[1], replicas[2], replicas[0])}


def test_replica_cache_hit_miss_eviction_and_invalidation(cluster_3dc):
    config = Config(policy=PolicyConfig(replica_cache_size=4))
    policy = populated(cluster_3dc, TokenAwarePolicy(DCAwareRoundRobinPolicy("dc1")), config)
    cache = policy.replica_cache
    keys = murmur3_routing_keys(6, seed=8)
    for key in keys[:4]:
        list(policy.make_query_plan("ks", statement(key)))
    assert (cache.hits, cache.misses, cache.evictions) == (0, 4, 0)
    for key in keys[:4]:
        list(policy.make_query_plan("ks", statement(key)))
    assert (cache.hits, cache.misses) == (4, 4)
    for key in keys[4:]:
        list(policy.make_query_plan("ks", statement(key)))
    assert cache.evictions == 2 and len(cache) == 4
    # keys[0] and keys[1] were the least recently used: evicted.
    list(policy.make_query_plan("ks", statement(keys[0])))
    assert cache.misses == 7
    # A new token map object invalidates everything.
    invalidations = cache.invalidations
    cluster_3dc.rebuild_token_map()
    list(policy.make_query_plan("ks", statement(keys[5])))
    assert cache.invalidations == invalidations + 1
    assert cache.misses == 8


def test_cache_resized_by_a_reload_starts_empty_and_keeps_its_counts(cluster_3dc):
    policy = populated(
        cluster_3dc,
        TokenAwarePolicy(DCAwareRoundRobinPolicy("dc1")),
        Config(policy=PolicyConfig(replica_cache_size=4)),
    )
    cache = policy.replica_cache
    keys = murmur3_routing_keys(4, seed=8)
    for _ in range(2):
        for key in keys:
            list(policy.make_query_plan("ks", statement(key)))
    assert (cache.hits, cache.misses, len(cache)) == (4, 4, 4)
    invalidations = cache.invalidations
    policy.reload(Config(policy=PolicyConfig(replica_cache_size=0)))
    assert cache.invalidations == invalidations + 1 and len(cache) == 0
    # Size 0: no cache at all; every lookup is resolved without it, nothing is evicted.
    assert not cache.active
    for key in keys:
        plan = list(policy.make_query_plan("ks", statement(key)))
        assert set(plan[:3]) == set(local_replicas(cluster_3dc, key))
    assert (cache.hits, cache.misses, cache.bypassed, cache.evictions) == (4, 4, 4, 0)
    assert len(cache) == 0
    policy.reload(Config(policy=PolicyConfig(replica_cache_size=2)))
    assert cache.active
    for key in keys:
        list(policy.make_query_plan("ks", statement(key)))
    assert (cache.hits, cache.misses, cache.bypassed, cache.evictions) == (4, 8, 4, 2)
    assert len(cache) == 2
    assert cache.hit_ratio == pytest.approx(4 / 16)  # of every lookup


def test_cache_counts_are_exact_under_many_threads(cluster_3dc):
    policy = populated(
        cluster_3dc,
        TokenAwarePolicy(DCAwareRoundRobinPolicy("dc1")),
        Config(policy=PolicyConfig(replica_cache_size=32)),
    )
    keys = murmur3_routing_keys(64, seed=12)
    statements = [statement(key) for key in keys]

    def plans(seed: int) -> None:
        rng = random.Random(seed)
        for _ in range(2000):
            next(iter(policy.make_query_plan("ks", rng.choice(statements))))

    threads = [threading.Thread(target=plans, args=(seed,)) for seed in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    cache = policy.replica_cache
    # ~50 % hits: the cache may step aside part way; every lookup is counted once.
    assert cache.hits + cache.misses + cache.bypassed == 8 * 2000
    assert cache.hits > 0 and len(cache) == 32
    assert cache.evictions == cache.misses - 32


def test_cache_steps_aside_for_keys_it_cannot_hold_and_routing_stays_right(cluster_3dc):
    policy = populated(
        cluster_3dc,
        TokenAwarePolicy(DCAwareRoundRobinPolicy("dc1")),
        Config(policy=PolicyConfig(replica_cache_size=16)),
    )
    cache = policy.replica_cache
    keys = murmur3_routing_keys(6000, seed=15)  # every key once: no hit ever
    for key in keys:
        first = next(iter(policy.make_query_plan("ks", statement(key))))
        assert first in local_replicas(cluster_3dc, key)
    assert not cache.active and cache.hits == 0 and cache.bypassed > 0
    assert cache.misses + cache.bypassed == len(keys)
    # Resolved without it, as with it: the whole plan is unchanged.
    for key in keys[:200]:
        plan = list(policy.make_query_plan("ks", statement(key)))
        assert set(plan[:3]) == set(local_replicas(cluster_3dc, key))
        assert len(plan) == len(set(plan))
    assert cache.bypassed == len(keys) + 200 - cache.misses


def test_cache_follows_ring_changes(cluster_3dc):
    policy = populated(cluster_3dc, TokenAwarePolicy(DCAwareRoundRobinPolicy("dc1")))
    keys = murmur3_routing_keys(50, seed=9)
    for key in keys:
        list(policy.make_query_plan("ks", statement(key)))
    # A new node takes over token ranges: replicas must be recomputed, not served stale.
    new = cluster_3dc.new_host("dc1", "r1", "127.1.9.9", 64, random.Random(1))
    policy.on_add(new)
    cluster_3dc.rebuild_token_map()
    for key in keys:
        plan = list(policy.make_query_plan("ks", statement(key)))
        assert set(plan[:3]) == set(local_replicas(cluster_3dc, key))


def test_down_host_is_not_a_candidate_and_returns_warming(cluster_3dc):
    clock = ManualClock(10**9)
    policy = AdaptiveLoadBalancingPolicy(
        TokenAwarePolicy(DCAwareRoundRobinPolicy("dc1")), clock=clock
    )
    policy.populate(cluster_3dc.cluster, cluster_3dc.metadata.all_hosts())
    key = murmur3_routing_keys(1, seed=10)[0]
    replica = local_replicas(cluster_3dc, key)[0]
    # A down/up blip while the driver connects does not start a slow start...
    replica.set_down()
    policy.on_down(replica)
    replica.set_up()
    policy.on_up(replica)
    assert policy.stats.get(replica).health_state is HealthState.HEALTHY
    # ...a host returning to a cluster in service does.
    clock.advance_s(60)
    replica.set_down()
    policy.on_down(replica)
    for _ in range(50):
        assert replica not in list(policy.make_query_plan("ks", statement(key)))
    clock.advance_s(5)
    replica.set_up()
    policy.on_up(replica)
    stats = policy.stats.get(replica)
    assert stats.health_state is HealthState.WARMING
    assert stats.health_penalty == policy.config.health.penalties.warming
    firsts = [next(iter(policy.make_query_plan("ks", statement(key)))) for _ in range(300)]
    assert replica not in firsts  # 64x: behind its idle peers and the non-replicas (12x)
    assert replica in list(policy.make_query_plan("ks", statement(key)))
    clock.advance_s(policy.config.health.slow_start / 2)
    policy.refresh_health()
    assert 1.0 < stats.health_penalty < 3.0
    clock.advance_s(policy.config.health.slow_start)
    policy.refresh_health()
    assert stats.health_state is HealthState.HEALTHY and stats.health_penalty == 1.0
    firsts = collections.Counter(
        next(iter(policy.make_query_plan("ks", statement(key)))) for _ in range(3000)
    )
    assert 800 < firsts[replica] < 1200


def test_topology_changes_while_iterating_do_not_raise(cluster_3dc):
    policy = populated(cluster_3dc, TokenAwarePolicy(DCAwareRoundRobinPolicy("dc1")))
    key = murmur3_routing_keys(1, seed=11)[0]
    rng = random.Random(0)
    for i in range(300):
        plan = policy.make_query_plan("ks", statement(key))
        first = next(plan)
        victim = rng.choice(cluster_3dc.hosts_by_dc["dc1"])
        action = i % 3
        if action == 0:
            victim.set_down()
            policy.on_down(victim)
        elif action == 1:
            policy.on_remove(victim)
        else:
            new = cluster_3dc.new_host("dc1", "r2", f"127.1.8.{i % 250 + 1}", 4, rng)
            policy.on_add(new)
        rest = list(plan)
        assert first not in rest
        assert len(rest) == len(set(rest))
        victim.set_up()
        policy.on_up(victim)
    assert policy.internal_errors == 0


class ExplodingStats:
    """A stats object whose numbers cannot be read: simulates a bug inside the policy."""

    @property
    def in_flight(self):
        raise RuntimeError("boom")

    health_penalty = 1.0


@pytest.mark.expect_internal_errors
def test_internal_error_falls_back_to_child_plan(cluster_3dc, caplog):
    policy = populated(cluster_3dc, TokenAwarePolicy(DCAwareRoundRobinPolicy("dc1")))
    key = murmur3_routing_keys(1, seed=12)[0]
    for view in policy.topology.local:
        object.__setattr__(view, "stats", ExplodingStats())
    child = TokenAwarePolicy(DCAwareRoundRobinPolicy("dc1"))
    child.populate(cluster_3dc.cluster, cluster_3dc.metadata.all_hosts())
    for _ in range(5):
        plan = list(policy.make_query_plan("ks", statement(key)))
        assert sorted(plan) == sorted(child.make_query_plan("ks", statement(key)))
    assert policy.internal_errors == 5
    logged = [r for r in caplog.records if r.name == "adaptive_lb.policy"]
    assert len(logged) == 1  # at most once a minute


class CountingDCAware(DCAwareRoundRobinPolicy):
    """A user's subclass that counts plans and reverses the order."""

    calls = 0

    def make_query_plan(self, working_keyspace=None, query=None):
        type(self).calls += 1
        return reversed(list(super().make_query_plan(working_keyspace, query)))


@pytest.mark.parametrize("wrap", ["plain", "token_aware"])
def test_child_plan_called_at_most_once(cluster_3dc, wrap):
    inner = CountingDCAware("dc1")
    child = inner if wrap == "plain" else TokenAwarePolicy(inner)
    policy = populated(cluster_3dc, child)
    CountingDCAware.calls = 0
    keys = murmur3_routing_keys(100, seed=13)
    for key in keys:
        list(policy.make_query_plan("ks", statement(key)))
    assert CountingDCAware.calls == len(keys)


def test_stock_token_aware_child_is_looked_through_once(cluster_3dc):
    inner = DCAwareRoundRobinPolicy("dc1")
    calls = []
    original = inner.make_query_plan

    def counted(*args, **kwargs):
        calls.append(1)
        return original(*args, **kwargs)

    inner.make_query_plan = counted
    policy = populated(cluster_3dc, TokenAwarePolicy(inner))
    for key in murmur3_routing_keys(50, seed=14):
        list(policy.make_query_plan("ks", statement(key)))
    assert len(calls) == 50  # stock TokenAwarePolicy would have called it 50 times too, but
    # get_replicas is not paid twice: the cache saw every key once.
    assert policy.replica_cache.misses == 50


def test_target_host_of_default_policy_is_honoured(cluster_3dc):
    child = DefaultLoadBalancingPolicy(TokenAwarePolicy(DCAwareRoundRobinPolicy("dc1")))
    policy = populated(cluster_3dc, child)
    target = cluster_3dc.hosts_by_dc["dc1"][4]
    stmt = statement(murmur3_routing_keys(1, seed=15)[0])
    stmt.target_host = target.address
    for _ in range(20):
        assert next(iter(policy.make_query_plan("ks", stmt))) is target


def test_host_filter_predicate_is_applied_at_plan_time(cluster_3dc):
    banned = set()
    child = HostFilterPolicy(DCAwareRoundRobinPolicy("dc1"), lambda h: h.address not in banned)
    policy = populated(cluster_3dc, child)
    host = cluster_3dc.hosts_by_dc["dc1"][0]
    banned.add(host.address)  # the predicate changes after populate
    for _ in range(100):
        assert host not in list(policy.make_query_plan("ks", statement(b"\x00" * 8)))


def test_works_in_cluster_and_execution_profile(cluster_3dc):
    policy = AdaptiveLoadBalancingPolicy(TokenAwarePolicy(DCAwareRoundRobinPolicy("dc1")))
    profile = ExecutionProfile(load_balancing_policy=policy)
    cluster = Cluster(
        contact_points=["127.0.0.1"],
        protocol_version=4,
        execution_profiles={EXEC_PROFILE_DEFAULT: profile},
    )
    try:
        cluster.profile_manager.populate(cluster_3dc.cluster, cluster_3dc.metadata.all_hosts())
        host = cluster_3dc.hosts_by_dc["dc1"][0]
        assert cluster.profile_manager.distance(host) == HostDistance.LOCAL
        key = murmur3_routing_keys(1, seed=16)[0]
        plan = list(profile.load_balancing_policy.make_query_plan("ks", statement(key)))
        assert set(plan[:3]) == set(local_replicas(cluster_3dc, key))
    finally:
        cluster.shutdown()
    legacy = Cluster(contact_points=["127.0.0.1"], protocol_version=4, load_balancing_policy=policy)
    legacy.shutdown()


def test_rack_penalty_prefers_local_rack():
    model = build_cluster({"dc1": [3, 3, 3]}, replication={"dc1": 3}, seed=3, real_cluster=False)
    config = Config(policy=PolicyConfig(local_rack="r2"))
    policy = populated(model, DCAwareRoundRobinPolicy("dc1"), config)
    firsts = collections.Counter(
        next(iter(policy.make_query_plan(None, None))).rack for _ in range(2000)
    )
    assert set(firsts) == {"r2"}


def test_concurrent_plans_and_topology_events(cluster_3dc):
    policy = populated(cluster_3dc, TokenAwarePolicy(DCAwareRoundRobinPolicy("dc1")))
    keys = murmur3_routing_keys(500, seed=17)
    failures = []
    stop = threading.Event()

    def planner():
        rng = random.Random()
        while not stop.is_set():
            plan = list(policy.make_query_plan("ks", statement(rng.choice(keys))))
            if len(plan) != len(set(plan)):
                failures.append(plan)

    threads = [threading.Thread(target=planner) for _ in range(4)]
    for t in threads:
        t.start()
    rng = random.Random(2)
    for _ in range(300):
        host = rng.choice(cluster_3dc.hosts_by_dc["dc1"])
        policy.on_down(host)
        policy.on_up(host)
    stop.set()
    for t in threads:
        t.join()
    assert not failures
    assert policy.internal_errors == 0


CHILD_FACTORIES = {
    "dcaware": lambda: DCAwareRoundRobinPolicy("dc1"),
    "dcaware_remote": lambda: DCAwareRoundRobinPolicy("dc1", used_hosts_per_remote_dc=2),
    "token_aware": lambda: TokenAwarePolicy(DCAwareRoundRobinPolicy("dc1")),
    "token_aware_shuffle": lambda: TokenAwarePolicy(
        DCAwareRoundRobinPolicy("dc1", used_hosts_per_remote_dc=1), shuffle_replicas=True
    ),
    "host_filter": lambda: HostFilterPolicy(
        DCAwareRoundRobinPolicy("dc1"), lambda h: not h.address.endswith(".2")
    ),
    "default": lambda: DefaultLoadBalancingPolicy(DCAwareRoundRobinPolicy("dc1")),
    "round_robin": RoundRobinPolicy,
    "whitelist": lambda: WhiteListRoundRobinPolicy(["127.1.0.1", "127.1.0.3", "127.2.0.1"]),
    "user_subclass": lambda: CountingDCAware("dc1"),
}
if RackAwareRoundRobinPolicy is not None:
    CHILD_FACTORIES["rack_aware"] = lambda: RackAwareRoundRobinPolicy("dc1", "r1", 1)
    CHILD_FACTORIES["token_rack_aware"] = lambda: TokenAwarePolicy(
        RackAwareRoundRobinPolicy("dc1", "r2", 0)
    )


def test_decisions_are_counted_by_position(cluster_3dc):
    policy = populated(cluster_3dc, TokenAwarePolicy(DCAwareRoundRobinPolicy("dc1")))
    key = murmur3_routing_keys(1, seed=40)[0]
    for _ in range(10):
        list(policy.make_query_plan("ks", statement(key)))
    for _ in range(5):
        next(iter(policy.make_query_plan("ks", SimpleStatement("SELECT now() FROM t"))))
    for replica in local_replicas(cluster_3dc, key):
        policy.stats.get(replica).in_flight = 100
    for _ in range(3):
        next(iter(policy.make_query_plan("ks", statement(key))))
    counts = policy.decisions_by_position
    assert counts == {"replica": 10, "non_replica": 3, "local": 5, "child": 0, "fallback": 0}
