"""The way back for a penalised host: fresh evidence, hold, relapses (no driver import)."""

from __future__ import annotations

import pytest

from adaptive_lb.clock import ManualClock
from adaptive_lb.config import HealthConfig, TrackingConfig
from adaptive_lb.health import HealthModel, HealthState, HostHealth, assess
from adaptive_lb.health_return import CLEAN_STREAK, MAX_RELAPSES, Evidence, hold_s
from adaptive_lb.stats import HostStats, WindowStats

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
    window = c.model.window_stats("h0")
    assert window is not None and window.latency[99.0] == pytest.approx(7.0, rel=0.01)
    assert c.stats["h0"].window_stats().samples == 0
    c.feed("h0", 5.0, 60)
    c.tick()
    assert c.state() is WARMING  # not SLOW for the stall's answers


def test_a_stalled_host_whose_requests_timed_out_is_probed_after_the_hold():
    c = warmed_up()
    stall(c)
    entered = c.clock.now_ns()
    for _ in range(3):
        c.stats["h0"].on_timeout(2 * S)  # client timeouts: not answers
    states = []
    for _ in range(10):
        c.tick()
        states.append(((c.clock.now_ns() - entered) / S, c.state()))
    first_warming = next(t for t, state in states if state is WARMING)
    assert first_warming == pytest.approx(c.config.min_state_duration)  # not a whole window
    assert c.health().reason.startswith("probing: stalled")


def test_a_failed_probe_is_not_a_relapse_but_an_answered_one_that_stalls_again_is():
    c = warmed_up()
    stall(c)
    for _ in range(3):
        c.stats["h0"].on_timeout(2 * S)
    while c.state() is not WARMING:
        c.tick()
    stall(c, stuck=1)  # the probe hangs too: still the same stall
    assert c.health().evidence.relapses == 0
    c.stats["h0"].on_timeout(2 * S)
    while c.state() is not WARMING:
        c.tick()
    c.feed("h0", 5.0, 5)  # this time it answers...
    c.tick()
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
    assert c.health().reason == f"errors stopped: {CLEAN_STREAK} answers in a row, none failed"
    # Its window (100 errors of 210 requests) restarted: not ERRORING again for them.
    c.feed("h0", 5.0, 60)
    c.tick()
    assert c.state() is WARMING


def test_one_failure_ends_the_clean_streak():
    c = failing()
    c.tick(1.0)
    c.feed("h0", 5.0, CLEAN_STREAK - 1)
    c.tick()
    c.feed("h0", 0, 1, error=True)
    c.feed("h0", 5.0, 5)
    c.tick()
    assert c.state() is ERRORING
    c.feed("h0", 5.0, CLEAN_STREAK - 1)  # 9 answers after the refresh that saw the error
    c.tick()
    assert c.state() is ERRORING
    c.feed("h0", 5.0, 1)
    c.tick()
    assert c.state() is WARMING


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
    held = assess(stalled, window(in_flight=2), 0.005, config, 5 * S, answers=10, failures=4)
    assert held.state is ERRORING and held.evidence == stalled.evidence
    # One more answer, no failure, but a request caught in the stall still in flight: its
    # late answer must not open the new window -- held.
    caught = assess(stalled, window(in_flight=1), 0.005, config, 5 * S, answers=11, failures=4)
    assert caught.state is ERRORING
    # Nothing in flight any more: back.
    back = assess(stalled, window(in_flight=0), 0.005, config, 5 * S, answers=11, failures=4)
    assert back.state is WARMING and back.cause == ""
    assert back.reason == "answering again after a stall: 1 answers, none failed"
    assert back.evidence.returned_ns == 5 * S and back.evidence.answers_at_return == 11
    # One more answer but one more failure too: no streak (a probe, not a return on evidence).
    mixed = assess(stalled, window(in_flight=0), 0.005, config, 5 * S, answers=11, failures=5)
    assert mixed.state is WARMING and mixed.reason.startswith("probing")
    assert mixed.evidence.clean_from == 11


def test_evidence_counts_relapses_only_for_hosts_that_answered_since_their_return():
    back = Evidence().came_back(now_ns=10 * S, answers=100)
    assert back.turned_bad(12 * S, answers=100, window_s=10.0).relapses == 0  # a failed probe
    assert back.turned_bad(12 * S, answers=101, window_s=10.0).relapses == 1
    again = back.turned_bad(12 * S, answers=101, window_s=10.0).came_back(13 * S, 101)
    assert again.turned_bad(14 * S, answers=150, window_s=10.0).relapses == 2
    assert again.turned_bad(14 * S, answers=101, window_s=10.0).relapses == 1  # kept
    assert again.turned_bad(40 * S, answers=150, window_s=10.0).relapses == 0  # long after
