"""The probe's round trip as a load signal: a slow host is held while its probes are clearly
slower than its peers', let back when they are not (the real health model; no driver)."""

from __future__ import annotations

import random

import pytest

from adaptive_lb.clock import ManualClock
from adaptive_lb.config import HealthConfig, LatencyFactorConfig, TrackingConfig
from adaptive_lb.health import HealthModel, HealthState
from adaptive_lb.latency_factor import LatencyRecord
from adaptive_lb.probe_latency import REFERENCE_INTERVALS, still_slow
from adaptive_lb.probe_record import ANSWERED, TIMEOUT
from adaptive_lb.probes import REFERENCE, ProbeScheduler
from adaptive_lb.stats import HostStats

MS = 1_000_000
S = 1_000_000_000
HEALTHY, SLOW, ERRORING, WARMING = (
    HealthState.HEALTHY,
    HealthState.SLOW,
    HealthState.ERRORING,
    HealthState.WARMING,
)


class Cluster:
    """h0..h2 in one datacenter on a manual clock, health refreshed every 200 ms and the
    scheduler asked after each refresh with the hosts' datacenters, as the policy does.
    Every probe sent is answered after ``rtt_ms[host]`` (None: never answered)."""

    def __init__(self) -> None:
        self.clock = ManualClock(1 * S)
        self.config = HealthConfig()
        self.stats = {f"h{i}": HostStats(TrackingConfig(), self.clock) for i in range(3)}
        self.groups = dict.fromkeys(self.stats, "dc1")
        self.model = HealthModel(self.config, self.clock, window_s=10.0)
        self.model.probing = True
        self.scheduler = ProbeScheduler(random.Random(1))
        self.rtt_ms: dict[str, float | None] = dict.fromkeys(self.stats, 0.3)
        self.sent: list[tuple[str, str]] = []

    def request(self, key: str, latency_ms: float = 2.0) -> None:
        stats = self.stats[key]
        stats.on_send()
        stats.on_success(round(latency_ms * MS))

    def refresh(self) -> None:
        self.clock.advance(200 * MS)
        now = self.clock.now_ns()
        for key, stats in self.stats.items():  # the probes of the last refresh answer
            record = stats.probes
            rtt = self.rtt_ms[key]
            if record.outstanding and record.last_sent_ns is not None:
                if rtt is None:
                    record.end(TIMEOUT, now)
                else:
                    record.end(ANSWERED, min(now, record.last_sent_ns + round(rtt * MS)))
        self.model.refresh(self.stats, self.groups)
        orders = self.scheduler.due(
            ((key, stats, True) for key, stats in self.stats.items()),
            self.model.verdicts,
            self.model.windows,
            self.model.stalled,
            now,
            self.config,
            self.groups,
        )
        for order in orders:
            assert order.stats.probes.begin(now, order.next_ns, order.reason)
            self.sent.append((str(order.key), order.reason))

    def run(self, seconds: float, slow_ms: float | None = None) -> None:
        """Each peer answers a user request every 200 ms; h0 too (in ``slow_ms``) if given."""
        for _ in range(round(seconds / 0.2)):
            if slow_ms is not None:
                self.request("h0", slow_ms)
            for key in ("h1", "h2"):
                self.request(key)
            self.refresh()

    def state(self, key: str) -> HealthState:
        return self.stats[key].health_state


def slow_h0(rtt_ms: float) -> Cluster:
    """h0 answers 60 ms until it is SLOW, then gets no user request; its probes take
    ``rtt_ms``, its peers' 0.3 ms."""
    cluster = Cluster()
    cluster.rtt_ms["h0"] = rtt_ms
    cluster.run(2.0, slow_ms=60.0)
    assert cluster.state("h0") is SLOW
    return cluster


def test_a_slow_host_with_slow_probes_stays_slow_after_its_window():
    cluster = slow_h0(5.0)
    cluster.run(15.0)
    assert cluster.state("h0") is SLOW
    verdict = cluster.model.health("h0")
    assert verdict is not None and verdict.reason.startswith("still slow by its probes")
    assert cluster.stats["h0"].requests_total == 10  # no user request since


def test_a_slow_host_with_fast_probes_is_let_back_without_user_traffic():
    cluster = slow_h0(0.3)
    cluster.run(10.4)
    assert cluster.state("h0") is WARMING


def test_a_held_host_is_let_back_once_its_probes_are_fast_again():
    cluster = slow_h0(5.0)
    cluster.run(12.0)
    assert cluster.state("h0") is SLOW
    cluster.rtt_ms["h0"] = 0.3
    cluster.run(12.0)  # the slow probes leave the window
    assert cluster.state("h0") is WARMING


def test_peers_are_probed_as_a_reference_only_while_a_host_is_probed_as_slow():
    cluster = Cluster()
    cluster.run(5.0, slow_ms=2.0)
    assert cluster.sent == []  # healthy hosts with traffic: no probe
    cluster.rtt_ms["h0"] = 5.0
    cluster.run(2.0, slow_ms=60.0)
    cluster.run(10.0)
    references = [host for host, reason in cluster.sent if reason == REFERENCE]
    assert {"h1", "h2"} == set(references)
    # at most one every REFERENCE_INTERVALS x probe_interval (jitter aside) per peer
    assert references.count("h1") <= 10.0 / REFERENCE_INTERVALS + 1


def test_a_stall_is_judged_as_before():
    cluster = slow_h0(5.0)
    cluster.run(3.0)
    cluster.rtt_ms["h0"] = None  # its probe times out: stalled, as without round trips
    cluster.run(1.0)
    assert cluster.state("h0") is ERRORING
    assert cluster.model.health("h0").cause == "stall"  # type: ignore[union-attr]


def test_probe_round_trips_never_enter_the_user_window():
    cluster = slow_h0(5.0)
    before = cluster.stats["h0"].window_stats([50.0]).samples
    cluster.run(4.0)
    assert cluster.stats["h0"].probes.answered >= 3
    assert cluster.stats["h0"].window_stats([50.0]).samples == before


@pytest.mark.parametrize(
    ("median_ms", "samples", "held"),
    [
        (5.0, 8, True),  # 4.7 ms more than its peers' probes: surely, and far beyond equal
        (1.1, 8, True),  # 0.75 ms more: a request 1.6 x its peers' 1.3 ms
        (0.5, 8, False),  # 0.15 ms more: within the dead band
        (5.0, 2, False),  # too few probes
        (0.9, 3, False),  # slower, but not surely (3 probes)
    ],
)
def test_still_slow_is_the_probe_excess_on_the_peers_user_latency(median_ms, samples, held):
    why = still_slow(median_ms / 1e3, samples, 0.35e-3, 5, 1.3e-3, 0.4, HealthConfig())
    assert (why is not None) is held


def test_a_held_latency_factor_does_not_decay():
    config = LatencyFactorConfig()
    record, held = LatencyRecord(), LatencyRecord()
    for rec in (record, held):
        rec.update(0, 0.016, 0.001, 1, 30, 0.3, config)
        assert rec.factor == config.cap
    for t in range(1, 41):
        record.update(t * S, None, 0.001, 0, 30, 0.3, config)
        held.update(t * S, None, 0.001, 0, 30, 0.3, config, held=True)
    assert record.factor == 1.0
    assert held.factor == config.cap
