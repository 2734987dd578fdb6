"""The server's own view of its load (issue 24 item 3) against the real 3-node Cassandra
5.0 cluster of ``test_real_cassandra``: the client reads every node's real
``system_views.thread_pools``; a second client *process*, which this client cannot see,
loads one node with full-table counts, and that node's queues reach this client's scores.

It reuses the keyspace ``test_real_cassandra`` leaves (``ks.t``, RF 2) when that module ran
first in the session, and makes it otherwise: no second 1,000-row load in the tier."""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Iterator
from typing import Any

import attrs
import pytest
from cassandra import ConsistencyLevel
from cassandra.concurrent import execute_concurrent_with_args
from cassandra.policies import DCAwareRoundRobinPolicy, TokenAwarePolicy

from adaptive_lb import AdaptiveLoadBalancingPolicy, instrument
from adaptive_lb.config import ServerLoadConfig
from adaptive_lb.stats.fleet import FIRST_CLIENTS_READ_S
from adaptive_lb.stats.server_load import WATCHED_POOLS
from adaptive_lb.tools.peers.connect import connect_driver
from tests.integration.cassandra import CassandraCluster
from tests.integration.test_real_cassandra import (
    FAST_NO_RACK,
    REQUEST_TIMEOUT,
    ROWS,
    SELECT,
    BackgroundLoad,
    attempts,
    wait_for,
)

pytestmark = pytest.mark.integration

# Every request tracked (samples_per_host 0): the user counts compare exactly with the
# attempts the test saw, which the reads must be in none of.
READS = attrs.evolve(
    FAST_NO_RACK,
    tracking=attrs.evolve(FAST_NO_RACK.tracking, samples_per_host=0),
    health=attrs.evolve(
        FAST_NO_RACK.health,
        # threshold 0: any excess counts, so that a moderate queue on two shared cores
        # shows in the factor (the random threshold is the unit tests' and Simulacron's).
        server_load=ServerLoadConfig(interval=0.5, half_life=1.0, threshold=0.0),
    ),
)


@pytest.fixture(scope="module")
def table(cassandra_cluster: CassandraCluster) -> Iterator[CassandraCluster]:
    """``ks.t`` with ROWS rows: the one ``test_real_cassandra`` made, else made here."""
    cluster, session = connect_driver(
        cassandra_cluster.addresses[:1],
        TokenAwarePolicy(DCAwareRoundRobinPolicy("dc1")),
        request_timeout=20.0,
        connect_timeout=5.0,
    )
    try:
        session.execute(
            "CREATE KEYSPACE IF NOT EXISTS ks WITH replication = "
            "{'class': 'NetworkTopologyStrategy', 'dc1': 2}"
        )
        session.execute("CREATE TABLE IF NOT EXISTS ks.t (k int PRIMARY KEY, v int)")
        wait = getattr(session, "wait_for_schema_agreement", None)
        wait = wait or cluster.control_connection.wait_for_schema_agreement
        assert wait(wait_time=30), "no schema agreement"
        if session.execute("SELECT k FROM ks.t LIMIT 1").one() is None:
            insert = session.prepare("INSERT INTO ks.t (k, v) VALUES (?, ?)")
            insert.consistency_level = ConsistencyLevel.ALL
            rows = [(k, k * 10) for k in range(ROWS)]
            assert all(ok for ok, _ in execute_concurrent_with_args(session, insert, rows))
    finally:
        cluster.shutdown()
    yield cassandra_cluster


# The other client: its own process and driver, every request pinned to one node.
OTHER_CLIENT = """
import sys, threading, time
from cassandra.policies import WhiteListRoundRobinPolicy
from cassandra.query import SimpleStatement
from adaptive_lb.tools.peers.connect import connect_driver

address, seconds, concurrency = sys.argv[1], float(sys.argv[2]), int(sys.argv[3])
cluster, session = connect_driver(
    [address], WhiteListRoundRobinPolicy([address]), request_timeout=20.0, connect_timeout=5.0
)
# The server scans every row and the client decodes one: the server's load, not the
# client's CPU, is what this process makes.
scan = SimpleStatement("SELECT count(*) FROM ks.t")
done = []
deadline = time.monotonic() + seconds

def client():
    while time.monotonic() < deadline:
        try:
            session.execute(scan)
            done.append(1)
        except Exception:
            pass

threads = [threading.Thread(target=client) for _ in range(concurrency)]
print("loading", flush=True)
for thread in threads:
    thread.start()
for thread in threads:
    thread.join()
print(f"scans {len(done)}", flush=True)
cluster.shutdown()
"""


def test_real_thread_pools_show_another_clients_load(table: CassandraCluster) -> None:
    policy = AdaptiveLoadBalancingPolicy(TokenAwarePolicy(DCAwareRoundRobinPolicy("dc1")), READS)
    cluster, session = connect_driver(
        table.addresses[:1], policy, request_timeout=REQUEST_TIMEOUT, connect_timeout=5.0
    )
    try:
        instrument(session)
        stmt = session.prepare(SELECT)
        stmt.is_idempotent = True  # connection errors are retried on the next host
        check_reads(policy, session, stmt)
    finally:
        cluster.shutdown()


def check_reads(policy: AdaptiveLoadBalancingPolicy, session: Any, stmt: Any) -> None:
    """Every node's pools are read; the scanned node's queue reaches this client's score."""
    views = {view.host.address: view for view in policy.topology.local}
    # The first reads wait for the fleet's size (its clients read, within FIRST_CLIENTS_READ_S).
    assert wait_for(
        lambda: all(v.stats.load.answered for v in views.values()), 5.0 + FIRST_CLIENTS_READ_S
    ), {a: (v.stats.load.supported, v.stats.load.unsupported_reason) for a, v in views.items()}
    idle = {a: (v.stats.load.raw, v.stats.load.pool) for a, v in views.items()}
    rtt_ms = {a: round((v.stats.load.last_latency_s or 0) * 1000, 2) for a, v in views.items()}
    loaded = sorted(views)[2]  # not the contact point
    other = subprocess.Popen(
        [sys.executable, "-c", OTHER_CLIENT, loaded, "6", "32"],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert other.stdout is not None and other.stdout.readline().strip() == "loading"
        started = time.monotonic()
        load = BackgroundLoad(session, lambda i: (stmt, [i % 1000]), concurrency=4).start()
        peak: dict[str, float] = dict.fromkeys(views, 0.0)
        factors: dict[str, float] = dict.fromkeys(views, 1.0)
        while time.monotonic() - started < 5.0:
            for address, view in views.items():
                peak[address] = max(peak[address], view.stats.load.raw or 0.0)
                factors[address] = max(factors[address], view.stats.server_load)
            time.sleep(0.1)
        requests = load.stop()
        scans = other.communicate(timeout=30)[0].strip()
    finally:
        if other.poll() is None:
            other.kill()
            other.wait()
    counts = attempts(requests)
    records = {a: v.stats.load for a, v in views.items()}
    reads = {a: r.sent for a, r in records.items()}
    print(
        f"\nidle pressure {idle}, read round trip (ms) {rtt_ms}; another process scanning "
        f"through {loaded} ({scans}): peak pressure {peak}, peak factor {factors}, pool "
        f"{records[loaded].pool}; this client's attempts {dict(counts)}; reads {reads}"
    )
    for address, record in records.items():
        assert record.supported is True and record.pool in WATCHED_POOLS, address
        # A read may time out while its node is busy (0.5 s, two shared cores): it is
        # dropped, and the last reading ages out.
        assert record.answered >= 3, (address, record.failed)
    # The other process's queue on its node is seen here, and weighs in this client's score.
    assert peak[loaded] > max(p for a, p in peak.items() if a != loaded), peak
    assert factors[loaded] > 1.0, factors
    for address, view in views.items():
        assert view.stats.requests_total == counts[address]  # the reads are no user requests
    assert policy.internal_errors == 0
