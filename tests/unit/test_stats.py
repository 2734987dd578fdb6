"""HostStats and StatsRegistry: exact counts, windows on a manual clock, no lost updates."""

from __future__ import annotations

import random
import sys
import threading

import pytest
from hdrh.histogram import HdrHistogram
from hypothesis import given, settings
from hypothesis import strategies as st

from adaptive_lb.config import TrackingConfig
from adaptive_lb.core.clock import ManualClock
from adaptive_lb.stats.health_state import HealthState
from adaptive_lb.stats.host import EVENTS_LIMIT, HostStats, WindowStats
from adaptive_lb.stats.registry import StatsRegistry

MS = 1_000_000
S = 1_000_000_000


def make(clock: ManualClock | None = None, **kwargs: object) -> tuple[HostStats, ManualClock]:
    clock = clock or ManualClock(0)
    return HostStats(TrackingConfig(**kwargs), clock), clock


def succeed(stats: HostStats, latency_ns: int, count: int = 1) -> None:
    for _ in range(count):
        stats.on_send()
        stats.on_success(latency_ns)


# ----------------------------------------------------------------- lifecycle and counts


def test_a_new_host_is_idle_and_healthy():
    stats, _ = make()
    assert (stats.in_flight, stats.health_penalty, stats.health_state) == (
        0,
        1.0,
        HealthState.HEALTHY,
    )
    window = stats.window_stats()
    assert (window.requests, window.samples, window.error_rate) == (0, 0, 0.0)
    assert window.latency == {50.0: None, 95.0: None, 99.0: None}


def test_lifecycle_counts_and_in_flight_per_method():
    stats, _ = make()
    for expected in range(1, 6):
        stats.on_send()
        assert stats.in_flight == expected
    stats.on_success(2 * MS)
    assert stats.in_flight == 4
    stats.on_error(1 * MS)
    assert stats.in_flight == 3
    stats.on_timeout(500 * MS)
    assert stats.in_flight == 2
    stats.on_abandon()
    assert stats.in_flight == 1
    stats.on_unsent()
    assert stats.in_flight == 0
    window = stats.window_stats()
    assert (window.requests, window.successes, window.errors, window.timeouts) == (3, 1, 1, 1)
    assert window.samples == 2  # the fast error is not a latency sample
    assert window.error_rate == pytest.approx(2 / 3)
    assert (stats.requests_total, stats.errors_total, stats.timeouts_total) == (3, 1, 1)
    assert (stats.abandons_total, stats.unsent_total, stats.underflows) == (1, 1, 0)


def test_in_flight_never_goes_below_zero_and_underflows_are_counted():
    stats, _ = make()
    stats.on_abandon()
    stats.on_success(MS)
    stats.on_unsent()
    assert stats.in_flight == 0 and stats.underflows == 3
    stats.on_send()
    assert stats.in_flight == 1  # no debt carried over from the underflows


def test_window_stats_reports_in_flight():
    stats, _ = make()
    for _ in range(3):
        stats.on_send()
    assert stats.window_stats().in_flight == 3


def test_error_rate_counts_errors_and_timeouts():
    window = WindowStats(requests=8, successes=4, errors=3, timeouts=1, samples=5)
    assert window.error_rate == 0.5
    assert WindowStats(requests=0, successes=0, errors=0, timeouts=0, samples=0).error_rate == 0


# ----------------------------------------------------------------- latency


def test_fast_errors_never_make_a_host_look_fast():
    stats, _ = make()
    succeed(stats, 50 * MS, 100)
    before = stats.window_stats((0.0, 50.0, 100.0))
    for _ in range(1000):
        stats.on_send()
        stats.on_error(50_000, fast=True)  # 50 us "overloaded"
    after = stats.window_stats((0.0, 50.0, 100.0))
    assert after.latency == before.latency
    assert after.samples == before.samples == 100
    assert after.errors == 1000


def test_slow_errors_and_timeouts_are_latency_samples():
    stats, _ = make()
    stats.on_send()
    stats.on_error(900 * MS, fast=False)
    window = stats.window_stats((100.0,))
    assert window.samples == 1 and window.latency[100.0] == pytest.approx(0.9, rel=0.01)
    stats.on_send()
    stats.on_timeout(2 * S)
    window = stats.window_stats((100.0,))
    assert window.samples == 2 and window.latency[100.0] == pytest.approx(2.0, rel=0.01)
    assert window.timeouts == 1 and window.errors == 1


def test_percentiles_are_roughly_right():
    stats, _ = make()
    values = list(range(1, 1001))
    random.Random(7).shuffle(values)
    for ms in values:
        succeed(stats, ms * MS)
    window = stats.window_stats((50.0, 90.0, 99.0, 100.0))
    assert window.samples == 1000
    # Two significant digits: values are within 1 % (hdrh reports the bucket's top).
    assert window.latency[50.0] == pytest.approx(0.5, rel=0.01)
    assert window.latency[90.0] == pytest.approx(0.9, rel=0.01)
    assert window.latency[99.0] == pytest.approx(0.99, rel=0.01)
    assert window.latency[100.0] == pytest.approx(1.0, rel=0.01)


def test_latency_is_clamped_to_the_histogram_range():
    stats, _ = make(latency_min=1e-5, latency_max=1.0)
    succeed(stats, 0)
    succeed(stats, -5)  # a clock that went backwards must not break anything
    succeed(stats, 3600 * S)
    window = stats.window_stats((0.0, 50.0, 100.0))
    assert window.samples == 3
    # hdrh's unit is latency_min rounded down to a power of two (8 us here).
    assert 5e-6 <= window.latency[0.0] <= 1e-5
    assert window.latency[50.0] < 2e-5  # the slot [8 us, 16 us) holding the clamped values
    assert window.latency[100.0] == pytest.approx(1.0, rel=0.01)


@settings(max_examples=60, deadline=None)
@given(
    values_us=st.lists(st.integers(-10, 200_000_000), min_size=1, max_size=300),
    digits=st.integers(1, 4),
    latency_min=st.sampled_from([1e-6, 1e-5, 3e-4]),
    timeouts=st.booleans(),
)
def test_recording_matches_hdrh_record_value(
    values_us: list[int], digits: int, latency_min: float, timeouts: bool
) -> None:
    """Both recordings -- the replay's inlined copy for successes and _record (timeouts,
    slow errors) -- fill the same slots as HdrHistogram.record_value."""
    stats, _ = make(latency_min=latency_min, latency_max=60.0, significant_digits=digits)
    low, high = round(latency_min * 1e6), 60_000_000
    reference = HdrHistogram(low, high, digits, word_size=4)
    for value in values_us:
        stats.on_send()
        if timeouts:
            stats.on_timeout(value * 1000)
        else:
            stats.on_success(value * 1000)
        assert reference.record_value(min(max(value, low), high))
    interval = stats.replay().current_interval()  # white box: the slots themselves
    histogram = interval.synced_histogram()
    assert histogram is not None
    assert bytes(histogram.counts) == bytes(reference.counts)
    assert histogram.get_total_count() == reference.get_total_count()
    assert histogram.get_max_value() == reference.get_max_value()
    assert histogram.get_min_value() == reference.get_min_value()


def test_window_percentiles_match_hdrh_over_several_intervals() -> None:
    """window_stats merges the intervals and reads the percentiles as hdrh would."""
    stats, clock = make(window=4.0, intervals=4)
    reference = HdrHistogram(1, 60_000_000, 2, word_size=4)
    rng = random.Random(3)
    for _ in range(3):
        for _ in range(200):
            value_us = rng.randint(1, 5_000_000)
            succeed(stats, value_us * 1000)
            reference.record_value(value_us)
        clock.advance_s(1.0)
    percentiles = [0.0, 50.0, 90.0, 99.0, 100.0]
    expected = reference.get_percentile_to_value_dict(percentiles)
    window = stats.window_stats(percentiles)
    assert window.samples == 600
    assert window.latency == {p: expected[p] / 1e6 for p in percentiles}


# ----------------------------------------------------------------- sliding window


def test_window_slides_interval_by_interval():
    stats, clock = make(window=10.0, intervals=5)  # 2 s intervals
    succeed(stats, 5 * MS, 10)  # t in [0, 2)
    clock.advance_s(4.0)
    for _ in range(20):  # t in [4, 6)
        stats.on_send()
        stats.on_error(MS, fast=False)
    assert stats.window_stats().requests == 30
    clock.advance_s(5.9)  # t = 9.9: still in the window
    assert stats.window_stats().requests == 30
    clock.advance_s(0.2)  # t = 10.1: the first interval has left
    window = stats.window_stats()
    assert (window.requests, window.successes, window.errors) == (20, 0, 20)
    assert window.samples == 20 and window.latency[50.0] == pytest.approx(0.001, rel=0.01)
    clock.advance_s(4.0)  # t = 14.1: the second batch has left too
    window = stats.window_stats()
    assert (window.requests, window.samples, window.latency[50.0]) == (0, 0, None)
    assert stats.requests_total == 30  # totals never expire


def test_rotation_is_driven_by_whichever_call_comes_first():
    stats, clock = make(window=1.0, intervals=2)
    succeed(stats, 5 * MS, 3)
    clock.advance_s(1.5)
    succeed(stats, 7 * MS)  # this call rotates: the three old samples are gone
    window = stats.window_stats((100.0,))
    assert window.requests == 1
    assert window.latency[100.0] == pytest.approx(0.007, rel=0.01)


def test_a_long_idle_gap_clears_the_window_and_recording_resumes():
    stats, clock = make(window=10.0, intervals=5)
    for second in range(10):
        succeed(stats, (second + 1) * MS, 5)
        clock.advance_s(1.0)
    clock.advance_s(3600.0)
    assert stats.window_stats().requests == 0
    succeed(stats, 3 * MS, 4)
    window = stats.window_stats((0.0, 100.0))
    assert (window.requests, window.samples) == (4, 4)
    assert window.latency[0.0] == pytest.approx(0.003, rel=0.01)
    assert window.latency[100.0] == pytest.approx(0.003, rel=0.01)
    clock.advance_s(10.0)
    assert stats.window_stats().requests == 0


def test_interval_histograms_are_reused_not_reallocated():
    stats, clock = make(window=1.0, intervals=4)
    seen: set[int] = set()
    for step in range(200):
        succeed(stats, (step % 50 + 1) * MS)
        clock.advance_s(0.1)
        seen.update(id(h) for h in stats.replay().histograms() if h is not None)
    assert len(seen) == 4  # one histogram per interval, for ever


def test_idle_hosts_hold_no_histogram():
    stats, _ = make()
    stats.on_send()
    stats.on_error(MS, fast=True)
    stats.window_stats()
    assert all(h is None for h in stats.replay().histograms())


def test_reconfigure_restarts_the_window_and_keeps_totals():
    stats, _ = make()
    succeed(stats, 5 * MS, 10)
    stats.on_send()
    stats.reconfigure(TrackingConfig(window=2.0, intervals=2, significant_digits=3))
    assert stats.window_stats().requests == 0
    assert stats.in_flight == 1 and stats.requests_total == 10
    stats.on_success(5 * MS)
    window = stats.window_stats()
    assert window.samples == 1 and window.latency[50.0] == pytest.approx(0.005, rel=0.001)


def test_outcomes_wait_as_events_until_the_window_is_read():
    stats, _ = make()
    succeed(stats, 5 * MS, 10)
    assert len(stats._events) == 10  # white box: nothing recorded on the request path
    assert stats.window_stats().successes == 10
    assert stats._events == []


def test_unread_events_are_replayed_by_the_request_that_fills_the_list():
    stats, _ = make()
    total = 3 * EVENTS_LIMIT + 5
    for index in range(total):
        succeed(stats, (index % 7 + 1) * MS)
        assert len(stats._events) < EVENTS_LIMIT
    assert len(stats._events) == 3 * EVENTS_LIMIT + 5 - 3 * EVENTS_LIMIT
    window = stats.window_stats()
    assert (window.successes, window.samples) == (total, total)


# ----------------------------------------------------------------- concurrency


def test_no_lost_counts_under_many_threads():
    # A window longer than the test's virtual time: everything stays in it, so the window
    # counts must equal the totals exactly, while intervals still rotate under contention.
    clock = ManualClock(0)
    registry = StatsRegistry(TrackingConfig(window=1000.0, intervals=10), clock)
    keys = [f"host{i}" for i in range(4)]
    per_thread, threads_count = 8_000, 16
    outcomes = ("success", "error", "slow_error", "timeout", "abandon", "unsent")
    expected = {(k, o): 0 for k in keys for o in outcomes}
    expected_lock = threading.Lock()

    def worker(seed: int) -> None:
        rng = random.Random(seed)
        counts = dict.fromkeys(expected, 0)
        start.wait()
        for i in range(per_thread):
            key = rng.choice(keys)
            stats = registry.get(key)
            stats.on_send()
            outcome = rng.choice(outcomes)
            if outcome == "success":
                stats.on_success(rng.randint(1, 10**8))
            elif outcome == "error":
                stats.on_error(rng.randint(1, 10**6), fast=True)
            elif outcome == "slow_error":
                stats.on_error(rng.randint(1, 10**9), fast=False)
            elif outcome == "timeout":
                stats.on_timeout(10**9)
            elif outcome == "abandon":
                stats.on_abandon()
            else:
                stats.on_unsent()
            counts[key, outcome] += 1
            if i % 500 == 0:
                clock.advance(S)  # 256 virtual seconds in all: rotations, no expiry
        with expected_lock:
            for k, v in counts.items():
                expected[k] += v

    def reader() -> None:  # replays racing the appends, as the health refresh does
        start.wait()
        while any(t.is_alive() for t in threads):
            for key in keys:
                registry.get(key).window_stats()

    threads = [threading.Thread(target=worker, args=(seed,)) for seed in range(threads_count)]
    reading = threading.Thread(target=reader)
    start = threading.Barrier(threads_count + 1)
    # Switch threads as often as the interpreter allows: the most interleaving of the
    # lifecycle calls and of the rotations they trigger.
    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    try:
        for t in threads:
            t.start()
        reading.start()
        for t in threads:
            t.join()
        reading.join()
    finally:
        sys.setswitchinterval(interval)
    assert len(registry) == len(keys)
    for key in keys:
        stats = registry.get(key)
        count = {o: expected[key, o] for o in outcomes}
        window = stats.window_stats()
        assert (stats.in_flight, stats.underflows) == (0, 0)
        assert (
            stats.requests_total
            == count["success"] + count["error"] + count["slow_error"] + count["timeout"]
        )
        assert stats.errors_total == count["error"] + count["slow_error"]
        assert stats.timeouts_total == count["timeout"]
        assert stats.abandons_total == count["abandon"]
        assert stats.unsent_total == count["unsent"]
        assert window.requests == stats.requests_total
        assert window.successes == count["success"]
        assert window.samples == count["success"] + count["slow_error"] + count["timeout"]
    assert sum(expected.values()) == per_thread * threads_count


# ----------------------------------------------------------------- registry


def test_registry_creates_once_and_peek_never_creates():
    registry = StatsRegistry(TrackingConfig(), ManualClock(0))
    assert registry.peek("a") is None and "a" not in registry
    stats = registry.get("a")
    assert registry.get("a") is stats and registry.peek("a") is stats
    registry.get(("10.0.0.2", 9042))
    assert set(registry.keys()) == {"a", ("10.0.0.2", 9042)}
    assert dict(registry.items())["a"] is stats
    assert len(registry) == 2 and set(registry) == set(registry.keys())


def test_registry_concurrent_first_use_gives_one_object():
    registry = StatsRegistry(TrackingConfig(), ManualClock(0))
    barrier = threading.Barrier(8)
    got: list[HostStats] = []

    def worker() -> None:
        barrier.wait()
        got.append(registry.get("same"))

    threads = [threading.Thread(target=worker) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len({id(s) for s in got}) == 1


def test_registry_remove_keeps_references_working():
    registry = StatsRegistry(TrackingConfig(), ManualClock(0))
    stats = registry.get("a")
    stats.on_send()
    stats.on_send()
    registry.remove("a")
    registry.remove("never-there")
    assert "a" not in registry and len(registry) == 0 and registry.peek("a") is None
    stats.on_success(MS)
    stats.on_timeout(S)
    assert stats.in_flight == 0 and stats.underflows == 0
    assert stats.window_stats().requests == 2
    fresh = registry.get("a")
    assert fresh is not stats and fresh.requests_total == 0


def test_registry_reconfigure_reaches_every_host_and_new_ones():
    registry = StatsRegistry(TrackingConfig(), ManualClock(0))
    old = registry.get("a")
    config = TrackingConfig(window=3.0, intervals=3)
    registry.reconfigure(config)
    assert old.config is config and registry.get("b").config is config
