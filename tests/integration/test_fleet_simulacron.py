"""A fleet's reads and probes within the budget, end to end (issue 34 item 5): a pre-fork
server's 16 worker processes (imported once, then forked, each connecting and attaching
its own session) against Simulacron's three nodes claiming Cassandra 4.0.0, one node's
``system_views.thread_pools`` reporting a queue, ``system_views.clients`` listing the 16.
Simulacron's activity log counts what each node received of adaptive-lb's own requests
(thread-pool reads, probes, clients reads) per second, and the user requests that moved."""

from __future__ import annotations

import contextlib
import json
import os
import select
import signal
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from adaptive_lb.health.probes import PROBE_QUERY
from adaptive_lb.stats.fleet import CASSANDRA_CLIENTS_QUERY, own_period_s
from adaptive_lb.stats.server_load import THREAD_POOLS_QUERY
from tests.integration.simulacron import Simulacron
from tests.integration.test_server_load_simulacron import POOL_TYPES, pools

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
CLUSTER = "fleet"
QUERY = "SELECT v FROM ks.t WHERE k = ?"
WORKERS = 16
SECONDS = 26.0
"""Each worker's load, from its attach."""
STALL = (12.0, 17.0)
"""When the third node stalls and returns, in seconds after the master starts (the workers
know the fleet 2-8 s in)."""
BUDGET = 4.0
"""Per node per second: 16 clients at the shipped 2 s would send each node 8 reads a second;
within 4, each worker reads a node every 16 / (0.9 x 4) = 4.4 s at least."""
# No SLOW verdict and no latency factor (see test_server_load_simulacron: on two shared
# cores an equal node's answers now and then wait in a busy client): the server's load
# alone moves traffic here.
CONFIG = f"""
policy: {{local_rack: null}}
health:
  outlier_factor: 100
  latency_factor: {{cap: 1}}
  fleet: {{budget: {BUDGET}}}
"""
MASTER = """
import json, os, sys, time, traceback
from cassandra import OperationTimedOut
from cassandra.policies import DCAwareRoundRobinPolicy, TokenAwarePolicy
import adaptive_lb
from adaptive_lb.config import parse_config
from adaptive_lb.tools.peers.connect import connect_driver, wait_for_pools

contact, workers, seconds, query = sys.argv[1], int(sys.argv[2]), float(sys.argv[3]), sys.argv[4]
config = parse_config(sys.argv[5])


def own(snapshot):
    return {h.address: h.server_load_reads_total + h.probes_sent_total for h in snapshot.hosts}


def work():
    policy = adaptive_lb.AdaptiveLoadBalancingPolicy(
        TokenAwarePolicy(DCAwareRoundRobinPolicy("dc1")), config
    )
    cluster, session = connect_driver([contact], policy)
    adaptive_lb.attach(session)
    wait_for_pools(session, "dc1")
    statement = session.prepare(query)
    learned, end, k, at_learn, timeouts = None, time.time() + seconds, os.getpid(), {}, []
    while time.time() < end:
        sent = time.time()
        try:
            session.execute(statement, [k % 5000])
        except OperationTimedOut as error:  # sent to the stalled node as it stalled
            hosts = sorted(str(h).rsplit(":", 1)[0] for h in (error.errors or {}))
            timeouts.append([sent * 1000, hosts])
        k += 7
        if learned is None and policy.fleet_size_source != "default":
            learned, at_learn = time.time(), own(policy.snapshot())
        time.sleep(0.1)
    snapshot = policy.snapshot()
    report = {
        "pid": os.getpid(),
        "learned": learned,
        "own_at_learn": at_learn,
        "own_at_end": own(snapshot),
        "end": time.time(),
        "fleet_size": snapshot.fleet_size,
        "source": snapshot.fleet_size_source,
        "errors": {k: v for k, v in snapshot.internal_errors_by_stage.items() if v},
        "factors": {h.address: h.server_load for h in snapshot.hosts},
        "timeouts": timeouts,
    }
    os.write(1, (json.dumps(report) + "\\n").encode())
    cluster.shutdown()


pids = []
for _ in range(workers):
    pid = os.fork()
    if pid == 0:
        code = 0
        try:
            work()
        except BaseException:
            traceback.print_exc()
            code = 1
        os._exit(code)
    pids.append(pid)
os.write(1, (json.dumps({"workers": pids}) + "\\n").encode())
codes = [os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]) for pid in pids]
os.write(1, (json.dumps({"codes": codes}) + "\\n").encode())
"""


@pytest.fixture(scope="module")
def nodes(simulacron: Simulacron) -> Iterator[dict[str, list[str]]]:
    created = simulacron.create_cluster(CLUSTER, [["r1", "r2", "r3"]], cassandra_version="4.0.0")
    try:
        simulacron.prime_keyspace("ks", {"dc1": 3})
        simulacron.prime(
            QUERY, rows=[{"v": 7}], column_types={"v": "int"}, param_types={"k": "int"}
        )
        clients = [{"address": "127.0.0.1", "port": 40000 + n} for n in range(WORKERS)]
        simulacron.prime(
            CASSANDRA_CLIENTS_QUERY, rows=clients, column_types={"address": "inet", "port": "int"}
        )
        yield created
    finally:
        simulacron.remove_cluster(CLUSTER)


def run_fleet(
    contact: str,
    events: list[tuple[float, Callable[[], None]]],
    *,
    workers: int = WORKERS,
    seconds: float = SECONDS,
    config: str = CONFIG,
) -> list[dict[str, Any]]:
    """Start the pre-fork master of ``workers`` processes each loading ``seconds`` with
    ``config``, run ``events`` (seconds after its start, what to do), wait for the workers'
    reports; every process it started is stopped by its pid if it has not ended."""
    master = subprocess.Popen(
        [sys.executable, "-c", MASTER, contact, str(workers), str(seconds), QUERY, config],
        stdout=subprocess.PIPE,
        text=True,
        cwd=ROOT,
        env={
            **os.environ,
            "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
        },
    )
    assert master.stdout is not None
    lines: list[dict[str, Any]] = []
    pids: list[int] = []
    started = time.monotonic()
    deadline = started + seconds + 60
    pending = sorted(events, key=lambda event: event[0])
    try:
        while time.monotonic() < deadline and not any("codes" in line for line in lines):
            while pending and time.monotonic() - started >= pending[0][0]:
                pending.pop(0)[1]()
            ready, _, _ = select.select([master.stdout], [], [], 1.0)
            if ready:
                text = master.stdout.readline()
                if not text:
                    break
                lines.append(json.loads(text))
                pids = next((line["workers"] for line in lines if "workers" in line), [])
        master.wait(10)
    finally:
        if not any("codes" in line for line in lines):  # the workers were not all waited for
            for pid in pids:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(pid, signal.SIGKILL)
        if master.poll() is None:
            master.kill()
            master.wait(10)
    codes = next((line["codes"] for line in lines if "codes" in line), None)
    assert codes == [0] * workers, lines
    return [line for line in lines if "pid" in line]


def test_a_fleet_of_workers_reads_and_probes_each_node_within_the_budget(simulacron, nodes):
    busy = nodes["dc1"][1]
    for address in nodes["dc1"]:
        rows = pools(8, 40) if address == busy else pools(2, 0)
        scope = simulacron.scope_of(address, CLUSTER)
        simulacron.prime(THREAD_POOLS_QUERY, rows=rows, column_types=POOL_TYPES, scope=scope)
    simulacron.clear_activity_log(cluster=CLUSTER)
    marks: dict[str, float] = {}

    def stall() -> None:
        marks["stall"] = time.time() * 1000
        simulacron.pause_reads("dc1", "node3", cluster=CLUSTER)

    def resume() -> None:
        simulacron.resume_reads("dc1", "node3", cluster=CLUSTER)
        marks["resume"] = time.time() * 1000

    try:
        reports = run_fleet(nodes["dc1"][0], [(STALL[0], stall), (STALL[1], resume)])
    finally:
        simulacron.resume_reads("dc1", "node3", cluster=CLUSTER)
    log = simulacron.activity_log(cluster=CLUSTER)

    assert len(reports) == WORKERS
    # A request sent to the third node as it stalls waits out the stall (5 s, the request
    # timeout): the fault injected, not a fault of the fleet's reads. Nothing else times out.
    stalled = nodes["dc1"][2]
    timeouts = [t for r in reports for t in r["timeouts"]]
    for sent_ms, hosts in timeouts:
        assert hosts == [stalled] and marks["stall"] - 1000 <= sent_ms < marks["resume"], timeouts
    print(f"\n  user requests timed out at the stall: {len(timeouts)}")
    assert [(r["fleet_size"], r["errors"]) for r in reports] == [(WORKERS, {})] * WORKERS
    assert {r["source"] for r in reports} == {"system_views.clients"}
    # Once every worker knows the fleet, until the first one stops.
    start_ms = max(r["learned"] for r in reports) * 1000
    end_ms = min(r["end"] for r in reports) * 1000
    seconds = (end_ms - start_ms) / 1000
    assert seconds >= 8.0, seconds  # enough window to count in
    own = {THREAD_POOLS_QUERY: "reads", PROBE_QUERY: "probes", CASSANDRA_CLIENTS_QUERY: "clients"}
    counted: Counter[tuple[str, str]] = Counter()
    for entry in log:
        if start_ms <= entry.get("received_timestamp", 0) < end_ms:
            address = nodes["dc1"][int(entry["node"].removeprefix("node")) - 1]
            counted[(address, own.get(entry.get("query", ""), "user"))] += 1
    period = own_period_s(WORKERS, BUDGET)
    print(
        f"\n{WORKERS} workers, budget {BUDGET}/s per node, period {period:.1f} s, {seconds:.1f} s:"
    )
    users = sum(counted[(a, "user")] for a in nodes["dc1"])
    for address in nodes["dc1"]:
        kinds = {kind: counted[(address, kind)] for kind in ("reads", "probes", "clients", "user")}
        rate = (kinds["reads"] + kinds["probes"] + kinds["clients"]) / seconds
        print(f"  {address}{' (queue)' if address == busy else ''}: {kinds}, {rate:.2f}/s own")
        # Without the budget: 16 / 2 s = 8 reads a second per node.
        assert rate <= BUDGET, (address, kinds)
        assert kinds["reads"] > 0
    factors = Counter(r["factors"].get(busy) for r in reports)
    print(f"  the queued node's factor per worker: {dict(factors)}")
    # The queue still moves the fleet's traffic: the queued node gets under half a fair share.
    assert counted[(busy, "user")] < 0.5 * users / 3, counted
    # The stalled node: probed by a spread of workers, each at its own slots; back in use.
    assert marks["resume"] + 5000 < end_ms, (marks, end_ms)
    probes = [
        e["received_timestamp"]
        for e in log
        if e["node"] == "node3"
        and e.get("query") == PROBE_QUERY
        and marks["stall"] <= e["received_timestamp"] < end_ms
    ]
    back = {
        e["connection"]: e["received_timestamp"] - marks["resume"]
        for e in reversed(log)
        if e["node"] == "node3"
        and e.get("query") == QUERY
        and marks["resume"] + 500 <= e["received_timestamp"] < end_ms
    }
    since_s = (end_ms - marks["stall"]) / 1000
    returns = sorted(back.values())
    print(
        f"  {stalled} stalled {(marks['resume'] - marks['stall']) / 1000:.1f} s: "
        f"{len(probes)} probes in the {since_s:.1f} s from the stall "
        f"({len(probes) / since_s:.2f}/s); {len(back)} of {WORKERS} workers used it again within "
        f"{(end_ms - marks['resume']) / 1000:.1f} s of its return, the first "
        f"{returns[0] / 1000 if returns else 0:.1f} s and the last "
        f"{returns[-1] / 1000 if returns else 0:.1f} s after"
    )
    assert probes and len(back) >= WORKERS // 2
