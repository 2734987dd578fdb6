"""Smoke test: the real driver against a simulated 3 DC x 3 node cluster (racks r1..r3).

Proves the Simulacron fixture gives what policy integration tests need: a topology with DCs and
racks, a keyspace with NetworkTopologyStrategy so token-aware routing has replicas, prepared
statements answered from primes, per-node delays, and per-node errors the driver retries on
another host. Works with cassandra-driver and scylla-driver; no ``adaptive_lb`` import.
"""

from __future__ import annotations

import statistics
import struct
import time
from collections import defaultdict
from collections.abc import Iterator
from typing import Any

import pytest
from cassandra.cluster import Cluster, Session
from cassandra.policies import DCAwareRoundRobinPolicy, TokenAwarePolicy
from cassandra.query import PreparedStatement

from tests.integration.simulacron import Simulacron, connect_driver, wait_for_pools

pytestmark = pytest.mark.integration

CLUSTER = "smoke"
RACKS = ["r1", "r2", "r3"]
QUERY = "SELECT v FROM ks.t WHERE k = ?"
PRIME_ROWS: dict[str, Any] = {
    "rows": [{"v": 42}],
    "column_types": {"v": "int"},
    "param_types": {"k": "int"},
}


@pytest.fixture(scope="module")
def nodes(simulacron: Simulacron) -> Iterator[dict[str, list[str]]]:
    """The 3 x 3 cluster with keyspace ``ks`` (NTS 2/2/2) and ``QUERY`` primed everywhere."""
    created = simulacron.create_cluster(CLUSTER, [RACKS] * 3)
    try:
        simulacron.prime_keyspace("ks", {"dc1": 2, "dc2": 2, "dc3": 2})
        simulacron.prime(QUERY, **PRIME_ROWS)
        yield created
    finally:
        simulacron.remove_cluster(CLUSTER)


@pytest.fixture(scope="module")
def driver(nodes: dict[str, list[str]]) -> Iterator[tuple[Cluster, Session, PreparedStatement]]:
    """One connected driver (TokenAware(DCAware("dc1"))) and the prepared ``QUERY``."""
    t0 = time.perf_counter()
    cluster, session = connect_driver(
        [nodes["dc1"][0]], TokenAwarePolicy(DCAwareRoundRobinPolicy("dc1"))
    )
    try:
        print(f"\ndriver connected in {time.perf_counter() - t0:.2f} s")
        # Routing is judged on a settled driver: every dc1 host up with an open pool.
        assert wait_for_pools(session, "dc1"), session.get_pool_state()
        yield cluster, session, session.prepare(QUERY)
    finally:
        cluster.shutdown()


def _run(session: Session, stmt: PreparedStatement, keys: range) -> list[tuple[Any, float]]:
    """Execute ``stmt`` once per key; return (response future, latency in ms) per request."""
    out = []
    for k in keys:
        t0 = time.perf_counter()
        rs = session.execute(stmt, [k])
        elapsed = (time.perf_counter() - t0) * 1000.0
        assert rs.one().v == 42
        out.append((rs.response_future, elapsed))
    return out


def test_simulacron_started(simulacron: Simulacron) -> None:
    print(
        f"\nsimulacron: startup {simulacron.startup_seconds:.2f} s, fine timer "
        f"{simulacron.fine_timer}, nodes from {simulacron.node_ip}, REST {simulacron.base_url}"
    )
    assert simulacron.startup_seconds is not None and simulacron.startup_seconds < 30


def test_topology_and_replicas(
    nodes: dict[str, list[str]], driver: tuple[Cluster, Session, PreparedStatement]
) -> None:
    cluster, _, _ = driver
    hosts = cluster.metadata.all_hosts()
    assert len(hosts) == 9
    expected = {ip: (dc, RACKS[i]) for dc, ips in nodes.items() for i, ip in enumerate(ips)}
    assert {h.address: (h.datacenter, h.rack) for h in hosts} == expected
    # dc1 hosts have pools (UP); remote DCs are IGNORED by DCAware(dc1): state unknown (None).
    assert all(h.is_up for h in hosts if h.datacenter == "dc1")
    assert all(h.is_up is not False for h in hosts)

    assert "ks" in cluster.metadata.keyspaces
    for k in range(20):
        replicas = cluster.metadata.get_replicas("ks", struct.pack(">i", k))
        per_dc = defaultdict(int)
        for h in replicas:
            per_dc[h.datacenter] += 1
        assert dict(per_dc) == {"dc1": 2, "dc2": 2, "dc3": 2}


def test_token_aware_routing_stays_in_dc1(
    nodes: dict[str, list[str]], driver: tuple[Cluster, Session, PreparedStatement]
) -> None:
    cluster, session, stmt = driver
    results = _run(session, stmt, range(200))
    coordinators = defaultdict(int)
    for future, _ in results:
        host = future.coordinator_host
        coordinators[host.address] += 1
        assert host.datacenter == "dc1"
        # Token-aware: the coordinator is a replica of the key (RF 2 of 3 nodes in dc1).
        replicas = cluster.metadata.get_replicas("ks", future.query.routing_key)
        assert host in replicas
    latencies = sorted(ms for _, ms in results)
    print(
        f"\n200 requests: coordinators {dict(coordinators)}, p50 "
        f"{statistics.median(latencies):.2f} ms, max {latencies[-1]:.2f} ms"
    )
    assert set(coordinators) <= set(nodes["dc1"])
    assert len(coordinators) >= 2


def _latency_by_node(results: list[tuple[Any, float]]) -> dict[str, list[float]]:
    by_node: dict[str, list[float]] = defaultdict(list)
    for future, ms in results:
        by_node[future.coordinator_host.address].append(ms)
    return {ip: sorted(v) for ip, v in by_node.items()}


@pytest.mark.parametrize("delay_ms", [100, 20])
def test_delayed_node_is_slow_alone(
    simulacron: Simulacron,
    nodes: dict[str, list[str]],
    driver: tuple[Cluster, Session, PreparedStatement],
    delay_ms: int,
) -> None:
    if delay_ms < 100 and not simulacron.fine_timer:
        pytest.skip("delays under 100 ms need the fine-timer launcher")
    _, session, stmt = driver
    slow = ("dc1", "node2")
    slow_ip = nodes["dc1"][1]
    simulacron.clear_primes(slow)
    simulacron.prime(QUERY, **PRIME_ROWS, delay_ms=delay_ms, scope=slow)
    try:
        by_node = _latency_by_node(_run(session, stmt, range(60)))
    finally:
        simulacron.clear_primes(slow)
    summary = {
        ip: f"n={len(v)} min={v[0]:.1f} p50={statistics.median(v):.1f} max={v[-1]:.1f}"
        for ip, v in by_node.items()
    }
    print(f"\ndelay {delay_ms} ms on {slow_ip}: {summary}")
    assert by_node.get(slow_ip), "no request reached the delayed node"
    assert by_node[slow_ip][0] >= delay_ms * 0.9
    if delay_ms < 100:
        assert statistics.median(by_node[slow_ip]) < delay_ms + 30
    for ip, lat in by_node.items():
        if ip != slow_ip:
            assert statistics.median(lat) < delay_ms * 0.5, (ip, lat)


def test_overloaded_node_is_retried_on_next_host(
    simulacron: Simulacron,
    nodes: dict[str, list[str]],
    driver: tuple[Cluster, Session, PreparedStatement],
) -> None:
    _, session, stmt = driver
    bad = ("dc1", "node1")
    bad_ip = nodes["dc1"][0]
    simulacron.clear_primes(bad)
    simulacron.prime_error(QUERY, "overloaded", scope=bad, param_types={"k": "int"})
    try:
        results = _run(session, stmt, range(60))
    finally:
        simulacron.clear_primes(bad)
    retried = [f for f, _ in results if len(f.attempted_hosts) >= 2]
    print(f"\noverloaded {bad_ip}: {len(retried)}/60 requests retried on another host")
    assert retried, "no request hit the overloaded node first"
    for future in retried:
        assert future.attempted_hosts[0].address == bad_ip
    assert all(f.coordinator_host.address != bad_ip for f, _ in results)


def test_clearing_one_node_keeps_the_other_node_primes(
    simulacron: Simulacron,
    nodes: dict[str, list[str]],
    driver: tuple[Cluster, Session, PreparedStatement],
) -> None:
    """``clear_primes((dc, node))`` clears only that node (the DC's other primes are replayed)."""
    _, session, stmt = driver
    simulacron.prime(QUERY, **PRIME_ROWS, delay_ms=100, scope=("dc1", "node1"))
    simulacron.prime(QUERY, **PRIME_ROWS, delay_ms=100, scope=("dc1", "node2"))
    try:
        simulacron.clear_primes(("dc1", "node2"))
        by_node = _latency_by_node(_run(session, stmt, range(30)))
    finally:
        simulacron.clear_primes("dc1")
    assert by_node[nodes["dc1"][0]][0] >= 90
    assert statistics.median(by_node[nodes["dc1"][1]]) < 50


def _wait_for(predicate: Any, timeout: float) -> float:
    """Poll ``predicate`` every 50 ms; return the seconds it took (fail after ``timeout``)."""
    t0 = time.monotonic()
    while not predicate():
        if time.monotonic() - t0 > timeout:
            pytest.fail(f"condition not met within {timeout} s")
        time.sleep(0.05)
    return time.monotonic() - t0


def test_take_down_and_rebind_a_node(
    simulacron: Simulacron,
    nodes: dict[str, list[str]],
    driver: tuple[Cluster, Session, PreparedStatement],
) -> None:
    cluster, session, stmt = driver
    ip = nodes["dc1"][2]
    host = next(h for h in cluster.metadata.all_hosts() if h.address == ip)
    keys = iter(range(10**6))
    simulacron.take_down(*simulacron.scope_of(ip))
    try:
        # An idle pool only notices the closed connection at its next use (or heartbeat, 30 s),
        # so keep requests flowing until the driver marks the host DOWN.
        down_s = _wait_for(
            lambda: (
                bool(_run(session, stmt, range(next(keys), next(keys) + 1))) and host.is_up is False
            ),
            timeout=10,
        )
        results = _run(session, stmt, range(30))
        assert all(f.coordinator_host.address != ip for f, _ in results)
    finally:
        simulacron.rebind(*simulacron.scope_of(ip))
    up_s = _wait_for(lambda: host.is_up is True, timeout=10)
    print(f"\n{ip} marked DOWN after {down_s:.2f} s, UP again {up_s:.2f} s after rebind")
