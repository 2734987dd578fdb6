"""A candidate's entry in ``adaptive_lb.candidates``: the memoized formatting gives the text
one ``%`` operation over every field gives, for whole and fractional penalties alike."""

from __future__ import annotations

import types

import pytest

from adaptive_lb.plan.scoring import HostView
from adaptive_lb.stats.health_state import HealthState
from adaptive_lb.telemetry.candidate_entries import candidate_entry

REFERENCE = (
    "%s:%s in_flight=%d health=%s penalty=%.6g score=%.6g replica=%s server_load=%.3g latency=%.3g"
)


def view(in_flight, health_penalty, server_load=1.0, latency=1.0, state=HealthState.HEALTHY):
    host = types.SimpleNamespace(address="10.0.0.7", endpoint=types.SimpleNamespace(port=9042))
    stats = types.SimpleNamespace(
        in_flight=in_flight,
        rack_penalty=1.0,
        health_penalty=health_penalty,
        server_load=server_load,
        latency_factor=latency,
        health_state=state,
    )
    return HostView(host, stats)


@pytest.mark.parametrize(
    ("in_flight", "health_penalty", "server_load", "latency", "replica"),
    [
        (0, 1.0, 1.0, 1.0, True),
        (3, 1.0, 1.0, 1.0, False),
        (2, 16.0, 1.0, 1.0, True),
        (5, 1.0, 1.37, 2.5, True),
        (0, 1 / 3, 1.0, 1.0, True),
        (999, 64.0, 4.0, 3.0, False),
        (7, 1e5, 1.0, 1.0, False),
    ],
)
def test_an_entry_is_what_one_format_gives(
    in_flight, health_penalty, server_load, latency, replica
):
    for state in (HealthState.HEALTHY, HealthState.SLOW):
        candidate = view(in_flight, health_penalty, server_load, latency, state)
        penalty = health_penalty * server_load * latency * (1.0 if replica else 12.0)
        expected = REFERENCE % (
            "10.0.0.7",
            9042,
            in_flight,
            state.value,
            penalty,
            (in_flight + 1) * penalty,
            replica,
            server_load,
            latency,
        )
        for _twice in range(2):  # built, then from the memo
            assert candidate_entry(candidate, replica, replica, 12.0) == expected
