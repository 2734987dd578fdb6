"""Pre-fork workers (gunicorn, uwsgi): real worker processes, each attaching to its own
session against Simulacron with the same metrics settings (issue 25)."""

from __future__ import annotations

import json
import re
import select
import subprocess
import sys
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from adaptive_lb.tools.peers.net import can_bind
from tests.integration.simulacron import Simulacron

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
QUERY = "SELECT v FROM ks.t WHERE k = ?"
WORKER = """
import json, sys
from cassandra.policies import DCAwareRoundRobinPolicy, TokenAwarePolicy
import adaptive_lb
from adaptive_lb.config import parse_config
from adaptive_lb.tools.peers.connect import connect_driver, wait_for_pools

contact, port, query = sys.argv[1], int(sys.argv[2]), sys.argv[3]
config = parse_config(
    f"metrics: {{prometheus_enabled: true, port: {port}, port_count: 2}}\\n"
    "policy: {local_rack: null}\\n"
)
policy = adaptive_lb.AdaptiveLoadBalancingPolicy(
    TokenAwarePolicy(DCAwareRoundRobinPolicy("dc1")), config
)
cluster, session = connect_driver([contact], policy)
attachment = adaptive_lb.attach(session)
wait_for_pools(session, "dc1")
statement = session.prepare(query)
for k in range(20):
    session.execute(statement, [k])
print(json.dumps({
    "port": attachment.prometheus_port,
    "problem": attachment.prometheus_problem,
    "tracking": policy.request_tracking,
    "requests": sum(h.requests_total for h in policy.snapshot().hosts),
}), flush=True)
sys.stdin.readline()
cluster.shutdown()
"""


@pytest.fixture(scope="module")
def contact(simulacron: Simulacron) -> Iterator[str]:
    nodes = simulacron.create_cluster("prefork", [["r1", "r2", "r3"]])
    try:
        simulacron.prime_keyspace("ks", {"dc1": 3})
        simulacron.prime(QUERY, [{"v": 1}], {"v": "int"}, param_types={"k": "int"})
        yield nodes["dc1"][0]
    finally:
        simulacron.remove_cluster("prefork")


def two_free_ports() -> int:
    for port in range(29464, 29964, 2):
        if can_bind("127.0.0.1", port) and can_bind("127.0.0.1", port + 1):
            return port
    pytest.skip("no two consecutive free ports in 29464-29963")


def start_worker(contact: str, port: int) -> tuple[subprocess.Popen[str], dict]:
    worker = subprocess.Popen(
        [sys.executable, "-c", WORKER, contact, str(port), QUERY],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        cwd=ROOT,
    )
    assert worker.stdout is not None
    ready, _, _ = select.select([worker.stdout], [], [], 60)
    line = worker.stdout.readline() if ready else ""
    if not line:
        worker.kill()
        pytest.fail(f"worker {worker.pid} said nothing within 60 s")
    return worker, json.loads(line)


def requests_served(port: int) -> float:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as response:
        text = response.read().decode()
    pattern = re.compile(r"^adaptive_lb_host_requests_total\{[^}]*\} (\S+)$", re.M)
    return sum(float(value) for value in pattern.findall(text))


def test_every_worker_routes_adaptively_and_each_port_serves_its_own(contact):
    """Three workers, ``metrics.port_count: 2``: the first two serve a port each, the third
    finds none free and still routes and tracks (before: the second worker's attach raised
    "Address already in use" and, attach being all or nothing, it routed untracked)."""
    port = two_free_ports()
    workers = []
    try:
        reports = []
        for _ in range(3):  # one after another, as a pre-fork server starts them
            worker, report = start_worker(contact, port)
            workers.append(worker)
            reports.append(report)
        assert [r["port"] for r in reports] == [port, port + 1, None]
        assert reports[2]["problem"].startswith(f"cannot serve /metrics on 127.0.0.1:{port}-")
        assert all(r["tracking"] and r["requests"] >= 20 for r in reports)
        # Each endpoint serves its own process's series.
        assert requests_served(port) == reports[0]["requests"]
        assert requests_served(port + 1) == reports[1]["requests"]
    finally:
        for worker in workers:
            if worker.stdin is not None:
                worker.stdin.close()  # the worker shuts its cluster down and exits
        for worker in workers:
            try:
                worker.wait(30)
            except subprocess.TimeoutExpired:
                worker.kill()
                worker.wait(10)
    assert [worker.returncode for worker in workers] == [0, 0, 0]
