"""The way back for a penalised host: fresh evidence, hold, relapses (no driver import)."""

from __future__ import annotations

import itertools
import threading

import pytest

from adaptive_lb.config import HealthConfig, TrackingConfig
from adaptive_lb.core.clock import ManualClock
from adaptive_lb.health.model import Baseline, HealthModel, HealthState, HostHealth, assess
from adaptive_lb.health.verdict import (
    CLEAN_STREAK,
    MAX_RELAPSES,
    PROBE_BACKOFF,
    Evidence,
    Probe,
    hold_s,
    probe_requests,
    warm_up_s,
)
from adaptive_lb.stats.host import HostStats, WindowStats

MS = 1_000_000
S = 1_000_000_000
HEALTHY, SLOW, ERRORING, WARMING = (
    HealthState.HEALTHY,
    HealthState.SLOW,
    HealthState.ERRORING,
    HealthState.WARMING,
)
REFRESH = 200 * MS


class Cluster:
    """h0..h4 in one datacenter on a manual clock; h1..h4 always answer in 5 ms."""

    def __init__(self, config: HealthConfig | None = None) -> None:
        self.clock = ManualClock(0)
        self.config = config or HealthConfig()
        self.stats = {f"h{i}": HostStats(TrackingConfig(), self.clock) for i in range(5)}
        self.model = HealthModel(self.config, self.clock, window_s=10.0)

    def feed(self, key: str, latency_ms: float, count: int = 1, *, error: bool = False) -> None:
        stats = self.stats[key]
        for _ in range(count):
            stats.on_send()
            if error:
                stats.on_error(int(0.1 * MS), fast=True)
            else:
                stats.on_success(int(latency_ms * MS))

    def tick(self, seconds: float = 0.2) -> None:
        """Let ``seconds`` pass, the peers answering, refreshing every 200 ms."""
        for _ in range(round(seconds / 0.2)):
            self.clock.advance(REFRESH)
            for key in ("h1", "h2", "h3", "h4"):
                self.feed(key, 5.0, 5)
            self.model.refresh(self.stats, dict.fromkeys(self.stats, "dc1"))

    def state(self, key: str = "h0") -> HealthState:
        return self.stats[key].health_state

    def health(self, key: str = "h0") -> HostHealth:
        health = self.model.health(key)
        assert health is not None
        return health


def warmed_up() -> Cluster:
    c = Cluster()
    for key in c.stats:
        c.feed(key, 5.0, 100)
    c.tick()
    assert all(c.state(key) is HEALTHY for key in c.stats)
    return c


def stall(c: Cluster, stuck: int = 3) -> None:
    """h0 stops answering with ``stuck`` requests on it, until the stall rule fires."""
    for _ in range(stuck):
        c.stats["h0"].on_send()
    while c.state() is not ERRORING:
        c.tick()
    assert c.health().cause == "stall"


# ----------------------------------------------------------------- hold


def test_hold_doubles_per_relapse_and_is_bounded_by_the_window():
    assert [hold_s(1.0, r, 10.0) for r in range(7)] == [1.0, 2.0, 4.0, 8.0, 10.0, 10.0, 10.0]
    assert hold_s(1.0, MAX_RELAPSES, 10.0) == 10.0
    assert hold_s(0.0, 5, 10.0) == 0.0  # no hysteresis configured: none added
    assert hold_s(20.0, 3, 10.0) == 20.0  # never below min_state_duration


# ----------------------------------------------------------------- a stall ends


def test_a_stalled_host_that_answers_again_is_warming_at_the_next_refresh():
    c = warmed_up()
    stall(c)
    c.tick(5.0)  # long after the window of the verdict: still stalled, still ERRORING
    assert c.state() is ERRORING
    for _ in range(3):  # the pause ends: the requests caught in it are answered
        c.stats["h0"].on_success(7 * S)
    c.tick()
    assert c.state() is WARMING
    assert c.health().reason.startswith("answering again after a stall: 3 answers")
    # Judged from now on by what it does now: its window restarted without the 7 s answers.
    window = c.model.windows.get("h0")
    assert window is not None and window.latency[99.0] == pytest.approx(7.0, rel=0.01)
    assert c.stats["h0"].window_stats().samples == 0
    c.feed("h0", 5.0, 60)
    c.tick()
    assert c.state() is WARMING  # not SLOW for the stall's answers


def test_a_host_back_from_a_stall_warms_up_for_min_state_duration_not_slow_start():
    c = warmed_up()
    stall(c)
    c.tick(1.0)
    for _ in range(3):  # the pause ends: the requests caught in it are answered
        c.stats["h0"].on_success(3 * S)
    c.tick()
    returned = c.clock.now_ns()
    assert c.state() is WARMING and c.health().warm_up_s == c.config.min_state_duration
    assert c.config.slow_start == 10.0  # what a restarted or erroring host warms up for
    while c.state() is WARMING:
        c.feed("h0", 5.0, 5)
        c.tick()
    assert c.state() is HEALTHY
    assert (c.clock.now_ns() - returned) / S == pytest.approx(c.config.min_state_duration)
    assert warm_up_s(10.0, 1.0) == 1.0 and warm_up_s(0.5, 1.0) == 0.5


def timed_out(c: Cluster, count: int = 3) -> None:
    for _ in range(count):
        c.stats["h0"].on_timeout(2 * S)  # client timeouts: not answers


def test_a_stalled_host_whose_requests_timed_out_is_probed_with_one_request():
    c = warmed_up()
    stall(c)
    entered = c.clock.now_ns()
    timed_out(c)
    while c.health().probe is None:
        c.tick()
    assert (c.clock.now_ns() - entered) / S == pytest.approx(c.config.min_state_duration)
    assert c.state() is ERRORING and c.health().reason.startswith("probing with 1 request")
    h0 = c.stats["h0"]
    assert h0.health_penalty == 1.0 and h0.probe_left == 1  # placed as a healthy host...
    h0.on_send()
    assert h0.health_penalty == 1024.0 and h0.probe_left == 0  # ...for one request only
    c.tick(1.0)
    assert c.state() is ERRORING and h0.health_penalty == 1024.0  # the probe hangs: no second
    h0.on_success(int(1.1 * S))  # the stall ended: the probe is answered
    c.tick()
    assert c.state() is WARMING
    assert c.health().reason == "probe answered after a stall: 1 answers"


def test_a_failed_probe_makes_the_next_wait_longer_and_is_not_a_relapse():
    c = warmed_up()
    stall(c)
    timed_out(c)
    probes = []
    start = c.clock.now_ns()
    for _ in range(150):  # 30 s of a stall that does not end
        c.tick()
        h0 = c.stats["h0"]
        if h0.probe_left:
            probes.append(round((c.clock.now_ns() - start) / S, 1))
            h0.on_send()  # the probe request hangs...
        if h0.in_flight and c.health().probe is None:
            h0.on_timeout(2 * S)  # ...until the client times it out, once judged failed
    assert c.state() is ERRORING
    assert c.health().evidence.relapses == 0 and c.health().evidence.failed_probes >= 3
    gaps = [round(b - a, 1) for a, b in itertools.pairwise(probes)]
    # min_state_duration 1 s, stall_timeout 2 s: a probe is judged failed 2 s after it is
    # sent (no answer), the next one waits 2 holds from then.
    assert probes[0] == pytest.approx(1.0)
    assert gaps and all(gap == pytest.approx(2.0 + PROBE_BACKOFF * 1.0) for gap in gaps), gaps


def test_a_failed_probe_is_not_a_relapse_but_an_answered_one_that_stalls_again_is():
    c = warmed_up()
    stall(c)
    timed_out(c)
    while c.health().probe is None:
        c.tick()
    c.stats["h0"].on_send()  # the probe hangs too: still the same stall
    timed_out(c, 1)
    c.tick()
    assert c.state() is ERRORING and c.health().evidence.relapses == 0
    assert c.health().evidence.failed_probes == 1
    while c.health().probe is None:
        c.tick()
    c.stats["h0"].on_send()
    c.feed("h0", 5.0, 5)  # this time it answers...
    c.tick()
    assert c.state() is WARMING
    c.feed("h0", 5.0, 5)  # ...goes on answering...
    c.tick(1.0)
    stall(c, stuck=1)  # ...then stalls again: flapping
    assert c.health().evidence.relapses == 1


# ----------------------------------------------------------------- errors stop


def failing() -> Cluster:
    c = warmed_up()
    c.feed("h0", 0, 100, error=True)
    c.tick()
    assert c.state() is ERRORING and c.health().cause == "errors"
    return c


def test_an_erroring_host_whose_errors_stopped_returns_after_a_clean_streak():
    c = failing()
    c.tick(1.0)  # the hold
    c.feed("h0", 5.0, CLEAN_STREAK - 1)
    c.tick()
    assert c.state() is ERRORING  # one answer short
    c.feed("h0", 5.0, 1)
    c.tick()
    assert c.state() is WARMING
    assert c.health().reason == f"probe answered: {CLEAN_STREAK} answers in a row, none failed"
    # Its window (100 errors of 210 requests) restarted: not ERRORING again for them.
    c.feed("h0", 5.0, 60)
    c.tick()
    assert c.state() is WARMING


def test_an_erroring_host_is_probed_and_the_first_error_ends_the_probe():
    c = failing()
    c.tick(1.0)  # the hold
    assert c.health().reason.startswith(f"probing with {CLEAN_STREAK} requests")
    h0 = c.stats["h0"]
    assert h0.probe_left == CLEAN_STREAK and h0.health_penalty == 1.0
    c.feed("h0", 5.0, 3)
    assert h0.probe_left == CLEAN_STREAK - 3 and h0.health_penalty == 1.0
    c.feed("h0", 0, 1, error=True)  # still failing: avoided again at once, not at a refresh
    assert h0.probe_left == 0 and h0.health_penalty == 64.0
    c.tick()
    assert c.state() is ERRORING and c.health().probe is None
    assert c.health().reason == f"probe 1 failed (a failure); the next in {PROBE_BACKOFF:g}s"
    c.tick(PROBE_BACKOFF - 0.2)
    assert c.health().probe is None
    c.tick()
    assert c.health().probe is not None and h0.probe_left == CLEAN_STREAK


def test_probe_wait_doubles_once_and_stays_within_the_window():
    assert hold_s(1.0, 0, 10.0, 0) == 1.0
    assert [hold_s(1.0, 0, 10.0, n) for n in (1, 2, 5)] == [2.0, 2.0, 2.0]
    assert hold_s(1.0, 3, 10.0, 1) == 10.0  # a relapsing host's hold, then the window
    assert hold_s(8.0, 0, 10.0, 1) == 10.0
    assert hold_s(20.0, 0, 10.0, 1) == 20.0  # never less than the hold
    assert probe_requests("stall") == 1 and probe_requests("errors") == CLEAN_STREAK


def test_a_clean_streak_of_slow_answers_goes_to_slow_not_warming():
    c = failing()
    c.tick(10.0)  # the errors leave the window
    c.feed("h0", 50.0, 60)
    c.tick()
    assert c.state() is SLOW and c.health().cause == "slow"


def test_no_clean_streak_before_the_hold_has_passed():
    c = failing()
    c.feed("h0", 5.0, 3 * CLEAN_STREAK)
    c.tick()  # 0.2 s after the verdict: min_state_duration (1 s) not over
    assert c.state() is ERRORING
    c.tick(0.8)
    assert c.state() is WARMING


# ----------------------------------------------------------------- relapses


def test_a_relapsing_host_is_held_longer_each_time_up_to_the_window():
    """A host that fails again soon after every return (it answered well in between) waits
    twice as long each time before it may return, at most a window; a long healthy spell
    forgives it."""
    c = failing()
    holds = []
    for _ in range(6):
        entered = c.clock.now_ns()
        while c.state() is ERRORING:  # answers well the whole time it is penalised
            c.feed("h0", 5.0, 2)
            c.tick()
        holds.append(round((c.clock.now_ns() - entered) / S, 1))
        assert c.state() is WARMING
        c.feed("h0", 5.0, 20)
        c.tick(1.0)
        c.feed("h0", 0, 100, error=True)  # relapse
        c.tick()
        assert c.state() is ERRORING
    assert holds == [1.0, 2.0, 4.0, 8.0, 10.0, 10.0]
    assert c.health().evidence.relapses == 6
    # A long healthy spell, then one failure: not a relapse any more.
    while c.state() is not HEALTHY:
        c.feed("h0", 5.0, 2)
        c.tick()
    c.tick(21.0)
    c.feed("h0", 0, 100, error=True)
    c.tick()
    assert c.state() is ERRORING and c.health().evidence.relapses == 0


# ----------------------------------------------------------------- pure rules


def window(requests: int = 0, samples: int = 0, in_flight: int = 0) -> WindowStats:
    return WindowStats(
        requests=requests,
        successes=requests,
        errors=0,
        timeouts=0,
        samples=samples,
        latency={99.0: 0.005 if samples else None},
        in_flight=in_flight,
    )


def test_assess_reads_the_evidence_from_the_totals_it_is_given():
    config = HealthConfig()
    stalled = HostHealth(ERRORING, 0, 64.0, "stalled", cause="stall", evidence=Evidence(10, 4))
    # Same totals as at the verdict: nothing new, requests still in flight -> held.
    held = assess(
        stalled, window(in_flight=2), Baseline(0.005), config, 5 * S, answers=10, failures=4
    )
    assert held.state is ERRORING and held.evidence == stalled.evidence
    # One more answer, no failure, but a request caught in the stall still in flight: its
    # late answer must not open the new window -- held.
    caught = assess(
        stalled, window(in_flight=1), Baseline(0.005), config, 5 * S, answers=11, failures=4
    )
    assert caught.state is ERRORING
    # Nothing in flight any more: back.
    back = assess(
        stalled, window(in_flight=0), Baseline(0.005), config, 5 * S, answers=11, failures=4
    )
    assert back.state is WARMING and back.cause == ""
    assert back.reason == "answering again after a stall: 1 answers, none failed"
    assert back.evidence.returned_ns == 5 * S and back.evidence.answers_at_return == 11
    # One more answer but one more failure too: no streak -- a probe, not a return.
    mixed = assess(
        stalled, window(in_flight=0), Baseline(0.005), config, 5 * S, answers=11, failures=5
    )
    assert mixed.state is ERRORING and mixed.reason.startswith("probing with 1 request")
    assert mixed.probe == Probe(1, 5) and mixed.evidence.clean_from == 11
    # The probe answered: back.
    answered = assess(
        mixed, window(in_flight=0), Baseline(0.005), config, 6 * S, answers=12, failures=5
    )
    assert answered.state is WARMING and answered.probe is None
    # The probe failed: still ERRORING, the next probe later.
    failed = assess(
        mixed, window(in_flight=0), Baseline(0.005), config, 6 * S, answers=11, failures=6
    )
    assert failed.state is ERRORING and failed.probe is None
    assert failed.evidence.failed_probes == 1 and failed.evidence.probe_failed_ns == 6 * S


def test_evidence_counts_relapses_only_for_hosts_that_answered_since_their_return():
    back = Evidence().came_back(now_ns=10 * S, answers=100)
    assert back.turned_bad(12 * S, answers=100, window_s=10.0).relapses == 0  # a failed probe
    assert back.turned_bad(12 * S, answers=101, window_s=10.0).relapses == 1
    again = back.turned_bad(12 * S, answers=101, window_s=10.0).came_back(13 * S, 101)
    assert again.turned_bad(14 * S, answers=150, window_s=10.0).relapses == 2
    assert again.turned_bad(14 * S, answers=101, window_s=10.0).relapses == 1  # kept
    assert again.turned_bad(40 * S, answers=150, window_s=10.0).relapses == 0  # long after


# ----------------------------------------------------------------- the probe's budget


def test_the_probe_budget_is_spent_exactly_once_under_threads():
    stats = HostStats(TrackingConfig(), ManualClock(0))
    stats.start_probe(100, penalty=1.0, after=64.0)
    assert stats.health_penalty == 1.0 and stats.probe_left == 100

    def send() -> None:
        for _ in range(1000):
            stats.on_send()

    threads = [threading.Thread(target=send) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert stats.in_flight == 8000 and stats.underflows == 0
    assert stats.probe_left == 0 and stats.health_penalty == 64.0


def test_a_verdict_ends_the_probe_and_a_timeout_ends_it_at_once():
    stats = HostStats(TrackingConfig(), ManualClock(0))
    stats.start_probe(10, penalty=1.0, after=64.0)
    stats.publish_health(WARMING, 32.0)
    assert stats.probe_left == 0 and stats.health_penalty == 32.0
    stats.on_send()  # no budget left: the verdict's penalty stays
    assert stats.health_penalty == 32.0
    stats.start_probe(10, penalty=1.0, after=64.0)
    stats.on_send()
    stats.on_timeout(2 * S)
    assert stats.probe_left == 0 and stats.health_penalty == 64.0
    stats.start_probe(0, penalty=1.0, after=64.0)  # an empty probe is no probe
    assert stats.health_penalty == 64.0
