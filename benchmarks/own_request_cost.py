"""What adaptive-lb's own requests cost a real Cassandra node (issue 34): a probe, a
thread-pools read and a clients-table read, beside a user's single-row read.

    python benchmarks/own_request_cost.py                 # ~1.5 min with the jars cached
    python benchmarks/own_request_cost.py --requests 500 --extra-clients 10

Starts one real Apache Cassandra 5.0 node (``tests/integration/cassandra.py``, at
127.0.4.1, SIGKILLed by PID when done), writes 1,000 rows to ``ks.t`` (RF 1), opens
``--extra-clients`` more driver sessions (so the clients table lists that many more
connections), then sends each kind of request ``--requests`` times one after another, as
the prober sends them (unprepared, consistency ONE, to that node): the client's round trip
(p50, p99) and the node's CPU per request (the JVM's user + system time from /proc over
the run, less its idle rate measured just before, over the number of requests). The clients
table resolves each distinct client address's host name per read: here every client is
127.0.0.1 (one lookup in /etc/hosts), the cheapest case. ``--record`` writes the figures to
docs/figures.json (``own_request_cost/<driver>``).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import figures
from cassandra import ConsistencyLevel
from cassandra.policies import DCAwareRoundRobinPolicy
from cassandra.query import SimpleStatement

from adaptive_lb.health.probes import PROBE_QUERY
from adaptive_lb.stats.fleet import CASSANDRA_CLIENTS_QUERY
from adaptive_lb.stats.server_load import THREAD_POOLS_QUERY
from adaptive_lb.tools.peers.connect import connect_driver
from tests.integration.cassandra import CassandraCluster

KINDS = {
    "user": "SELECT v FROM ks.t WHERE k = {k}",
    "probe": PROBE_QUERY,
    "thread_pools": THREAD_POOLS_QUERY,
    "clients": CASSANDRA_CLIENTS_QUERY,
}
TICK_S = 1.0 / os.sysconf("SC_CLK_TCK")


def cpu_s(pid: int) -> float:
    """The process's user + system CPU time so far, seconds."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) * TICK_S


def measure(session: object, host: object, query: str, requests: int, pid: int) -> dict:
    """Round trips (ms) and the node's CPU per request (us) of ``requests`` sequential
    requests of ``query`` to ``host``."""
    idle_before = cpu_s(pid)
    time.sleep(3.0)
    idle_rate = (cpu_s(pid) - idle_before) / 3.0
    latencies = []
    began_cpu, began = cpu_s(pid), time.monotonic()
    for i in range(requests):
        statement = SimpleStatement(
            query.format(k=i % 1000), consistency_level=ConsistencyLevel.ONE
        )
        sent = time.perf_counter()
        rows = session.execute(statement, host=host)  # type: ignore[attr-defined]
        latencies.append((time.perf_counter() - sent) * 1000)
        count = len(list(rows))
    elapsed = time.monotonic() - began
    busy = cpu_s(pid) - began_cpu - idle_rate * elapsed
    latencies.sort()
    return {
        "p50_ms": round(statistics.median(latencies), 3),
        "p99_ms": round(latencies[int(0.99 * len(latencies))], 3),
        "cpu_us": round(max(0.0, busy) / requests * 1e6, 1),
        "rows": count,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=2000, help="per kind (2000)")
    parser.add_argument("--extra-clients", type=int, default=20, help="more sessions (20)")
    figures.add_record_option(parser)
    args = parser.parse_args()
    node = CassandraCluster(1, address_prefix="127.0.4.", cluster_name="alb-cost")
    clusters = []
    results = {}
    try:
        node.start()
        pid = node.pid(1)
        assert pid is not None
        policy = DCAwareRoundRobinPolicy("dc1")
        cluster, session = connect_driver(node.addresses, policy, request_timeout=10.0)
        clusters.append(cluster)
        session.execute(
            "CREATE KEYSPACE IF NOT EXISTS ks WITH replication = "
            "{'class': 'SimpleStrategy', 'replication_factor': 1}"
        )
        session.execute("CREATE TABLE IF NOT EXISTS ks.t (k int PRIMARY KEY, v int)")
        insert = session.prepare("INSERT INTO ks.t (k, v) VALUES (?, ?)")
        for k in range(1000):
            session.execute(insert, (k, k))
        for _ in range(args.extra_clients):
            clusters.append(connect_driver(node.addresses, DCAwareRoundRobinPolicy("dc1"))[0])
        host = next(iter(cluster.metadata.all_hosts()))
        for kind, query in KINDS.items():
            measure(session, host, query, 200, pid)  # warm up: JIT, caches
            results[kind] = measure(session, host, query, args.requests, pid)
            print(f"{kind:13} {results[kind]}", flush=True)
    finally:
        for made in clusters:
            made.shutdown()
        node.stop()
    figures.record_run("own_request_cost", args.record, results, None)
    return 0


if __name__ == "__main__":
    sys.exit(main())
