"""The false-verdict soak (issue 32): three equal Simulacron nodes, the real driver with
``attach(session)`` and the shipped defaults, and not one transition out of ``healthy``.

Two runs, the clients of the issue's table at once (adaptive_lb.tools.peers.equal_nodes):
on a quiet machine, 10 requests a second one at a time and 200 a second with 4 in flight;
then the same two beside a closed loop of 32 in flight and two processes spinning on the
client's two cores, long enough for a suspected tail to be confirmed on later answers
(a real one is within 1-3 s), so that a tail the client's own delays made would have had
the time to become a verdict. ``benchmarks/false_verdicts.py`` runs the six runs of the
table apart, 30 s each. A third run: the three clients, the client itself not reading
answers for 3 s twice (the GIL held in a long C call; a callback keeping the driver's event
loop), longer than ``health.stall_timeout``.
"""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest
from cassandra.policies import DCAwareRoundRobinPolicy, TokenAwarePolicy

from adaptive_lb import AdaptiveLoadBalancingPolicy
from adaptive_lb.tools.peers.equal_nodes import Load, cpu_hog, run_loads, stop_reading
from tests.integration.simulacron import Simulacron

pytestmark = pytest.mark.integration

CLUSTER = "equal"
QUERY = "SELECT v FROM ks.t WHERE k = ?"
THIN = Load("thin", in_flight=1, rate=10.0)
PACED = Load("200", in_flight=4, rate=200.0)
CLOSED = Load("closed", in_flight=32)


@pytest.fixture(scope="module")
def contact_points(simulacron: Simulacron) -> Iterator[list[str]]:
    created = simulacron.create_cluster(CLUSTER, [["r1", "r2", "r3"]])
    try:
        simulacron.prime_keyspace("ks", {"dc1": 2})
        simulacron.prime(
            QUERY, rows=[{"v": 7}], column_types={"v": "int"}, param_types={"k": "int"}
        )
        yield created["dc1"][:1]
    finally:
        simulacron.remove_cluster(CLUSTER)


def policy() -> AdaptiveLoadBalancingPolicy:
    return AdaptiveLoadBalancingPolicy(TokenAwarePolicy(DCAwareRoundRobinPolicy("dc1")))


def test_equal_nodes_quiet_client_no_false_verdict(contact_points):
    seen = run_loads(contact_points, policy, QUERY, [THIN, PACED], seconds=8.0)
    print(f"\nquiet: answered {seen.answered}, failed {seen.failed}")
    assert seen.answered["thin"] >= 40 and seen.answered["200"] >= 800, seen
    assert seen.departures == []


def test_equal_nodes_saturated_client_no_false_verdict(contact_points):
    with cpu_hog(2):
        seen = run_loads(contact_points, policy, QUERY, [THIN, PACED, CLOSED], seconds=14.0)
    print(f"\nsaturated: answered {seen.answered}, failed {seen.failed}")
    assert seen.answered["thin"] >= 40 and seen.answered["closed"] >= 2000, seen
    assert seen.departures == []


def test_a_client_that_stops_reading_for_3_s_judges_no_node_stalled(contact_points):
    # The client holds the GIL for 3 s (libc's sleep, called with it held, as a long C call
    # does), then a callback of its own keeps the driver's event loop for 3 s (its health
    # thread runs on time meanwhile), each longer than health.stall_timeout. Before, the
    # first refresh after the GIL, ahead of the event loop reading the answers that waited,
    # saw the hosts with a tracked request in flight silent for 3 s: "stalled", ERRORING at
    # penalty 1024 (1, 2 and 5 such verdicts in three runs); the callback, every host of
    # every session (20 in 30 s with three such callbacks). The closed loop keeps tracked
    # requests in flight on every host.
    held: list[float] = []

    def stop_twice(sessions: list) -> None:
        for how in ("gil", "loop"):
            time.sleep(3.0)  # the loads running
            held.append(stop_reading(how, sessions))

    loads = [THIN, PACED, CLOSED]
    seen = run_loads(contact_points, policy, QUERY, loads, seconds=14.0, meanwhile=stop_twice)
    print(f"\nstopped reading {held}: answered {seen.answered}, failed {seen.failed}")
    assert len(held) == 2 and min(held) >= 2.9, held
    assert seen.answered["thin"] >= 40 and seen.answered["200"] >= 800, seen
    assert seen.departures == []
