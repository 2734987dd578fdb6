"""``fork()`` after attach, with the real driver against Simulacron (issue 25): the child
says what it inherited and never reports the parent's tracking; a new Cluster, policy and
attach in the child work; the parent goes on as before."""

from __future__ import annotations

import json
import os
import select
import time
from collections.abc import Iterator

import pytest
from cassandra.policies import DCAwareRoundRobinPolicy, TokenAwarePolicy
from prometheus_client import CollectorRegistry

import adaptive_lb
from adaptive_lb.config import parse_config
from adaptive_lb.tools.peers.connect import connect_driver
from tests.integration.simulacron import Simulacron, wait_for_pools

pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork()"),
]

QUERY = "SELECT v FROM ks.t WHERE k = ?"
SLOW = "SELECT v FROM ks.slow WHERE k = ?"
ROWS = {"rows": [{"v": 1}], "column_types": {"v": "int"}, "param_types": {"k": "int"}}


@pytest.fixture(scope="module")
def contact(simulacron: Simulacron) -> Iterator[str]:
    nodes = simulacron.create_cluster("fork", [["r1", "r2", "r3"]])
    try:
        simulacron.prime_keyspace("ks", {"dc1": 3})
        simulacron.prime(QUERY, **ROWS)
        simulacron.prime(SLOW, **ROWS, delay_ms=3000)
        yield nodes["dc1"][0]
    finally:
        simulacron.remove_cluster("fork")


def adaptive_session(contact: str, registry: CollectorRegistry):
    policy = adaptive_lb.AdaptiveLoadBalancingPolicy(
        TokenAwarePolicy(DCAwareRoundRobinPolicy("dc1")),
        parse_config("metrics: {prometheus_enabled: true, port: 0}"),
    )
    cluster, session = connect_driver([contact], policy)
    attachment = adaptive_lb.attach(session, registry=registry)
    wait_for_pools(session, "dc1")
    return policy, cluster, session, attachment


def in_child(contact: str, policy, attachment, write_fd: int) -> None:
    """What the forked child checks; its findings go to the parent as JSON."""
    snapshot = policy.snapshot()
    found = {
        "forked_from_pid": snapshot.forked_from_pid,
        "tracking": snapshot.request_tracking,
        "in_flight": sum(h.in_flight for h in snapshot.hosts),
        "attachment_closed": attachment.closed,
    }
    new_policy, cluster, session, new_attachment = adaptive_session(contact, CollectorRegistry())
    try:
        statement = session.prepare(QUERY)
        for k in range(20):
            session.execute(statement, [k])
        found.update(
            new_tracking=new_policy.request_tracking,
            new_requests=sum(h.requests_total for h in new_policy.snapshot().hosts),
            new_port=new_attachment.prometheus_port,
        )
    finally:
        cluster.shutdown()
    os.write(write_fd, json.dumps(found).encode())


def test_a_forked_child_says_so_and_attaches_anew(contact):
    policy, cluster, session, attachment = adaptive_session(contact, CollectorRegistry())
    try:
        statement = session.prepare(QUERY)
        for k in range(10):
            session.execute(statement, [k])
        stuck = session.execute_async(session.prepare(SLOW), [1], timeout=10)
        deadline = time.monotonic() + 5
        while sum(h.in_flight for h in policy.snapshot().hosts) == 0:
            assert time.monotonic() < deadline, "the slow request never went out"
            time.sleep(0.01)
        read_fd, write_fd = os.pipe()
        pid = os.fork()
        if pid == 0:  # the child: never returns into pytest
            status = 1
            try:
                os.close(read_fd)
                in_child(contact, policy, attachment, write_fd)
                status = 0
            finally:
                os._exit(status)
        os.close(write_fd)
        try:
            ready, _, _ = select.select([read_fd], [], [], 60)
            found = json.loads(os.read(read_fd, 65536) or b"null") if ready else None
        finally:
            os.close(read_fd)
            waited, status = os.waitpid(pid, os.WNOHANG)
            if waited == 0:
                os.kill(pid, 9)
                os.waitpid(pid, 0)
        assert found is not None, "the child said nothing"
        assert found["forked_from_pid"] == os.getpid()
        assert found["tracking"] is False and found["in_flight"] == 0
        assert found["attachment_closed"] is True
        assert found["new_tracking"] is True and found["new_requests"] >= 20
        assert found["new_port"]
        # The parent goes on: tracking, its request still in flight, then answered.
        assert policy.request_tracking and policy.forked_from_pid is None
        assert stuck.result().one().v == 1
        assert not attachment.closed
    finally:
        cluster.shutdown()
