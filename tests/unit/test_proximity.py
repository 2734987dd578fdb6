"""Rack proximity: the pure rule, and its effect on real plans (real driver Host / Metadata /
TokenMap objects, statistics fed on a manual clock)."""

from __future__ import annotations

import collections

import pytest
from cassandra.policies import DCAwareRoundRobinPolicy, TokenAwarePolicy
from cassandra.query import SimpleStatement

from adaptive_lb import AdaptiveLoadBalancingPolicy, Config
from adaptive_lb.config import HealthConfig, PolicyConfig
from adaptive_lb.core.clock import ManualClock
from adaptive_lb.health.model import HealthState
from adaptive_lb.plan.locality import rack_proximity
from adaptive_lb.tools.sim.driver_topology import build_cluster, murmur3_routing_keys

MS = 1_000_000


def test_factor_is_the_ratio_to_the_nearest_remote_rack():
    factors = rack_proximity({"b": [0.0019, 0.0020, 0.0021], "c": [0.0008]}, {}, cap=4.0)
    assert factors == {"b": pytest.approx(2.5), "c": 1.0}


def test_factor_is_capped_and_never_below_one():
    factors = rack_proximity({"b": [0.010], "c": [0.001], "d": [0.0015]}, {}, cap=4.0)
    assert factors == {"b": 4.0, "c": 1.0, "d": pytest.approx(1.5)}


def test_one_slow_host_does_not_move_its_rack():
    factors = rack_proximity({"b": [0.001, 0.001, 0.001, 0.050], "c": [0.001]}, {}, cap=4.0)
    assert factors["b"] == pytest.approx(1.0)


def test_unmeasured_racks_keep_what_was_learned():
    previous = {"b": 2.5, "c": 1.0}
    # b got too few requests this window (it was avoided): its factor stays.
    assert rack_proximity({"c": [0.0008], "d": [0.0016]}, previous, cap=4.0) == {
        "b": 2.5,
        "c": 1.0,
        "d": pytest.approx(2.0),
    }
    # Only one rack measured: nothing to compare with, every factor stays.
    assert rack_proximity({"c": [0.005]}, previous, cap=4.0) == previous
    # A lower cap applies to what was learned too.
    assert rack_proximity({}, previous, cap=2.0) == {"b": 2.0, "c": 1.0}


def test_cap_one_turns_it_off():
    assert rack_proximity({"b": [0.002], "c": [0.001]}, {"d": 3.0}, cap=1.0) == {
        "b": 1.0,
        "c": 1.0,
        "d": 1.0,
    }


def _policy(cap: float) -> tuple[AdaptiveLoadBalancingPolicy, object, ManualClock]:
    """Nine hosts in racks r1..r3 of dc1 (RF 3: one replica per rack), the client in r1;
    measured p50s: r1 0.5 ms, r2 1 ms, r3 2.5 ms (all HEALTHY: below the SLOW threshold)."""
    clock = ManualClock(0)
    model = build_cluster({"dc1": [3, 3, 3]}, replication={"dc1": 3}, seed=3, real_cluster=False)
    config = Config(
        policy=PolicyConfig(local_rack="r1", rack_proximity_cap=cap),
        health=HealthConfig(min_samples=20),
    )
    policy = AdaptiveLoadBalancingPolicy(
        TokenAwarePolicy(DCAwareRoundRobinPolicy("dc1")), config, clock=clock
    )
    policy.populate(model.cluster, model.metadata.all_hosts())
    latency_ms = {"r1": 0.5, "r2": 1.0, "r3": 2.5}
    for host in model.metadata.all_hosts():
        stats = policy.stats.get(host)
        for _ in range(30):
            stats.on_send()
            stats.on_success(int(latency_ms[host.rack] * MS))
    clock.advance_s(0.5)
    policy.refresh_health()
    assert {policy.stats.get(h).health_state for h in model.metadata.all_hosts()} == {
        HealthState.HEALTHY
    }
    return policy, model, clock


def _replicas_by_rack(policy, model, key: bytes) -> dict[str, object]:
    replicas = model.metadata.get_replicas("ks", key)
    return {host.rack: host for host in replicas}


def test_remote_racks_are_weighed_by_distance_after_a_refresh():
    policy, model, _ = _policy(cap=4.0)
    penalties = {h.rack: policy.stats.get(h).rack_penalty for h in model.metadata.all_hosts()}
    assert penalties["r1"] == 1.0
    assert penalties["r2"] == pytest.approx(4.0)
    assert penalties["r3"] == pytest.approx(10.0, rel=0.05)
    by_address = {h.address: h for h in policy.snapshot().hosts}
    for host in model.metadata.all_hosts():
        assert by_address[host.address].rack_penalty == policy.stats.get(host).rack_penalty


def test_the_nearer_remote_replica_takes_over_from_an_unhealthy_local_one():
    policy, model, _ = _policy(cap=4.0)
    firsts = collections.Counter()
    for key in murmur3_routing_keys(200, seed=5):
        replicas = _replicas_by_rack(policy, model, key)
        policy.stats.get(replicas["r1"]).health_penalty = 64.0
        stmt = SimpleStatement("SELECT 1", routing_key=key, keyspace="ks")
        firsts[next(iter(policy.make_query_plan("ks", stmt))).rack] += 1
        policy.stats.get(replicas["r1"]).health_penalty = 1.0
    assert firsts == {"r2": 200}


def test_proximity_is_a_weight_not_an_exclusion():
    policy, model, _ = _policy(cap=4.0)
    key = murmur3_routing_keys(1, seed=6)[0]
    replicas = _replicas_by_rack(policy, model, key)
    policy.stats.get(replicas["r1"]).health_penalty = 64.0
    # The near replica busy: 3 in flight -> (3 + 1) x 4 = 16 > (0 + 1) x 10.
    for _ in range(3):
        policy.stats.get(replicas["r2"]).on_send()
    stmt = SimpleStatement("SELECT 1", routing_key=key, keyspace="ks")
    plan = list(policy.make_query_plan("ks", stmt))
    assert plan[0] is replicas["r3"]
    in_plan = [h.rack for h in plan if h in replicas.values()]
    assert in_plan == ["r3", "r2", "r1"]


def test_without_proximity_the_remote_racks_share_alike():
    policy, model, _ = _policy(cap=1.0)
    assert {policy.stats.get(h).rack_penalty for h in model.metadata.all_hosts()} == {1.0, 4.0}
    key = murmur3_routing_keys(1, seed=7)[0]
    replicas = _replicas_by_rack(policy, model, key)
    policy.stats.get(replicas["r1"]).health_penalty = 64.0
    stmt = SimpleStatement("SELECT 1", routing_key=key, keyspace="ks")
    firsts = collections.Counter(
        next(iter(policy.make_query_plan("ks", stmt))).rack for _ in range(4000)
    )
    assert set(firsts) == {"r2", "r3"}
    assert abs(firsts["r2"] - firsts["r3"]) < 400


def test_a_config_reload_keeps_the_learned_factors():
    policy, model, _ = _policy(cap=4.0)
    policy.reload(
        Config(
            policy=PolicyConfig(local_rack="r1", non_local_rack_penalty=2.0),
            health=HealthConfig(min_samples=20),
        )
    )
    penalties = {h.rack: policy.stats.get(h).rack_penalty for h in model.metadata.all_hosts()}
    assert penalties["r2"] == pytest.approx(2.0)
    assert penalties["r3"] == pytest.approx(5.0, rel=0.05)
