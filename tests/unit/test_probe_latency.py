"""The probe's round trip as a load signal: a slow host is held while its probes are clearly
slower than what its peers' user requests say a probe takes there, let back when they are
not; healthy peers with traffic are never probed for it (the real health model and
scheduler; no driver)."""

from __future__ import annotations

import random

import pytest

from adaptive_lb.config import HealthConfig, LatencyFactorConfig, TrackingConfig
from adaptive_lb.core.clock import ManualClock
from adaptive_lb.health.model import HealthModel, HealthState
from adaptive_lb.health.peers import still_slow
from adaptive_lb.health.probes import HELD_AWAY, ProbeScheduler
from adaptive_lb.stats.host import HostStats
from adaptive_lb.stats.latency_factor import LatencyRecord
from adaptive_lb.stats.probe_record import ANSWERED, TIMEOUT

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
    scheduler asked after each refresh, as the policy does. Every probe sent is answered
    after ``rtt_ms[host]`` (None: never answered); user requests take 1.5-2.5 ms."""

    def __init__(self) -> None:
        self.clock = ManualClock(1 * S)
        self.config = HealthConfig()
        self.stats = {f"h{i}": HostStats(TrackingConfig(), self.clock) for i in range(3)}
        self.groups = dict.fromkeys(self.stats, "dc1")
        self.model = HealthModel(self.config, self.clock, window_s=10.0)
        self.model.probing = True
        self.scheduler = ProbeScheduler(random.Random(1))
        self.random = random.Random(1)
        self.rtt_ms: dict[str, float | None] = dict.fromkeys(self.stats, 0.3)
        self.sent: list[tuple[str, str]] = []

    def request(self, key: str, latency_ms: float | None = None) -> None:
        stats = self.stats[key]
        stats.on_send()
        latency_ms = latency_ms if latency_ms is not None else self.random.uniform(1.5, 2.5)
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
    ``rtt_ms``, its peers' user requests ~2 ms (the fastest tenth ~1.6 ms)."""
    cluster = Cluster()
    cluster.rtt_ms["h0"] = rtt_ms
    # Suspected from its first few answers, SLOW once later answers say it again (the
    # window's next interval: adaptive_lb.health.rules).
    for _ in range(25):
        cluster.run(0.2, slow_ms=60.0)
        if cluster.state("h0") is SLOW:
            break
    assert cluster.state("h0") is SLOW
    return cluster


def test_a_slow_host_with_slow_probes_stays_slow_after_its_window():
    cluster = slow_h0(8.0)
    answered = cluster.stats["h0"].requests_total
    cluster.run(15.0)
    assert cluster.state("h0") is SLOW
    verdict = cluster.model.health("h0")
    assert verdict is not None and verdict.reason.startswith("still slow by its probes")
    assert cluster.stats["h0"].requests_total == answered  # no user request since


@pytest.mark.parametrize("rtt_ms", [0.3, 1.5])
def test_a_slow_host_with_probes_no_slower_than_a_request_is_let_back(rtt_ms):
    # 1.5 ms: as fast as its peers' fastest requests -- not surely slower than their probes.
    cluster = slow_h0(rtt_ms)
    cluster.run(10.4)
    assert cluster.state("h0") is WARMING


def test_a_held_host_is_let_back_once_its_probes_are_fast_again():
    cluster = slow_h0(8.0)
    cluster.run(12.0)
    assert cluster.state("h0") is SLOW
    cluster.rtt_ms["h0"] = 0.3
    cluster.run(12.0)  # the slow probes leave the window
    assert cluster.state("h0") is WARMING


def test_healthy_peers_with_traffic_are_never_probed_for_it():
    cluster = Cluster()
    cluster.run(5.0, slow_ms=2.0)
    assert cluster.sent == []  # healthy hosts with traffic: no probe
    cluster.rtt_ms["h0"] = 8.0
    cluster.run(8.0, slow_ms=60.0)  # its median: suspected, then again on later answers
    cluster.run(15.0)
    assert cluster.state("h0") is SLOW
    assert {host for host, _ in cluster.sent} == {"h0"}, cluster.sent


def test_a_stall_is_judged_as_before():
    cluster = slow_h0(8.0)
    cluster.run(3.0)
    cluster.rtt_ms["h0"] = None  # its probe times out: stalled, as without round trips
    cluster.run(1.0)
    assert cluster.state("h0") is ERRORING
    assert cluster.model.health("h0").cause == "stall"  # type: ignore[union-attr]


def test_probe_round_trips_never_enter_the_user_window():
    cluster = slow_h0(8.0)
    before = cluster.stats["h0"].window_stats([50.0]).samples
    cluster.run(4.0)
    assert cluster.stats["h0"].probes.answered >= 3
    assert cluster.stats["h0"].window_stats([50.0]).samples == before


NO_JITTER = HealthConfig(latency_factor=LatencyFactorConfig(jitter=0.0))


@pytest.mark.parametrize(
    ("median_ms", "samples", "fastest_ms", "held"),
    [
        (5.0, 8, 0.35, True),  # 4.65 ms more than the peers' fastest requests: surely slow
        (1.1, 8, 0.35, True),  # 0.75 ms more: a request 1.6 x its peers' 1.3 ms
        (0.5, 8, 0.35, False),  # 0.15 ms more: within the dead band
        (5.0, 2, 0.35, False),  # too few probes
        (0.9, 3, 0.35, False),  # slower, but not surely (3 probes)
        (1.1, 8, 0.9, False),  # as fast as their fastest requests: not surely slower
        (3.0, 8, 0.9, True),
        # The peers' fastest requests unknown: against their median.
        (4.0, 8, None, True),
        (2.0, 8, None, False),  # a user request may well take that
        # Their fastest tenth read as 0 (a far rack's, less its distance, is clamped at 0:
        # a ZeroDivisionError in the health refresh on the real cluster): as unknown.
        (4.0, 8, 0.0, True),
        (2.0, 8, 0.0, False),
    ],
)
def test_still_slow_is_the_probe_excess_on_the_peers_user_latency(
    median_ms, samples, fastest_ms, held
):
    fastest = None if fastest_ms is None else fastest_ms / 1e3
    why = still_slow(median_ms / 1e3, samples, 1.3e-3, 5, 0.4, NO_JITTER, fastest)
    assert (why is not None) is held


def test_the_client_jitter_floor_applies_to_probes_too():
    # 1 ms of client jitter is ln(1 + 1 / 0.35) = 1.35 on the peers' 0.35 ms requests: a
    # probe 0.75 ms slower than that is no longer sure from 8 probes; 4.65 ms slower still is.
    assert still_slow(1.1e-3, 8, 1.3e-3, 30, 0.4, NO_JITTER, 0.35e-3) is not None
    assert still_slow(1.1e-3, 8, 1.3e-3, 30, 0.4, HealthConfig(), 0.35e-3) is None
    assert still_slow(5.0e-3, 8, 1.3e-3, 30, 0.4, HealthConfig(), 0.35e-3) is not None


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


def test_a_host_its_latency_factor_keeps_away_is_probed_and_held_while_slow():
    """h0 answers 2.5 x its peers' latency: no verdict, but a latency factor above 1, which
    keeps a thin client's requests off it (here: none after its factor rose). Without
    user answers its factor would decay and send it requests again while still slow;
    probed, it holds while the probes are slower, and decays once they are not."""
    cluster = Cluster()
    cluster.rtt_ms["h0"] = 5.0
    for _ in range(60):
        cluster.run(0.2, slow_ms=5.0)
        if cluster.stats["h0"].latency_factor > 1.0:
            break
    assert cluster.stats["h0"].latency_factor > 1.0
    assert cluster.state("h0") is HEALTHY
    cluster.run(20.0)  # no user request to h0: its window empties
    assert cluster.stats["h0"].latency_factor > 1.0
    assert ("h0", HELD_AWAY) in cluster.sent
    assert {host for host, _ in cluster.sent} == {"h0"}  # peers with traffic: no probe
    cluster.rtt_ms["h0"] = 0.3
    cluster.run(20.0)  # the slow probes leave the window, then the factor decays
    assert cluster.stats["h0"].latency_factor == 1.0
    assert cluster.state("h0") is HEALTHY
