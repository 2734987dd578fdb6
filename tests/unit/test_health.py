"""Health rules and model: SLOW, ERRORING, WARMING, hysteresis, refresh (no driver import)."""

from __future__ import annotations

import ast
import inspect
import itertools
import logging
import random
import re
import threading
from collections.abc import Hashable

import attrs
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from adaptive_lb.config import HealthConfig, HealthPenalties, TrackingConfig
from adaptive_lb.core.clock import ManualClock
from adaptive_lb.health import model as health
from adaptive_lb.health import peers as peer_groups
from adaptive_lb.health import rules as health_rules
from adaptive_lb.health import verdict as health_verdict
from adaptive_lb.health.evidence import (
    MIN_EVIDENCE,
    error_rate_lower_bound,
    tail_percentiles,
    twice_as_sure,
)
from adaptive_lb.health.model import (
    Baseline,
    HealthModel,
    HealthState,
    HealthTransition,
    HostHealth,
    assess,
    peer_median,
    peer_medians,
    warming_penalty,
)
from adaptive_lb.health.peers import _median_without
from adaptive_lb.stats.host import HostStats, WindowStats

MS = 1_000_000
S = 1_000_000_000
HEALTHY, SLOW, ERRORING, WARMING = (
    HealthState.HEALTHY,
    HealthState.SLOW,
    HealthState.ERRORING,
    HealthState.WARMING,
)


class Cluster:
    """Hosts h0..h4 in one group, fed latencies on a manual clock."""

    def __init__(self, config: HealthConfig | None = None, hosts: int = 5) -> None:
        self.clock = ManualClock(0)
        self.config = config or HealthConfig()
        self.stats = {f"h{i}": HostStats(TrackingConfig(), self.clock) for i in range(hosts)}
        self.groups: dict[Hashable, Hashable] = dict.fromkeys(self.stats, "dc1")
        self.model = HealthModel(self.config, self.clock, window_s=10.0)
        self.transitions: list[HealthTransition] = []

    def feed(self, key: str, latency_ms: float, count: int = 1, error: bool = False) -> None:
        stats = self.stats[key]
        for _ in range(count):
            stats.on_send()
            if error:
                stats.on_error(int(0.1 * MS), fast=True)
            else:
                stats.on_success(int(latency_ms * MS))

    def feed_all(self, latency_ms: float, count: int, **slow: float) -> None:
        for key in self.stats:
            self.feed(key, slow.get(key, latency_ms), count)

    def refresh(self) -> list[HealthTransition]:
        transitions = self.model.refresh(self.stats, self.groups)
        self.transitions.extend(transitions)
        return transitions

    def state(self, key: str) -> HealthState:
        return self.stats[key].health_state

    def penalty(self, key: str) -> float:
        return self.stats[key].health_penalty


def window(
    *,
    latency: float | None = 0.005,
    samples: int = 100,
    requests: int | None = None,
    errors: int = 0,
    percentile: float = 99.0,
) -> WindowStats:
    """A window whose tail is all at ``latency``: at ``percentile`` and at its confidence
    bounds (adaptive_lb.health.evidence.tail_percentiles)."""
    requests = samples + errors if requests is None else requests
    config = HealthConfig(percentile=percentile)
    bounds = tail_percentiles(samples, config) or ()
    strong = tail_percentiles(samples, config, twice_as_sure(config.certainty)) or ()
    tail = dict.fromkeys((*bounds, *strong), latency)
    return WindowStats(
        requests=requests,
        successes=requests - errors,
        errors=errors,
        timeouts=0,
        samples=samples,
        latency={**tail, percentile: latency},
    )


# ----------------------------------------------------------------- SLOW


def test_ten_times_slower_host_becomes_slow_within_one_refresh():
    c = Cluster()
    c.feed_all(5.0, 100, h0=50.0)
    transitions = c.refresh()
    assert [(t.key, t.old.state, t.new.state) for t in transitions] == [("h0", HEALTHY, SLOW)]
    assert c.state("h0") is SLOW and c.penalty("h0") == 64.0
    new = transitions[0].new
    assert new.latency == pytest.approx(0.05, rel=0.01)
    assert new.peer_median == pytest.approx(0.005, rel=0.01)
    assert new.samples == 100
    # Slow through and through: the median settles it at once (adaptive_lb.health.evidence).
    assert new.reason.startswith("p50 0.05") and "= 10.0 x peer median 0.0050s" in new.reason
    assert "100 samples" in new.reason
    assert all(c.state(k) is HEALTHY and c.penalty(k) == 1.0 for k in ("h1", "h2", "h3", "h4"))
    assert c.model.health("h0") == new


def test_slow_host_recovers_through_warming_after_the_window():
    c = Cluster()
    c.feed_all(5.0, 100, h0=50.0)
    c.refresh()
    states, penalties = [], []
    for _ in range(30):
        c.clock.advance_s(1.0)
        c.feed_all(5.0, 20)
        c.refresh()
        states.append(c.state("h0"))
        penalties.append(c.penalty("h0"))
    # SLOW while its slow samples are in the window (up to 10 s), then WARMING for
    # slow_start (10 s), then HEALTHY.
    assert states[:8] == [SLOW] * 8
    first_warming = states.index(WARMING)
    assert 8 <= first_warming <= 10
    assert states[first_warming : first_warming + 9] == [WARMING] * 9
    assert states[-1] is HEALTHY and penalties[-1] == 1.0
    after_slow = penalties[first_warming:]
    assert after_slow[0] == 64.0
    assert after_slow == sorted(after_slow, reverse=True)
    assert [(t.old.state, t.new.state) for t in c.transitions if t.key == "h0"] == [
        (HEALTHY, SLOW),
        (SLOW, WARMING),
        (WARMING, HEALTHY),
    ]


def test_the_tail_rule_needs_min_samples_a_clear_gap_needs_a_few():
    """The p99 rule judges from ``min_samples`` (50) answers, by the lower confidence bound
    of the p99 (of 50 answers: the 5th slowest); a host slow at its median is judged from
    as few answers as the gap allows (adaptive_lb.health.evidence), never fewer than 3."""
    clusters = {}
    for name, latencies in {
        "tail, 49": [5.0] * 43 + [500.0] * 6,  # p99 500 ms, median 5 ms
        "tail of 4, 50": [5.0] * 46 + [500.0] * 4,  # the p99 could still be 5 ms
        "tail, 50": [5.0] * 45 + [500.0] * 5,
        "median, 2": [500.0] * 2,
        "median, 3": [500.0] * 3,
    }.items():
        cluster = clusters[name] = Cluster()
        cluster.feed_all(5.0, 100)
        fresh = cluster.stats["h0"] = HostStats(TrackingConfig(), cluster.clock)
        for latency_ms in latencies:
            fresh.on_send()
            fresh.on_success(int(latency_ms * MS))
        cluster.refresh()
    for name in ("tail, 49", "tail of 4, 50", "median, 2"):
        assert clusters[name].state("h0") is HEALTHY, name
        assert clusters[name].model.health("h0").slowness.suspect_since_ns is None, name
    # A tail is a suspicion at first: the latency factor rises, the verdict waits.
    tail = clusters["tail, 50"]
    assert tail.state("h0") is HEALTHY
    assert tail.model.health("h0").slowness.suspect_since_ns == 0
    assert tail.stats["h0"].latency_factor == 4.0  # 500 ms against a 10 ms threshold: capped
    assert clusters["median, 3"].state("h0") is SLOW
    assert "x peer median 0.0050s, 3 samples" in clusters["median, 3"].model.health("h0").reason


def tail_cluster(slow_ms: float = 60.0) -> Cluster:
    """Five hosts at 5 ms, one of them (h0) with 4 % of its answers ``slow_ms`` late."""
    c = Cluster()
    c.feed_all(5.0, 96)
    c.feed("h0", slow_ms, 4)
    return c


def test_a_tail_only_verdict_needs_the_gap_in_two_disjoint_samples():
    """The tail's bound above the threshold at ``health.certainty`` raises a suspicion;
    the same test on the answers of the window's later intervals alone (none of which the
    first test saw) makes it SLOW, before the window alone is twice as sure."""
    c = tail_cluster()
    states = []
    for _ in range(6):
        c.refresh()
        states.append(c.state("h0"))
        c.clock.advance_s(1.0)
        c.feed_all(5.0, 96)
        c.feed("h0", 60.0, 4)
    # 4 slow of the first 100 answers do not bound the p99 (the 6th slowest does); 8 of
    # 200 do: suspected at 1 s, in the window's first interval (2 s). At 2 s the second
    # interval holds 100 answers, too few; at 3 s, 200: again.
    assert states[:3] == [HEALTHY] * 3, states
    assert states[3:] == [SLOW] * 3, states
    transition = next(t for t in c.transitions if t.key == "h0")
    assert transition.new.since_ns == 3 * S and transition.old.slowness.suspect_since_ns == 1 * S
    reason = transition.new.reason
    assert re.match(r"p97\.2 0\.06\d*s > 0\.0100s = max\(2\.0 x peer median p99", reason), reason
    assert reason.endswith("400 samples; again in the 200 answers of the last 2.0s"), reason


def test_a_burst_that_leaves_the_window_is_never_a_verdict():
    """The same tail for one window only (a burst of the client's own lateness that caught
    five of h0's answers): the suspicion ends when the burst leaves the window."""
    c = tail_cluster()
    seen = set()
    for second in range(30):
        c.refresh()
        seen.add(c.state("h0"))
        if second == 10:
            assert c.model.health("h0").slowness.suspect_since_ns is None  # the burst left
        c.clock.advance_s(1.0)
        c.feed_all(5.0, 100)
    assert seen == {HEALTHY}
    assert c.stats["h0"].latency_factor == 1.0  # the ramp decayed back


def test_the_clients_own_lateness_raises_the_threshold():
    """60 ms answers from a client that was itself 80 ms late in the window are no
    evidence against the host."""
    c = tail_cluster()
    c.model.lateness.observe(c.clock.now_ns(), 0.080)
    c.refresh()
    health = c.model.health("h0")
    assert health.slowness.suspect_since_ns is None and c.stats["h0"].latency_factor == 1.0


def test_slow_floor_protects_fast_hosts():
    c = Cluster()
    c.feed_all(0.2, 100, h0=1.5)  # 7.5x its peers, but under the 2 ms floor
    c.refresh()
    assert c.state("h0") is HEALTHY


def test_peers_are_the_hosts_of_the_same_group():
    c = Cluster(hosts=6)
    c.groups = {"h0": "dc1", "h1": "dc1", "h2": "dc1", "h3": "dc2", "h4": "dc2", "h5": "dc2"}
    c.feed_all(5.0, 100, h3=40.0, h4=40.0, h5=45.0)  # dc2 is far away: all slow alike
    c.refresh()
    assert all(c.state(k) is HEALTHY for k in c.stats)
    assert c.model.health("h5").peer_median == pytest.approx(0.04, rel=0.01)


def test_without_peer_data_nobody_is_slow():
    c = Cluster(hosts=2)
    c.feed("h0", 500.0, 100)
    c.feed("h1", 5.0, 2)  # under 3 answers: no reference (even for adaptive_lb.health.evidence)
    c.refresh()
    assert c.state("h0") is HEALTHY
    assert c.model.health("h0").peer_median is None


def test_two_host_group_compares_each_host_with_the_other():
    c = Cluster(hosts=2)
    c.feed_all(5.0, 100, h0=50.0)
    c.refresh()
    assert (c.state("h0"), c.state("h1")) == (SLOW, HEALTHY)


def test_probing_a_slow_host_that_gets_no_traffic():
    c = Cluster()
    c.feed_all(5.0, 100, h0=50.0)
    c.refresh()
    slow_since = c.clock.now_ns()
    states = []
    for _ in range(12):  # its penalty keeps traffic away: no new samples
        c.clock.advance_s(1.0)
        for key in ("h1", "h2", "h3", "h4"):
            c.feed(key, 5.0, 20)
        c.refresh()
        states.append((c.clock.now_ns() - slow_since, c.state("h0")))
    warming_at = next(t for t, state in states if state is WARMING)
    assert warming_at >= 10 * S  # only after a whole window without evidence
    assert "probing: only 0 samples" in c.model.health("h0").reason
    # Still slow once traffic comes back: straight back to SLOW, no waiting.
    c.feed("h0", 50.0, 60)
    c.refresh()
    assert c.state("h0") is SLOW


def test_a_slow_host_whose_peers_lost_their_data_starts_warming():
    c = Cluster(hosts=2)
    c.feed_all(5.0, 100, h0=50.0)
    c.refresh()
    c.clock.advance_s(11.0)
    c.feed("h0", 50.0, 60)  # h1 idle: no peer median any more
    c.refresh()
    assert c.state("h0") is WARMING
    assert "no peer latency" in c.model.health("h0").reason


# ----------------------------------------------------------------- ERRORING


def test_fast_failing_host_turns_erroring_and_never_looks_fast():
    c = Cluster()
    c.feed_all(5.0, 100)
    c.feed("h0", 0, count=200, error=True)
    transitions = c.refresh()
    assert [t.new.state for t in transitions] == [ERRORING]
    assert c.state("h0") is ERRORING and c.penalty("h0") == 64.0
    assert "error+timeout rate 66.7% > 25.0% over 300 requests" in transitions[0].new.reason
    window_stats = c.model.windows.get("h0")
    assert window_stats is not None
    assert window_stats.latency[50.0] == pytest.approx(0.005, rel=0.01)  # only real answers


def test_stalled_host_turns_erroring_without_min_samples():
    """Requests in flight and no answer for stall_timeout: ERRORING, whatever the window
    holds (a GC-paused node answers nothing, so its window never reaches min_samples)."""
    c = Cluster(HealthConfig(stall_timeout=2.0))
    c.feed_all(5.0, 100)
    stalled = c.stats["h0"]
    for _ in range(3):
        stalled.on_send()  # caught on the node when it stopped
    c.refresh()
    c.clock.advance(1900 * MS)
    for key in ("h1", "h2", "h3", "h4"):
        c.feed(key, 5.0, 10)  # everyone else keeps answering...
        c.stats[key].on_send()  # ...with requests in flight
    assert c.refresh() == [] and c.state("h0") is HEALTHY
    c.clock.advance(200 * MS)
    c.feed("h1", 5.0, 10)
    transitions = c.refresh()
    assert [(t.key, t.new.state) for t in transitions] == [("h0", ERRORING)]
    assert transitions[0].new.reason == "stalled: no answer for 2.1s with 3 requests in flight"
    assert c.penalty("h0") == 1024.0
    # Client timeouts release the attempts (they are not answers). Nothing is in flight on
    # it any more, so after min_state_duration it is probed: still ERRORING, but its next
    # request is placed as if it were healthy -- rather than judged SLOW for a window's
    # length on the p99 of those 3 s timeouts.
    c.clock.advance(1 * S)
    for _ in range(3):
        stalled.on_timeout(3 * S)
    c.refresh()
    assert stalled.in_flight == 0
    assert c.state("h0") is ERRORING and c.penalty("h0") == 1.0
    assert c.model.health("h0").reason.startswith("probing with 1 request: stalled")
    stalled.on_send()  # the probe: one request, then the host is avoided again
    assert stalled.probe_left == 0 and c.penalty("h0") == 1024.0
    stalled.on_success(5 * MS)
    c.refresh()
    assert c.state("h0") is WARMING and c.penalty("h0") == 64.0
    assert c.model.health("h0").reason.startswith("probe answered after a stall")
    assert stalled.window_stats().requests == 0  # the stall's timeouts are forgotten


def test_a_silence_while_the_client_itself_was_stopped_is_no_stall():
    """The client held the GIL for 4 s (a long C call; or it was stopped): its refresh
    thread woke 4 s late, and its first refresh, before the event loop had read the answers
    waiting, saw every host with a request in flight silent for 4 s. Counted in the
    client's own running time, that silence is 0.2 s: no stall. A host that stays silent
    once the client runs again is stalled as before."""
    c = Cluster(HealthConfig(stall_timeout=2.0))
    c.feed_all(5.0, 100)
    for host in c.stats.values():
        host.on_send()
    c.refresh()
    c.clock.advance(4200 * MS)
    c.model.lateness.observe(c.clock.now_ns(), 4.0)  # as the refresh thread measures it
    assert c.refresh() == [] and all(c.state(key) is HEALTHY for key in c.stats)
    for key in ("h1", "h2", "h3", "h4"):
        c.feed(key, 5.0, 10)  # the answers that waited, read now
        c.stats[key].on_send()
    c.clock.advance(1700 * MS)
    for key in ("h1", "h2", "h3", "h4"):
        c.feed(key, 5.0, 10)
    assert c.refresh() == [] and c.state("h0") is HEALTHY  # 1.9 s of its own time
    c.clock.advance(200 * MS)
    transitions = c.refresh()
    assert [(t.key, t.new.state) for t in transitions] == [("h0", ERRORING)]
    assert transitions[0].new.reason == "stalled: no answer for 2.1s with 1 requests in flight"


def test_a_stalled_host_stays_erroring_while_it_stays_stalled():
    c = Cluster(HealthConfig(stall_timeout=1.0, min_state_duration=0.5))
    c.feed_all(5.0, 100)
    c.stats["h0"].on_send()
    c.refresh()
    c.clock.advance(1 * S)
    c.refresh()
    assert c.state("h0") is ERRORING
    # Well past min_state_duration and the window (no fresh evidence): still stalled, so
    # no probing -- the request that hangs on it is the evidence.
    for _ in range(30):
        c.clock.advance(500 * MS)
        for key in ("h1", "h2", "h3", "h4"):
            c.feed(key, 5.0, 10)
        c.refresh()
        assert c.state("h0") is ERRORING
    # It answers: the stall is over and the usual way back applies (probing: WARMING).
    c.stats["h0"].on_success(15 * S)
    c.clock.advance(200 * MS)
    c.refresh()
    assert c.state("h0") is WARMING


def test_busy_host_that_keeps_answering_is_not_stalled():
    c = Cluster(HealthConfig(stall_timeout=0.5))
    for _ in range(40):
        for stats in c.stats.values():
            stats.on_send()
            stats.on_send()
            stats.on_success(5 * MS)  # one answered, one still in flight: always busy
        c.clock.advance(100 * MS)
        c.refresh()
    assert all(c.state(k) is HEALTHY for k in c.stats)
    assert all(s.in_flight == 40 for s in c.stats.values())


def test_idle_host_is_not_stalled_and_zero_disables_the_rule():
    c = Cluster(HealthConfig(stall_timeout=0.0))
    c.stats["h0"].on_send()
    for _ in range(20):
        c.clock.advance(1 * S)
        c.refresh()
    assert c.state("h0") is HEALTHY  # disabled
    c = Cluster(HealthConfig(stall_timeout=1.0))
    for _ in range(20):  # nothing in flight anywhere: nothing is stalled
        c.clock.advance(1 * S)
        c.refresh()
    assert all(c.state(k) is HEALTHY for k in c.stats)


def test_assess_stall_rule_is_pure():
    config = HealthConfig(stall_timeout=2.0)
    healthy = HostHealth.initial(0, config)
    empty = window(latency=None, samples=0)
    assert assess(healthy, empty, Baseline(), config, 5 * S, stalled_s=1.99).state is HEALTHY
    verdict = assess(healthy, empty, Baseline(), config, 5 * S, stalled_s=2.0)
    assert (verdict.state, verdict.since_ns, verdict.penalty) == (ERRORING, 5 * S, 1024.0)
    off = HealthConfig(stall_timeout=0.0)
    assert assess(healthy, empty, Baseline(), off, 5 * S, stalled_s=100.0).state is HEALTHY


def test_erroring_needs_min_samples_requests_or_sure_evidence():
    c = Cluster()
    c.feed_all(5.0, 100)
    c.stats["h0"] = HostStats(TrackingConfig(), c.clock)
    c.feed("h0", 0, count=3, error=True)
    c.refresh()
    assert c.state("h0") is HEALTHY  # 3 answers are never enough
    c.feed("h0", 0, count=1, error=True)
    c.refresh()
    assert c.state("h0") is ERRORING  # 4 failures in 4: surely above 25 %
    assert "4 of 4 requests failed" in c.model.health("h0").reason
    # 30 % over 49 requests is not sure to be above 25 %; over 50 the tail rule decides.
    tail = Cluster()
    tail.feed_all(5.0, 100)
    tail.stats["h0"] = HostStats(TrackingConfig(), tail.clock)
    tail.feed("h0", 5.0, count=34)
    tail.feed("h0", 0, count=15, error=True)
    tail.refresh()
    assert tail.state("h0") is HEALTHY
    tail.feed("h0", 0, count=1, error=True)
    tail.refresh()
    assert tail.state("h0") is ERRORING
    assert "over 50 requests" in tail.model.health("h0").reason


def test_erroring_wins_over_slow():
    c = Cluster()
    c.feed_all(5.0, 100, h0=50.0)
    c.feed("h0", 0, count=100, error=True)
    c.refresh()
    assert c.state("h0") is ERRORING


def test_slow_host_that_starts_failing_turns_erroring_at_once():
    c = Cluster(HealthConfig(min_state_duration=5.0))
    c.feed_all(5.0, 100, h0=50.0)
    c.refresh()
    assert c.state("h0") is SLOW
    c.feed("h0", 0, count=100, error=True)
    c.refresh()  # no time passed: getting worse never waits
    assert c.state("h0") is ERRORING


def test_erroring_leaves_only_below_the_recovery_threshold():
    config = HealthConfig(error_rate=0.2, recovery_factor=0.5, min_state_duration=0.0)
    c = Cluster(config)
    c.feed_all(5.0, 100)
    c.feed("h0", 0, count=40, error=True)  # 40 / 140 = 29 %
    c.refresh()
    assert c.state("h0") is ERRORING
    # Each batch still has an error: no clean streak, so only the window's rate counts.
    c.feed("h0", 5.0, count=59)
    c.feed("h0", 0, count=1, error=True)  # 41 / 200 = 20.5 %: above 10 % recovery
    c.refresh()
    assert c.state("h0") is ERRORING
    c.feed("h0", 5.0, count=299)
    c.feed("h0", 0, count=1, error=True)  # 42 / 500 = 8.4 %
    transitions = c.refresh()
    assert c.state("h0") is WARMING
    assert transitions[0].new.reason.startswith("recovered: error+timeout rate 8.4%")


def test_erroring_host_that_recovers_but_is_slow_goes_to_slow():
    c = Cluster(HealthConfig(min_state_duration=0.0))
    c.feed_all(5.0, 100)
    c.feed("h0", 0, count=100, error=True)
    c.refresh()
    c.clock.advance_s(11.0)
    c.feed_all(5.0, 100, h0=50.0)
    c.refresh()
    assert c.state("h0") is SLOW


# ----------------------------------------------------------------- WARMING


def test_warming_penalty_decays_monotonically_to_exactly_one():
    values = [warming_penalty(64.0, t / 10, 10.0) for t in range(-5, 121)]
    assert values[5] == 64.0 and values[0] == 64.0  # t <= 0: the full penalty
    assert values == sorted(values, reverse=True)
    assert values[105] == 1.0 and values[-1] == 1.0
    assert all(v > 1.0 for v in values[:105])
    # A linear ramp of the traffic weight: half-way, the host gets about half its share.
    assert 1 / warming_penalty(64.0, 5.0, 10.0) == pytest.approx(1 / 64 + (1 - 1 / 64) / 2)
    assert warming_penalty(64.0, 0.0, 0.0) == 1.0
    assert warming_penalty(4.0, 1.0, 10.0, end=8.0) == 8.0


@given(
    start=st.floats(1.0, 1000.0),
    slow_start=st.floats(0.0, 120.0),
    times=st.lists(st.floats(-10.0, 200.0), min_size=2, max_size=20),
)
def test_warming_penalty_is_monotone_and_bounded(start, slow_start, times):
    values = [warming_penalty(start, t, slow_start) for t in sorted(times)]
    assert all(1.0 <= v <= start for v in values)
    assert all(a >= b for a, b in itertools.pairwise(values))
    assert all(v == 1.0 for t, v in zip(sorted(times), values, strict=True) if t >= slow_start)


def test_mark_up_starts_warming_which_decays_then_turns_healthy():
    c = Cluster()
    c.feed_all(5.0, 100)
    transition = c.model.mark_up("h1", c.stats["h1"])
    assert (transition.old.state, transition.new.state) == (HEALTHY, WARMING)
    assert c.state("h1") is WARMING and c.penalty("h1") == 64.0
    assert c.model.pop_unreported("h1") == transition
    assert c.model.pop_unreported("h1") is None
    penalties = []
    for _ in range(11):
        c.clock.advance_s(1.0)
        c.feed_all(5.0, 10)
        c.refresh()
        penalties.append(c.penalty("h1"))
    assert penalties == sorted(penalties, reverse=True)
    assert penalties[0] < 64.0 and penalties[-1] == 1.0 and c.state("h1") is HEALTHY


def test_zero_slow_start_skips_warming():
    c = Cluster(HealthConfig(slow_start=0.0, min_state_duration=0.0))
    c.model.mark_up("h1", c.stats["h1"])
    assert c.state("h1") is HEALTHY and c.penalty("h1") == 1.0
    c.feed_all(5.0, 100, h0=50.0)
    c.refresh()
    c.clock.advance_s(11.0)
    c.feed_all(5.0, 100)
    c.refresh()
    assert c.state("h0") is HEALTHY  # recovered straight to HEALTHY


def test_warming_host_that_turns_slow_or_erroring_goes_there_at_once():
    c = Cluster()
    c.feed_all(5.0, 100, h0=50.0)
    c.model.mark_up("h0", c.stats["h0"])
    c.model.mark_up("h1", c.stats["h1"])
    c.feed("h1", 0, count=100, error=True)
    c.refresh()
    assert (c.state("h0"), c.state("h1")) == (SLOW, ERRORING)


def test_custom_penalties_are_applied():
    penalties = HealthPenalties(healthy=1.0, slow=16.0, erroring=100.0, warming=8.0)
    c = Cluster(HealthConfig(penalties=penalties))
    c.feed_all(5.0, 100, h0=50.0)
    c.feed("h1", 0, count=100, error=True)
    c.model.mark_up("h2", c.stats["h2"])
    assert c.penalty("h2") == 8.0
    c.refresh()
    assert (c.penalty("h0"), c.penalty("h1"), c.penalty("h3")) == (16.0, 100.0, 1.0)


# ----------------------------------------------------------------- hysteresis


def test_min_state_duration_holds_a_bad_state():
    config = HealthConfig(min_state_duration=5.0)
    c = Cluster(config)
    c.feed_all(5.0, 100, h0=50.0)
    c.refresh()
    c.clock.advance_s(2.1)
    c.stats["h0"] = HostStats(TrackingConfig(), c.clock)
    c.feed("h0", 5.0, count=200)  # looks fine now, but only 2.1 s in SLOW
    c.refresh()
    assert c.state("h0") is SLOW
    c.clock.advance_s(2.8)
    c.feed("h0", 5.0, count=10)
    c.refresh()
    assert c.state("h0") is SLOW  # 4.9 s
    c.clock.advance_s(0.2)
    c.refresh()
    assert c.state("h0") is WARMING


def test_slow_is_left_only_below_the_recovery_threshold():
    config = HealthConfig(min_state_duration=0.0, outlier_factor=3.0)
    c = Cluster(config)
    c.feed_all(5.0, 100, h0=20.0)  # 4x: SLOW (threshold 15 ms)
    c.refresh()
    assert c.state("h0") is SLOW
    c.stats["h0"] = HostStats(TrackingConfig(), c.clock)
    c.feed("h0", 13.0, 200)  # below the entry threshold, above 0.8 x 15 = 12 ms
    c.refresh()
    assert c.state("h0") is SLOW
    c.stats["h0"] = HostStats(TrackingConfig(), c.clock)
    c.feed("h0", 11.0, 200)
    c.refresh()
    assert c.state("h0") is WARMING


@settings(max_examples=30, deadline=None)
@given(
    seed=st.integers(0, 2**32 - 1),
    sigma=st.floats(0.05, 0.5),
    spike=st.floats(1.0, 1.8),
    spike_rate=st.floats(0.0, 0.05),
)
def test_noisy_but_healthy_hosts_never_leave_healthy(seed, sigma, spike, spike_rate):
    """Every host draws from the same lognormal; occasional spikes stay below the default
    outlier factor (2x). Nobody may be judged SLOW or ERRORING, in any of 30 refreshes."""
    rng = random.Random(seed)
    c = Cluster()
    for _ in range(30):
        c.clock.advance_s(0.5)
        for key in c.stats:
            for _ in range(30):
                latency = 5.0 * rng.lognormvariate(0, sigma)
                if rng.random() < spike_rate:
                    latency *= spike
                c.feed(key, latency)
        c.refresh()
        assert all(s.health_state is HEALTHY for s in c.stats.values())
    assert c.transitions == []


@settings(max_examples=25, deadline=None)
@given(
    seed=st.integers(0, 2**32 - 1),
    low=st.floats(2.0, 3.0),
    high=st.floats(3.0, 4.0),
)
def test_host_hovering_at_the_threshold_does_not_flap(seed, low, high):
    """h0's p99 hovers around 3x its peers': it may enter SLOW, but leaving needs 0.8 x
    the threshold, so it never comes back out."""
    rng = random.Random(seed)
    c = Cluster(HealthConfig(min_state_duration=1.0, outlier_factor=3.0))
    for _ in range(60):
        c.clock.advance_s(0.25)
        factor = rng.uniform(low, high)
        c.feed_all(5.0, 20, h0=5.0 * factor)
        c.refresh()
    h0 = [(t.old.state, t.new.state) for t in c.transitions if t.key == "h0"]
    assert h0 in ([], [(HEALTHY, SLOW)])
    assert all(t.key == "h0" for t in c.transitions)


@settings(max_examples=12, deadline=None)
@given(
    seed=st.integers(0, 2**32 - 1),
    dwell=st.sampled_from([0.5, 1.0, 3.0]),
    slow_start=st.sampled_from([0.0, 2.0, 10.0]),
)
def test_state_changes_respect_min_state_duration(seed, dwell, slow_start):
    """Whatever h0 does (fast, slow, failing, in bursts), it never leaves a state other than
    HEALTHY sooner than min_state_duration after entering it, and reaches HEALTHY again only
    after a full warm-up: penalties go up at once and come down slowly."""
    rng = random.Random(seed)
    config = HealthConfig(min_state_duration=dwell, slow_start=slow_start)
    c = Cluster(config)
    phase = "fast"
    for _ in range(200):
        c.clock.advance_s(0.2)
        if rng.random() < 0.15:
            phase = rng.choice(["fast", "slow", "failing", "idle"])
        for key in ("h1", "h2", "h3", "h4"):
            c.feed(key, 5.0 * rng.lognormvariate(0, 0.2), 15)
        if phase == "fast":
            c.feed("h0", 5.0 * rng.lognormvariate(0, 0.2), 15)
        elif phase == "slow":
            c.feed("h0", 5.0 * rng.uniform(1.0, 10.0), 15)
        elif phase == "failing":
            c.feed("h0", 0, 15, error=True)
        c.refresh()
    for transition in c.transitions:
        old, new = transition.old, transition.new
        held = (new.since_ns - old.since_ns) / S
        worse = (new.state is ERRORING and old.state is not ERRORING) or (
            new.state is SLOW and old.state in (HEALTHY, WARMING)
        )
        if not worse:
            assert held >= dwell  # getting better waits
        if new.state is HEALTHY:
            if slow_start:
                assert old.state is WARMING and held >= max(dwell, slow_start)
            else:  # no warm-up: recovered straight from the bad state
                assert old.state in (SLOW, ERRORING) and held >= dwell
        assert (
            new.penalty
            == {
                HEALTHY: 1.0,
                SLOW: 64.0,
                ERRORING: 1024.0 if new.cause == "stall" else 64.0,
                WARMING: 64.0 if slow_start else 1.0,
            }[new.state]
        )


# ----------------------------------------------------------------- assess (pure)


def settled(state: HealthState, penalty: float = 64.0) -> HostHealth:
    return HostHealth(state, 0, penalty)


def test_assess_is_pure_and_keeps_the_numbers():
    config = HealthConfig()
    previous = settled(HEALTHY, 1.0)
    stats = window(latency=0.004, samples=80, errors=20)
    first = assess(previous, stats, Baseline(0.005), config, 5 * S)
    assert first == assess(previous, stats, Baseline(0.005), config, 5 * S)
    assert (first.state, first.since_ns, first.penalty) == (HEALTHY, 0, 1.0)
    assert (first.latency, first.peer_median, first.samples, first.requests) == (
        0.004,
        0.005,
        80,
        100,
    )
    assert first.error_rate == pytest.approx(0.2)


def test_a_slow_host_still_suspected_is_not_recovered():
    # test_slow_node_gets_almost_nothing[32] beside a CPU hog, judged by the median: the
    # +20 ms host's 60 answers at 41 ms against its peers' 12.9 ms, the client mostly 4 ms
    # late, once 35 ms. 41 ms is below 0.8 x (2 x 12.9 ms + 35 ms), the threshold with what
    # the client may add to one answer; it was WARMING (then HEALTHY) a second after its
    # verdict. Its median is still suspected: not clearly back to normal, so still SLOW.
    config = HealthConfig(percentile=50.0)
    stats = window(latency=0.041, samples=60, percentile=50.0)
    levels = tuple(sorted([0.004] * 99 + [0.035]))
    suspected = Baseline(tail=0.0129, typical=0.0129, lateness_levels=levels)
    slow = settled(SLOW)
    still = assess(slow, stats, suspected, config, 60 * S)
    assert still.state is SLOW and still.slowness.suspect_since_ns is not None
    assert still.slowness.why is None  # suspected, not (again) a verdict
    # Back within its peers' range (no suspicion): recovered.
    fast = window(latency=0.015, samples=60, percentile=50.0)
    back = assess(slow, fast, suspected, config, 60 * S)
    assert back.state is WARMING and back.reason.startswith("recovered: p50 0.0150s"), back


def test_a_client_that_ran_late_once_forgives_no_slow_host():
    # test_slow_node_gets_almost_nothing[32] in CI: the +20 ms host's 32 answers at 40 ms
    # against its peers' 15.9 ms, too few for its median to stay suspected (2.5 x, just
    # past the factor 2), and the client once 0.67 s late (its load loop ending). The
    # threshold with that lateness added (0.70 s) forgave it at once: WARMING, HEALTHY two
    # seconds later, 8.8 % of the requests. A client running late weakens the evidence both
    # ways: it never makes a slow host look recovered.
    config = HealthConfig(percentile=50.0, min_samples=20)  # the test's STEADY
    stats = window(latency=0.0402, samples=32, percentile=50.0)
    levels = tuple(sorted([0.003] * 39 + [0.666]))
    late_once = Baseline(tail=0.0159, typical=0.0159, spread=0.35, lateness_levels=levels)
    slow = settled(SLOW)
    still = assess(slow, stats, late_once, config, 60 * S)
    assert still.slowness.suspect_since_ns is None  # no suspicion holds it
    assert still.state is SLOW, still.reason
    back = assess(
        slow, window(latency=0.016, samples=32, percentile=50.0), late_once, config, 60 * S
    )
    assert back.state is WARMING and "< 0.8 x 0.0318s" in back.reason, back.reason


def test_assess_uses_the_configured_percentile():
    config = HealthConfig(percentile=95.0)
    stats = window(latency=0.1, percentile=95.0)
    # Its p95 20 x its peers': SLOW at once (a tail of 100 answers bounded twice as surely:
    # its 82nd percentile, read at the configured percentile's bound, not the p99's).
    tail = assess(settled(HEALTHY, 1.0), stats, Baseline(0.005), config, S)
    assert tail.state is SLOW and tail.reason.startswith("p82 0.1000s"), tail.reason
    assert "peer median p95 0.0050s" in tail.reason, tail.reason
    other = window(latency=0.1, percentile=99.0)
    first = assess(settled(HEALTHY, 1.0), other, Baseline(0.005), config, S)
    assert first.state is HEALTHY and first.slowness.suspect_since_ns is None


@settings(max_examples=200, deadline=None)
@given(
    steps=st.lists(
        st.tuples(
            st.floats(0.0, 3.0),  # seconds since the previous assessment
            st.one_of(st.none(), st.floats(0.0001, 0.5)),  # latency
            st.one_of(st.none(), st.floats(0.0001, 0.05)),  # peer median
            st.integers(0, 200),  # samples
            st.integers(0, 200),  # errors
        ),
        min_size=1,
        max_size=40,
    ),
    start=st.sampled_from([HEALTHY, SLOW, ERRORING, WARMING]),
)
def test_assess_invariants(steps, start):
    config = HealthConfig()
    penalties = config.penalties
    now = 0
    previous = HostHealth(
        start, 0, penalties.healthy if start is HEALTHY else penalties.warming, "start"
    )
    for advance, latency, peers, samples, errors in steps:
        now += round(advance * S)
        stats = window(latency=latency if samples else None, samples=samples, errors=errors)
        new = assess(previous, stats, Baseline(peers), config, now)
        held = (now - previous.since_ns) / S
        if new.state is not previous.state:
            assert new.since_ns == now
            if previous.state is not HEALTHY and new.state not in (SLOW, ERRORING):
                assert held >= config.min_state_duration
            if new.state is SLOW:
                assert latency is not None and peers is not None and samples >= 50
                assert latency > config.outlier_factor * peers and latency > config.slow_floor
            if new.state is ERRORING:
                requests = samples + errors
                sure = error_rate_lower_bound(errors, requests, config.certainty)
                assert requests >= MIN_EVIDENCE and stats.error_rate > config.error_rate
                assert requests >= 50 or sure > config.error_rate
        else:
            assert new.since_ns == previous.since_ns
        if new.state is WARMING:
            assert 1.0 <= new.penalty <= penalties.warming
            if previous.state is WARMING:
                assert new.penalty <= previous.penalty
        else:
            expected = {HEALTHY: penalties.healthy, SLOW: penalties.slow}
            assert new.penalty == expected.get(new.state, penalties.erroring)
        previous = new


# ----------------------------------------------------------------- peer median


def test_peer_median_ignores_missing_values():
    assert peer_median([]) is None
    assert peer_median([None, None]) is None
    assert peer_median([0.003, None, 0.001, 0.002]) == 0.002
    assert peer_median([0.004, 0.001]) == 0.0025


@given(st.lists(st.floats(0.0, 10.0), min_size=1, max_size=30), st.data())
def test_median_without_one_host_equals_the_median_of_the_others(values, data):
    index = data.draw(st.integers(0, len(values) - 1))
    others = values[:index] + values[index + 1 :]
    assert _median_without(sorted(values), values[index]) == peer_median(others)


@settings(max_examples=100, deadline=None)
@given(
    hosts=st.lists(
        st.tuples(
            st.sampled_from(["dc1", "dc2", None]),  # group (None: missing from groups)
            st.one_of(st.none(), st.floats(0.0001, 1.0)),  # latency at the percentile
            st.integers(0, 120),  # samples
        ),
        max_size=12,
    )
)
def test_peer_medians_are_the_medians_of_the_other_qualified_hosts_of_the_group(
    hosts: list[tuple[str | None, float | None, int]],
) -> None:
    config = HealthConfig()
    windows = {
        f"h{i}": window(latency=latency, samples=samples)
        for i, (_, latency, samples) in enumerate(hosts)
    }
    groups = {f"h{i}": group for i, (group, _, _) in enumerate(hosts) if group is not None}

    def qualified(key: str) -> float | None:
        w = windows[key]
        return w.latency[99.0] if w.samples >= config.min_samples else None

    expected = {
        key: peer_median(
            qualified(other)
            for other in windows
            if other != key and groups.get(other) == groups.get(key)
        )
        for key in windows
    }
    assert peer_medians(windows, groups, config) == expected


def test_health_reexports_every_rule() -> None:
    # The verdict's module holds the ways back too; those stay there.
    for module, names in (
        (health_rules, health_rules.__all__),
        (health_verdict, ["HostHealth", "warming_penalty"]),
    ):
        for name in names:
            assert getattr(health, name) is getattr(module, name)
        assert set(names) <= set(health.__all__)
    for name in ("peer_median", "peer_medians"):
        assert getattr(health, name) is getattr(peer_groups, name)
        assert name in health.__all__


def imported_modules(module: object) -> set[str]:
    tree = ast.parse(inspect.getsource(module))  # type: ignore[arg-type]
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            names.add(node.module)
    return names


def test_the_rules_are_pure_and_the_health_modules_import_no_driver() -> None:
    for pure in (health_rules, health_verdict):
        rules = imported_modules(pure)
        assert not rules & {"threading", "logging", "time", "adaptive_lb.core.clock"}, rules
    for module in (health_rules, health_verdict, health):
        assert not any(name.split(".")[0] == "cassandra" for name in imported_modules(module))


# ----------------------------------------------------------------- the model


def test_maybe_refresh_respects_the_interval():
    c = Cluster(HealthConfig(refresh_interval=0.25))
    assert c.model.maybe_refresh(c.stats, c.groups) == []
    assert c.model.maybe_refresh(c.stats, c.groups) is None
    c.clock.advance_s(0.1)
    assert c.model.maybe_refresh(c.stats, c.groups) is None
    c.clock.advance_s(0.15)
    assert c.model.maybe_refresh(c.stats, c.groups) == []
    assert c.model.refreshes == 2


class BlockingStats(HostStats):
    """A host whose window computation waits until released (a refresh in progress)."""

    __slots__ = ("entered", "release")

    def __init__(self, clock: ManualClock) -> None:
        super().__init__(TrackingConfig(), clock)
        self.entered = threading.Event()
        self.release = threading.Event()

    def window_stats(self, percentiles=(50.0, 95.0, 99.0), more=None) -> WindowStats:
        self.entered.set()
        assert self.release.wait(10.0)
        return super().window_stats(percentiles, more)


def start_blocked_refresh(c: Cluster, key: str = "h0") -> tuple[threading.Thread, BlockingStats]:
    blocking = BlockingStats(c.clock)
    c.stats[key] = blocking
    stats = dict(c.stats)
    thread = threading.Thread(target=c.model.maybe_refresh, args=(stats, c.groups))
    thread.start()
    assert blocking.entered.wait(10.0)
    return thread, blocking


def test_only_one_thread_refreshes_and_the_others_do_not_wait():
    c = Cluster()
    thread, blocking = start_blocked_refresh(c)
    try:
        c.clock.advance_s(1.0)
        assert c.model.maybe_refresh(c.stats, c.groups) is None  # busy: returns at once
    finally:
        blocking.release.set()
        thread.join()
    assert c.model.refreshes == 1


def test_forget_and_mark_up_during_a_refresh_are_not_undone():
    c = Cluster()
    c.feed_all(5.0, 100, h2=50.0)
    thread, blocking = start_blocked_refresh(c)
    try:
        c.model.forget("h1")
        c.model.mark_up("h3", c.stats["h3"])
    finally:
        blocking.release.set()
        thread.join()
    assert c.model.health("h1") is None and c.model.windows.get("h1") is None
    assert c.state("h3") is WARMING and c.model.health("h3").state is WARMING
    assert c.state("h2") is SLOW


def test_window_stats_are_kept_from_the_last_refresh():
    c = Cluster()
    assert c.model.windows.get("h0") is None
    c.feed_all(5.0, 100)
    c.refresh()
    kept = c.model.windows.get("h0")
    assert kept is not None and kept.samples == 100
    # ...and the percentiles the p99's confidence bounds are read at (of 100 answers: the
    # 6th slowest and the slowest; at twice the certainty, a verdict from one sample: the
    # 9th slowest and the slowest).
    assert set(kept.latency) == {10.0, 50.0, 92.0, 95.0, 99.0, 100.0}
    c.feed("h0", 5.0, 10)
    assert c.model.windows.get("h0") is kept  # no recomputation until the next refresh


def test_forget_drops_the_host():
    c = Cluster()
    c.feed_all(5.0, 100, h0=50.0)
    c.refresh()
    c.model.forget("h0")
    assert c.model.health("h0") is None and c.model.windows.get("h0") is None
    assert c.model.pop_unreported("h0") is None


def test_reconfigure_applies_at_the_next_refresh():
    c = Cluster(HealthConfig(outlier_factor=3.0))
    c.feed_all(5.0, 100, h0=12.0)  # 2.4x: not slow with a factor 3
    c.refresh()
    assert c.state("h0") is HEALTHY
    c.model.reconfigure(attrs.evolve(c.config, outlier_factor=2.0))
    c.refresh()
    assert c.state("h0") is SLOW


def test_transitions_are_logged_with_their_numbers(caplog):
    c = Cluster()
    c.feed_all(5.0, 100, h0=50.0)
    with caplog.at_level(logging.INFO, logger="adaptive_lb.health"):
        c.refresh()
    (record,) = caplog.records
    assert record.levelno == logging.INFO and record.name == "adaptive_lb.health"
    message = record.getMessage()
    assert "h0" in message and "healthy -> slow" in message and "penalty 64.0" in message
    assert "peer median 0.0050s" in message and "100 samples" in message


def test_a_stall_that_caught_only_untracked_requests_still_makes_the_host_suspected():
    """Under sampling the driver's pools hold requests the window never saw: with some in
    flight and no tracked or probe answer, the host is suspected (``unanswered``) and
    probed, whichever requests happened to be tracked; the stall rule (tracked attempts)
    stays quiet, the probe decides."""
    from adaptive_lb.health.probes import ProbeScheduler

    c = Cluster(HealthConfig(probe_timeout=0.5))
    c.feed_all(5.0, 100)
    pool = {"h0": 0}
    c.stats["h0"].read_in_flight_from(lambda: pool["h0"])
    c.refresh()
    pool["h0"] = 3  # stalled: three untracked requests hang on it
    c.refresh()
    c.clock.advance_s(0.6)
    for key in ("h1", "h2", "h3", "h4"):
        c.feed(key, 5.0, 10)
    c.refresh()
    assert c.model.stalled["h0"] == 0.0  # nothing tracked in flight
    assert c.model.unanswered["h0"] == pytest.approx(0.6)
    assert c.model.unanswered["h1"] == 0.0
    orders = ProbeScheduler(random.Random(1)).due(
        ((key, stats, True) for key, stats in c.stats.items()),
        c.model.verdicts,
        c.model.windows,
        c.model.unanswered,
        c.clock.now_ns(),
        c.config,
    )
    assert [(o.key, o.reason) for o in orders] == [("h0", "requests in flight without an answer")]
    c.stats["h0"].probes.last_answer_ns = c.clock.now_ns()  # a probe answered: heard from
    c.clock.advance_s(0.2)
    c.refresh()
    assert c.model.unanswered["h0"] == 0.0


def test_the_time_the_client_did_not_read_answers_counts_one_pause_once():
    """ClientLateness.paused_total_s: per observation (one a refresh), the larger of the
    health thread's lateness and how much later the driver's event loop ran meanwhile (its
    timer's lateness, the one in flight too): a GIL held or a stopped process delays both
    and counts once; a callback keeping the loop delays the loop alone."""
    from adaptive_lb.stats.lateness import LOOP_TIMER_LOST_S, ClientLateness

    ms = 1_000_000
    lateness = ClientLateness(10.0, 5)
    # Until the loop has fired one of its timers, its timing counts for nothing (a reactor
    # that never fires them must not hide a stall).
    assert lateness.loop_timer_due(0)
    lateness.observe(1 * S, 0.001)
    assert lateness.paused_total_s == pytest.approx(0.001)
    lateness.loop_timer_lost()
    # The loop's timer, due at 1 s, fires 2 ms later: the loop ran late as the thread did.
    assert lateness.loop_timer_due(1 * S)
    assert not lateness.loop_timer_due(1 * S + 1 * ms)  # one timer in flight at a time
    lateness.loop_timer_fired(1 * S + 2 * ms)
    lateness.observe(1 * S + 200 * ms, 0.0)
    assert lateness.paused_total_s == pytest.approx(0.003)
    # A callback keeps the loop from 2 s: its timer, due then, has not fired at the next
    # refreshes, which run on time; then it fires 3 s late.
    assert lateness.loop_timer_due(2 * S)
    lateness.observe(2 * S + 200 * ms, 0.0)
    lateness.observe(4 * S, 0.0)
    assert lateness.paused_total_s == pytest.approx(2.003)
    lateness.loop_timer_fired(5 * S)
    lateness.observe(5 * S + 100 * ms, 0.0)
    assert lateness.paused_total_s == pytest.approx(3.003)
    # The GIL held 4 s with a timer in flight: the thread and the loop 4 s late, once.
    assert lateness.loop_timer_due(6 * S)
    lateness.loop_timer_fired(10 * S)
    lateness.observe(10 * S, 4.0)
    assert lateness.paused_total_s == pytest.approx(7.003)
    # A timer the loop never fires counts LOOP_TIMER_LOST_S at most, then is replaced.
    assert lateness.loop_timer_due(20 * S)
    lateness.observe(100 * S, 0.0)
    assert lateness.paused_total_s == pytest.approx(7.003 + LOOP_TIMER_LOST_S)
    assert lateness.loop_timer_due(100 * S)
    lateness.loop_timer_lost()  # setting it failed
    assert lateness.loop_timer_due(100 * S)


def test_the_clients_lateness_is_the_largest_of_the_window_and_forgotten_after_it():
    """ClientLateness: every lateness over the window (10 s in 5 intervals of 2 s), and the
    largest and the median a Baseline derives from them."""
    from adaptive_lb.stats.lateness import ClientLateness, discounted

    def high_and_typical(now_ns: int) -> tuple[float, float]:
        baseline = Baseline(lateness_levels=lateness.levels(now_ns))
        return baseline.lateness_s, baseline.typical_lateness_s

    lateness = ClientLateness(10.0, 5)
    lateness.observe(1 * S, 0.004)
    lateness.observe(3 * S, 0.020)
    lateness.observe(3 * S, 0.001)
    lateness.observe(5 * S, -0.001)  # early: on time
    assert lateness.levels(5 * S) == (0.0, 0.001, 0.004, 0.020)
    assert high_and_typical(5 * S) == (0.020, pytest.approx(0.004))  # the upper median of 4
    # The 2-4 s interval is still in the window; the upper median of 0.02, 0.001, 0.
    assert high_and_typical(11 * S) == (0.020, pytest.approx(0.001))
    assert high_and_typical(14 * S) == (0.0, 0.0)
    lateness.observe(14 * S, 0.003)
    lateness.after_fork()
    assert lateness.levels(14 * S) == ()
    # A host's latency without the client's lateness, never below its peers'.
    assert discounted(0.030, 0.010, 0.005) == pytest.approx(0.020)
    assert discounted(0.012, 0.010, 0.005) == 0.005
    assert discounted(0.004, 0.010, 0.005) == 0.004
    assert discounted(0.030, 0.0, 0.005) == 0.030
