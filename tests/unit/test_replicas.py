"""Replica resolution and its cache against the driver's own answers."""

from __future__ import annotations

import inspect

import pytest
from cassandra.cqltypes import Int32Type
from cassandra.metadata import KeyspaceMetadata
from cassandra.policies import DCAwareRoundRobinPolicy, TokenAwarePolicy
from cassandra.protocol import ColumnMetadata
from cassandra.query import PreparedStatement, SimpleStatement

from adaptive_lb import AdaptiveLoadBalancingPolicy
from adaptive_lb.plan._driver_policies import tablets_of
from adaptive_lb.tools.sim.driver_topology import build_cluster, murmur3_routing_keys


def populated(model, child):
    policy = AdaptiveLoadBalancingPolicy(child)
    policy.populate(model.cluster, model.metadata.all_hosts())
    return policy


def test_resolution_matches_metadata_get_replicas():
    model = build_cluster({"dc1": [3, 3, 3], "dc2": [2, 2]}, vnodes=16, seed=21, real_cluster=False)
    policy = populated(model, DCAwareRoundRobinPolicy("dc1"))
    resolver = policy._resolver
    topology = policy.topology
    for key in [*murmur3_routing_keys(5000, seed=22), b"", b"\x00", b"\xff" * 8]:
        views, _ = resolver.replicas("ks", key, None, topology)
        expected = [h for h in model.metadata.get_replicas("ks", key) if h.datacenter == "dc1"]
        assert [v.host for v in views] == expected


def test_replication_change_without_new_token_map_is_seen():
    model = build_cluster({"dc1": [2, 2, 2]}, replication={"dc1": 1}, seed=23, real_cluster=False)
    policy = populated(model, DCAwareRoundRobinPolicy("dc1"))
    keys = murmur3_routing_keys(20, seed=24)
    for key in keys:
        views, _ = policy._resolver.replicas("ks", key, None, policy.topology)
        assert len(views) == 1
    # ALTER KEYSPACE: the driver rebuilds that keyspace's replica map in place. Relies on
    # Metadata._keyspace_updated (cassandra-driver and scylla-driver): what the driver calls
    # after refreshing a keyspace's metadata.
    model.metadata.keyspaces["ks"] = KeyspaceMetadata(
        "ks", True, "NetworkTopologyStrategy", {"dc1": "3"}
    )
    model.metadata._keyspace_updated("ks")
    for key in keys:
        views, _ = policy._resolver.replicas("ks", key, None, policy.topology)
        assert [v.host for v in views] == model.metadata.get_replicas("ks", key)


def prepared(is_lwt: bool = False) -> PreparedStatement:
    """A real PreparedStatement for ``SELECT v FROM ks.t WHERE k = ?`` (k int), as the driver
    builds it from a PREPARE response.

    Relies on the drivers' positional ``PreparedStatement.__init__`` arguments (column
    metadata, query id, routing key indexes, query, keyspace, protocol version, result
    metadata, result metadata id); ``is_lwt`` only where the driver has it (scylla-driver
    3.29.6 and later; not cassandra-driver 3.29-3.30)."""
    columns = [ColumnMetadata("ks", "t", "k", Int32Type)]
    args = [columns, b"id", [0], "SELECT v FROM ks.t WHERE k = ?", "ks", 4, [], None]
    kwargs = {}
    if "is_lwt" in inspect.signature(PreparedStatement.__init__).parameters:
        kwargs["is_lwt"] = is_lwt
    elif is_lwt:
        pytest.skip("this driver's PreparedStatement has no LWT flag")
    return PreparedStatement(*args, **kwargs)


def test_bound_statement_is_routed_to_its_replicas():
    model = build_cluster({"dc1": [2, 2, 2], "dc2": [3]}, seed=25)
    try:
        policy = populated(model, TokenAwarePolicy(DCAwareRoundRobinPolicy("dc1")))
        statement = prepared()
        for k in range(300):
            bound = statement.bind((k,))
            plan = list(policy.make_query_plan(None, bound))
            replicas = [
                h
                for h in model.metadata.get_replicas("ks", bound.routing_key)
                if h.datacenter == "dc1"
            ]
            assert set(plan[:3]) == set(replicas)
            assert sorted(plan) == sorted(model.hosts_by_dc["dc1"])
    finally:
        model.shutdown()


def test_lwt_prepared_statement_gets_ring_order():
    statement = prepared(is_lwt=True)
    model = build_cluster({"dc1": [2, 2, 2]}, seed=26, real_cluster=False)
    policy = populated(model, TokenAwarePolicy(DCAwareRoundRobinPolicy("dc1")))
    bound = statement.bind((42,))
    replicas = model.metadata.get_replicas("ks", bound.routing_key)
    for host in replicas:
        policy.stats.get(host).in_flight = 0
    policy.stats.get(replicas[0]).in_flight = 100
    plans = {tuple(list(policy.make_query_plan(None, bound))[:3]) for _ in range(100)}
    assert plans == {tuple(replicas)}


def test_statement_without_keyspace_uses_working_keyspace():
    model = build_cluster({"dc1": [2, 2, 2]}, seed=27, real_cluster=False)
    policy = populated(model, DCAwareRoundRobinPolicy("dc1"))
    key = murmur3_routing_keys(1, seed=28)[0]
    stmt = SimpleStatement("SELECT v FROM t WHERE k = %s", routing_key=key)
    replicas = set(model.metadata.get_replicas("ks", key))
    for _ in range(50):
        assert set(list(policy.make_query_plan("ks", stmt))[:3]) == replicas
    # Unknown keyspace: no replicas, plain least-loaded order over the local hosts.
    plan = list(policy.make_query_plan("nope", stmt))
    assert sorted(plan) == sorted(model.hosts)


def test_tablet_replicas_are_used_and_not_cached():
    tablets_module = pytest.importorskip(
        "cassandra.tablets", reason="tablets exist only in scylla-driver"
    )
    model = build_cluster({"dc1": [2, 2, 2]}, seed=29, real_cluster=False)
    policy = populated(model, TokenAwarePolicy(DCAwareRoundRobinPolicy("dc1")))
    hosts = model.hosts_by_dc["dc1"]
    # Two tablets splitting the ring, each on two hosts that are NOT the vnode replicas' order.
    low = tablets_module.Tablet.from_row(
        -(2**63), 0, [(hosts[0].host_id, 0), (hosts[1].host_id, 1)]
    )
    high = tablets_module.Tablet.from_row(
        0, 2**63 - 1, [(hosts[4].host_id, 0), (hosts[5].host_id, 3)]
    )
    # scylla-driver's Tablet.from_row and Tablets.add_tablet: how the driver fills its tablet
    # map from a tablets-routing-v1 payload; the map is where tablets_of finds it (pinned in
    # test_driver_contract).
    tablets = tablets_of(model.metadata)
    tablets.add_tablet("ks", "t", low)
    tablets.add_tablet("ks", "t", high)
    token_of = model.metadata.token_map.token_class.from_key
    misses = policy.replica_cache.misses
    for key in murmur3_routing_keys(200, seed=30):
        stmt = SimpleStatement("SELECT v FROM ks.t WHERE k = ?", routing_key=key, keyspace="ks")
        stmt.table = "t"
        expected = {hosts[0], hosts[1]} if token_of(key).value <= 0 else {hosts[4], hosts[5]}
        plan = list(policy.make_query_plan("ks", stmt))
        assert set(plan[:2]) == expected
        assert sorted(plan) == sorted(hosts)
    assert policy.replica_cache.misses == misses  # tablets never go through the cache
    assert len(policy.replica_cache) == 0
