"""HostStats and StatsRegistry: exact counts, windows on a manual clock, no lost updates."""

from __future__ import annotations

import random
import threading

from adaptive_lb.clock import ManualClock
from adaptive_lb.config import TrackingConfig
from adaptive_lb.stats import HostStats, StatsRegistry

MS = 1_000_000


def make(clock=None, **kwargs) -> tuple[HostStats, ManualClock]:
    clock = clock or ManualClock(0)
    return HostStats(TrackingConfig(**kwargs), clock), clock


def test_lifecycle_counts_and_in_flight():
    stats, _ = make()
    for _ in range(4):
        stats.on_send()
    assert stats.in_flight == 4
    stats.on_success(2 * MS)
    stats.on_error(1 * MS)
    stats.on_timeout(500 * MS)
    stats.on_abandon()
    assert stats.in_flight == 0
    window = stats.window_stats()
    assert (window.requests, window.successes, window.errors, window.timeouts) == (3, 1, 1, 1)
    assert window.samples == 2  # the fast error is not a latency sample
    assert (stats.requests_total, stats.errors_total, stats.timeouts_total) == (3, 1, 1)
    assert window.error_rate == 2 / 3


def test_fast_errors_never_make_a_host_look_fast():
    stats, _ = make()
    for _ in range(100):
        stats.on_send()
        stats.on_success(50 * MS)
    before = stats.window_stats()
    for _ in range(1000):
        stats.on_send()
        stats.on_error(50_000, fast=True)  # 50 us "overloaded"
    after = stats.window_stats()
    assert after.latency == before.latency
    assert after.ewma == before.ewma
    assert after.errors == 1000
    stats.on_send()
    stats.on_error(900 * MS, fast=False)
    assert stats.window_stats((100.0,)).latency[100.0] > 0.5


def test_percentiles_are_roughly_right():
    stats, _ = make()
    for ms in range(1, 1001):
        stats.on_send()
        stats.on_success(ms * MS)
    latency = stats.window_stats().latency
    assert abs(latency[50.0] - 0.5) < 0.01
    assert abs(latency[99.0] - 0.99) < 0.02


def test_clamping_to_the_histogram_range():
    stats, _ = make(latency_min=1e-6, latency_max=1.0)
    stats.on_send()
    stats.on_success(0)
    stats.on_send()
    stats.on_success(3600 * 10**9)
    latency = stats.window_stats((0.0, 100.0)).latency
    assert latency[0.0] <= 2e-6
    assert 0.99 <= latency[100.0] <= 1.01


def test_window_slides_interval_by_interval():
    stats, clock = make(window=10.0, intervals=5)
    for _ in range(10):
        stats.on_send()
        stats.on_success(5 * MS)
    clock.advance_s(4.0)
    for _ in range(20):
        stats.on_send()
        stats.on_error(MS)
    assert stats.window_stats().requests == 30
    clock.advance_s(6.5)  # the first interval (t in [0, 2)) has left the window
    window = stats.window_stats()
    assert (window.requests, window.successes, window.errors) == (20, 0, 20)
    assert window.latency[50.0] is None
    clock.advance_s(100.0)  # a long idle gap clears everything
    assert stats.window_stats().requests == 0
    assert stats.requests_total == 30


def test_underflow_is_counted_not_negative():
    stats, _ = make()
    stats.on_abandon()
    assert stats.in_flight == 0 and stats.underflows == 1


def test_no_lost_counts_under_many_threads():
    clock = ManualClock(0)
    registry = StatsRegistry(TrackingConfig(), clock)
    keys = [f"host{i}" for i in range(5)]
    per_thread = 20_000
    expected = {"success": 0, "error": 0, "timeout": 0}
    expected_lock = threading.Lock()

    def worker(seed: int) -> None:
        rng = random.Random(seed)
        counts = {"success": 0, "error": 0, "timeout": 0}
        for i in range(per_thread):
            stats = registry.get(rng.choice(keys))
            stats.on_send()
            roll = rng.random()
            if roll < 0.6:
                stats.on_success(rng.randint(1, 10**8))
                counts["success"] += 1
            elif roll < 0.8:
                stats.on_error(rng.randint(1, 10**6), fast=rng.random() < 0.5)
                counts["error"] += 1
            elif roll < 0.9:
                stats.on_timeout(10**9)
                counts["timeout"] += 1
            else:
                stats.on_abandon()
            if i % 1000 == 0:
                clock.advance(10**8)
        with expected_lock:
            for k, v in counts.items():
                expected[k] += v

    threads = [threading.Thread(target=worker, args=(seed,)) for seed in range(16)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    hosts = [registry.get(k) for k in keys]
    assert all(h.in_flight == 0 and h.underflows == 0 for h in hosts)
    assert sum(h.requests_total for h in hosts) == sum(expected.values())
    assert sum(h.errors_total for h in hosts) == expected["error"]
    assert sum(h.timeouts_total for h in hosts) == expected["timeout"]


def test_registry_remove_keeps_references_working():
    registry = StatsRegistry(TrackingConfig(), ManualClock(0))
    stats = registry.get("a")
    stats.on_send()
    registry.remove("a")
    assert "a" not in registry and len(registry) == 0
    stats.on_success(MS)
    assert stats.in_flight == 0
    assert registry.get("a") is not stats
