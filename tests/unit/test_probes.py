"""Active probes: the scheduler and what an outcome means for health (pure logic, real
HostStats and HealthModel on a manual clock), the sender's outcome classification, and
request tracking leaving probes out of the user's numbers."""

from __future__ import annotations

import itertools
import random
from typing import Any

import pytest
from cassandra import InvalidRequest, OperationTimedOut, Unauthorized
from cassandra.cluster import NoHostAvailable
from cassandra.connection import ConnectionException, ConnectionShutdown
from cassandra.pool import NoConnectionsAvailable
from cassandra.protocol import OverloadedErrorMessage

from adaptive_lb.config import HealthConfig, TrackingConfig
from adaptive_lb.core.clock import ManualClock
from adaptive_lb.health.model import HealthModel, HealthState
from adaptive_lb.health.probes import JITTER, ProbeScheduler
from adaptive_lb.runtime.prober import Prober, outcome_of_exception
from adaptive_lb.stats.host import HostStats
from adaptive_lb.stats.probe_record import ANSWERED, FAILED, TIMEOUT, UNSENT, ProbeRecord
from tests.unit.prober_standins import StandInPolicy, StandInSession

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
    scheduler asked after each refresh, as the policy does; probes are "sent" by noting
    them (the test decides how each ends)."""

    def __init__(self, config: HealthConfig | None = None, probing: bool = True) -> None:
        self.clock = ManualClock(1 * S)
        self.config = config or HealthConfig()
        self.stats = {f"h{i}": HostStats(TrackingConfig(), self.clock) for i in range(3)}
        self.model = HealthModel(self.config, self.clock, window_s=10.0)
        self.model.probing = probing
        self.scheduler = ProbeScheduler(random.Random(1))
        self.live = dict.fromkeys(self.stats, True)
        self.sent: list[tuple[str, str, int]] = []
        """(host, reason, when) of every probe sent."""
        self.stalled: set[str] = set()
        """Hosts whose user requests hang (sent, never answered)."""

    def request(self, key: str, latency_ms: float = 2.0, *, fail: bool = False) -> None:
        stats = self.stats[key]
        stats.on_send()
        if key in self.stalled:
            return
        if fail:
            stats.on_error(MS, fast=True)
        else:
            stats.on_success(round(latency_ms * MS))

    def time_out(self, key: str) -> None:
        """The client-side timeout of a request hung on ``key``."""
        self.stats[key].on_timeout(2 * S)

    def refresh(self) -> None:
        self.clock.advance(200 * MS)
        self.model.refresh(self.stats, dict.fromkeys(self.stats, "dc1"))
        orders = self.scheduler.due(
            ((key, stats, self.live[key]) for key, stats in self.stats.items()),
            self.model.verdicts,
            self.model.windows,
            self.model.stalled,
            self.clock.now_ns(),
            self.config,
        )
        for order in orders:
            if not self.may_send(order):
                continue
            record = order.stats.probes
            assert record.begin(self.clock.now_ns(), order.next_ns, order.reason)
            self.sent.append((str(order.key), order.reason, self.clock.now_ns()))

    def may_send(self, order: Any) -> bool:
        """Whether the probe ``order`` asks for goes out (every one here)."""
        return True

    def answer_probe(self, key: str, outcome: str = ANSWERED) -> None:
        stats = self.stats[key]
        stats.probes.end(outcome, self.clock.now_ns(), stats.errors_total + stats.timeouts_total)

    def traffic(self, seconds: float, hosts: tuple[str, ...] = ("h0", "h1", "h2")) -> None:
        """Each host answers a request every 200 ms, refreshing in between."""
        for _ in range(round(seconds / 0.2)):
            for key in hosts:
                self.request(key)
            self.refresh()

    def state(self, key: str) -> HealthState:
        return self.stats[key].health_state

    def probes_to(self, key: str) -> int:
        return sum(1 for host, _, _ in self.sent if host == key)


def test_healthy_hosts_with_traffic_get_no_probe():
    cluster = Cluster()
    cluster.traffic(10.0)
    assert cluster.sent == []


def test_zero_interval_or_no_sender_sends_nothing():
    cluster = Cluster(HealthConfig(probe_interval=0.0))
    cluster.traffic(1.0)
    cluster.request("h0", fail=True)
    cluster.traffic(2.0, ("h1", "h2"))
    assert cluster.sent == []


def test_a_hung_request_makes_its_host_suspected_then_a_timed_out_probe_stalls_it():
    cluster = Cluster()
    cluster.traffic(1.0)
    cluster.stalled.add("h0")
    cluster.request("h0")  # hangs
    cluster.traffic(0.6, ("h1", "h2"))  # in flight without an answer for >= probe_timeout
    assert cluster.sent and cluster.sent[0][:2] == ("h0", "requests in flight without an answer")
    assert cluster.state("h0") is HEALTHY
    cluster.answer_probe("h0", TIMEOUT)
    cluster.traffic(0.2, ("h1", "h2"))
    health = cluster.model.health("h0")
    assert health is not None and health.state is ERRORING and health.cause == "stall"
    assert cluster.stats["h0"].health_penalty == cluster.config.penalties.stalled
    assert cluster.sent and all(host == "h0" for host, _, _ in cluster.sent)


def test_a_timed_out_probe_of_a_host_that_answers_users_is_no_stall():
    """A busy node (a probe queued behind long scans) still answers its user requests: its
    probe's timeout is no stall verdict. Without user answers meanwhile, it is."""
    cluster = Cluster()
    cluster.traffic(1.0)
    cluster.stalled.add("h0")
    cluster.request("h0")  # hangs: h0 is suspected and probed
    cluster.traffic(0.6, ("h1", "h2"))
    assert cluster.probes_to("h0") == 1
    cluster.stalled.discard("h0")
    cluster.traffic(0.4)  # h0 answers user requests while its probe waits
    cluster.answer_probe("h0", TIMEOUT)
    cluster.traffic(0.4)
    assert cluster.state("h0") is HEALTHY


def test_a_stalled_host_gets_no_user_request_until_a_probe_answers():
    cluster = Cluster()
    cluster.traffic(1.0)
    cluster.stalled.add("h0")
    cluster.request("h0")
    cluster.traffic(0.6, ("h1", "h2"))
    cluster.answer_probe("h0", TIMEOUT)
    cluster.traffic(1.6, ("h1", "h2"))
    cluster.time_out("h0")  # the client's timeout: nothing in flight on it any more
    # Well past the hold: without probes its next request would be placed as healthy.
    for _ in range(20):
        cluster.traffic(0.2, ("h1", "h2"))
        stats = cluster.stats["h0"]
        assert stats.health_state is ERRORING
        assert stats.probe_left == 0
        assert stats.health_penalty == cluster.config.penalties.stalled
        if stats.probes.outstanding:
            cluster.answer_probe("h0", TIMEOUT)
    # Probed about once a second (jittered), never two at a time.
    times = [when for host, _, when in cluster.sent if host == "h0"]
    gaps = [(b - a) / S for a, b in itertools.pairwise(times)]
    assert gaps and min(gaps) >= 1.0 - JITTER - 1e-9
    assert max(gaps) <= 1.0 + JITTER + 0.2 + 1e-9
    # The stall ends: the next probe answers, and the host is HEALTHY at the next refresh.
    cluster.stalled.clear()
    while not cluster.stats["h0"].probes.outstanding:
        cluster.traffic(0.2, ("h1", "h2"))
    cluster.answer_probe("h0")
    cluster.traffic(0.2, ("h1", "h2"))
    assert cluster.state("h0") is HEALTHY
    assert cluster.stats["h0"].health_penalty == cluster.config.penalties.healthy
    health = cluster.model.health("h0")
    assert health is not None and "probe answered" in health.reason


def test_without_probes_the_user_request_is_the_probe():
    cluster = Cluster(probing=False)
    cluster.traffic(1.0)
    cluster.stalled.add("h0")
    cluster.request("h0")
    cluster.traffic(2.2, ("h1", "h2"))  # the stall rule (2 s)
    assert cluster.state("h0") is ERRORING
    cluster.time_out("h0")
    cluster.traffic(1.2, ("h1", "h2"))
    assert cluster.stats["h0"].probe_left == 1
    assert cluster.stats["h0"].health_penalty == cluster.config.penalties.healthy


def test_a_probe_answer_does_not_return_a_stalled_host_before_its_hold():
    cluster = Cluster(HealthConfig(min_state_duration=2.0))
    cluster.traffic(1.0)
    cluster.stalled.add("h0")
    cluster.request("h0")
    cluster.traffic(0.6, ("h1", "h2"))
    cluster.answer_probe("h0", TIMEOUT)
    cluster.traffic(0.2, ("h1", "h2"))
    assert cluster.state("h0") is ERRORING
    cluster.time_out("h0")
    cluster.stalled.clear()
    cluster.traffic(0.8, ("h1", "h2"))
    assert cluster.stats["h0"].probes.outstanding
    cluster.answer_probe("h0")
    cluster.traffic(0.2, ("h1", "h2"))
    assert cluster.state("h0") is ERRORING  # 1.0 s into a 2 s hold
    cluster.traffic(1.0, ("h1", "h2"))
    assert cluster.state("h0") is HEALTHY


def test_an_erroring_host_is_tried_with_user_requests_only_after_a_probe_answered():
    cluster = Cluster()
    cluster.traffic(1.0)
    for _ in range(10):
        cluster.request("h0", fail=True)
    cluster.traffic(0.2, ("h1", "h2"))
    health = cluster.model.health("h0")
    assert health is not None and health.state is ERRORING and health.cause == "errors"
    cluster.traffic(1.2, ("h1", "h2"))  # past the hold: no user-request try yet
    assert cluster.stats["h0"].probe_left == 0
    assert cluster.probes_to("h0") >= 1
    while not cluster.stats["h0"].probes.outstanding:
        cluster.traffic(0.2, ("h1", "h2"))
    cluster.answer_probe("h0")
    cluster.traffic(0.2, ("h1", "h2"))
    stats = cluster.stats["h0"]
    assert stats.health_state is ERRORING  # a probe's answer is not the user's requests
    assert stats.probe_left == 10
    assert stats.health_penalty == cluster.config.penalties.healthy


def test_a_failed_probe_makes_a_healthy_host_erroring():
    cluster = Cluster()
    cluster.traffic(1.0)
    cluster.request("h0", fail=True)  # suspected: a failure, nothing answered since
    cluster.traffic(0.2, ("h1", "h2"))
    assert cluster.sent[-1][:2] == ("h0", "a request failed, none answered since")
    cluster.answer_probe("h0", FAILED)
    cluster.traffic(0.2, ("h1", "h2"))
    health = cluster.model.health("h0")
    assert health is not None and health.state is ERRORING and health.cause == "errors"


def test_a_suspect_answered_by_a_probe_is_cleared():
    cluster = Cluster()
    cluster.traffic(1.0)
    cluster.request("h0", fail=True)
    cluster.traffic(0.2, ("h1", "h2"))
    cluster.answer_probe("h0")
    cluster.traffic(1.6, ("h1", "h2"))  # (from 2 s without an answer: "no fresh answer")
    assert cluster.probes_to("h0") == 1
    assert cluster.state("h0") is HEALTHY


def test_a_host_without_fresh_answers_is_probed_while_the_client_is_busy():
    cluster = Cluster()
    cluster.traffic(1.0)
    cluster.traffic(2.2, ("h1", "h2"))  # h0 gets nothing for 2 s
    assert [reason for host, reason, _ in cluster.sent if host == "h0"] == ["no fresh answer"]


def test_an_idle_client_probes_nothing():
    cluster = Cluster()
    cluster.traffic(1.0)
    for _ in range(30):
        cluster.refresh()
    assert cluster.sent == []


def test_a_slow_host_is_probed_unless_its_traffic_is_fresh():
    cluster = Cluster()
    for _ in range(20):  # suspected, then SLOW on the next interval's answers
        for key in ("h0", "h1", "h2"):
            cluster.request(key, 60.0 if key == "h0" else 2.0)
        cluster.refresh()
    assert cluster.state("h0") is SLOW
    cluster.traffic(2.0, ("h1", "h2"))
    assert "slow" in [reason for host, reason, _ in cluster.sent if host == "h0"]


def test_a_down_host_is_not_probed():
    cluster = Cluster()
    cluster.traffic(1.0)
    cluster.live["h0"] = False
    cluster.request("h0", fail=True)
    cluster.traffic(3.0, ("h1", "h2"))
    assert cluster.probes_to("h0") == 0


def test_probes_never_touch_the_user_counts():
    record = ProbeRecord()
    stats = HostStats(TrackingConfig(), ManualClock(0))
    stats.probes = record
    assert record.begin(0, S, "test")
    assert not record.begin(0, S, "test")  # one outstanding per host
    record.end(ANSWERED, 3 * MS)
    assert record.last_latency_s == pytest.approx(0.003)
    assert record.counts() == {ANSWERED: 1, FAILED: 0, TIMEOUT: 0, UNSENT: 0}
    assert (stats.requests_total, stats.in_flight, stats.window_stats().samples) == (0, 0, 0)


@pytest.mark.parametrize(
    ("exc", "outcome"),
    [
        (OperationTimedOut("x"), TIMEOUT),
        (Unauthorized("no"), ANSWERED),
        (InvalidRequest("no"), ANSWERED),
        (NoHostAvailable("x", {"h": NoConnectionsAvailable()}), UNSENT),
        (NoHostAvailable("x", {"h": ConnectionException("Pool is shutdown")}), UNSENT),
        (NoHostAvailable("x", {"h": ConnectionShutdown("closed")}), FAILED),
        (NoHostAvailable("x", {"h": OverloadedErrorMessage(0x1001, "busy", None)}), FAILED),
        (RuntimeError("x"), FAILED),
    ],
)
def test_a_probe_outcome_from_what_the_driver_delivered(exc, outcome):
    assert outcome_of_exception(exc) == outcome


def test_the_sender_targets_one_host_with_the_probe_timeout_and_counts_the_answer():
    from adaptive_lb.health.probes import PROBE_QUERY, ProbeOrder

    session, policy = StandInSession(), StandInPolicy()
    prober = Prober(session, [policy]).start()
    stats = HostStats(TrackingConfig(), policy.clock)
    policy.sender(ProbeOrder("host-a", stats, "test", S))
    policy.sender(ProbeOrder("host-a", stats, "test", S))  # one outstanding at a time
    assert len(session.calls) == 1
    statement, timeout, host = session.calls[0]
    assert statement is prober.statement and statement.query_string == PROBE_QUERY
    assert (timeout, host) == (0.5, "host-a")
    callback, _, args, _ = session.future.callbacks
    policy.clock.advance(4 * MS)
    callback([], *args)
    assert stats.probes.answered == 1 and stats.probes.last_latency_s == pytest.approx(0.004)
    prober.close()
    assert policy.sender is None
    assert policy.errors == []


def test_request_tracking_leaves_the_probe_statement_alone():
    from adaptive_lb.runtime.tracking import RequestTracker

    class Session:
        cluster = None

        def __init__(self) -> None:
            self.listeners: list[Any] = []

        def add_request_init_listener(self, fn):
            self.listeners.append(fn)

        def remove_request_init_listener(self, fn):
            self.listeners.remove(fn)

    class Future:
        def __init__(self, query: Any) -> None:
            self.query = query

    tracker = RequestTracker(Session())
    tracker._on_request(Future(tracker.prober.statement))
    assert tracker.untracked_requests == 0
    tracker._on_request(Future("SELECT 1"))  # no adaptive policy: untracked, counted
    assert tracker.untracked_requests == 1
    tracker.close()


def test_probes_are_counted_apart_in_the_snapshot_and_prometheus():
    from prometheus_client import CollectorRegistry

    from adaptive_lb.exporters.prometheus import AdaptiveLbCollector
    from tests.unit.test_snapshot import example_policy

    with example_policy() as (policy, _):
        view = next(iter(policy.topology.by_id.values()))
        before = view.stats.requests_total
        record = view.stats.probes
        record.begin(0, S, "stalled")
        record.end(TIMEOUT, 500 * MS)
        record.begin(S, 2 * S, "stalled")
        record.end(ANSWERED, S + 3 * MS)
        host = next(h for h in policy.snapshot().hosts if h.address == str(view.host.address))
        assert (host.probes_sent_total, host.probes_answered_total) == (2, 1)
        assert (host.probes_timeouts_total, host.probes_failed_total) == (1, 0)
        assert host.probe_latency_seconds == pytest.approx(0.003)
        assert host.probe_reason == "stalled"
        assert host.requests_total == before
        registry = CollectorRegistry()
        registry.register(AdaptiveLbCollector(policy))
        labels = {"policy": "0", "address": host.address, "dc": host.datacenter or ""}
        labels["rack"] = host.rack or ""
        sample = registry.get_sample_value
        assert sample("adaptive_lb_host_probes_total", {**labels, "outcome": "timeout"}) == 1
        assert sample("adaptive_lb_host_probes_total", {**labels, "outcome": "answered"}) == 1
        latency = sample("adaptive_lb_host_probe_latency_seconds", labels)
        assert latency == pytest.approx(0.003)
