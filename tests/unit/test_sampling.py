"""Which requests request tracking tracks (adaptive_lb.stats.sampling), and where in-flight
counts come from (StatsRegistry's in-flight sources)."""

from __future__ import annotations

import random

import pytest

from adaptive_lb.config import TrackingConfig
from adaptive_lb.core.clock import ManualClock
from adaptive_lb.stats.registry import StatsRegistry
from adaptive_lb.stats.sampling import RESAMPLE_S, Sampler, burst_count, sample_every


@pytest.mark.parametrize(
    ("rate", "per_host", "hosts", "every"),
    [
        (10, 100, 3, 1),  # a thin client: every request
        (300, 100, 3, 1),  # exactly the budget
        (601, 100, 3, 2),
        (3500, 100, 3, 11),
        (3500, 100, 0, 35),  # no host known yet: counted as one
        (1e6, 0, 3, 1),  # sampling off
    ],
)
def test_one_request_in_k_by_the_rate(rate, per_host, hosts, every):
    assert sample_every(rate, per_host, hosts) == every


def drive(sampler: Sampler, clock: ManualClock, rate: float, seconds: float) -> int:
    """Requests at ``rate`` a second for ``seconds``; how many were picked."""
    picked = 0
    step_ns = int(1e9 / rate)
    for _ in range(int(rate * seconds)):
        clock.advance(step_ns)
        picked += sampler.take()
    return picked


def test_thick_traffic_is_sampled_and_thin_traffic_is_not():
    random.seed(5)
    clock = ManualClock()
    sampler = Sampler(10.0, lambda: 3, clock.now_ns)
    assert drive(sampler, clock, 20, 3.0) == 60  # within 30 a second: all of them
    drive(sampler, clock, 300, 2.0)  # the rate is measured on a picked request
    assert sampler.every == 10
    assert drive(sampler, clock, 300, 3.0) == pytest.approx(90, abs=30)  # 30 a second
    # A lull turns sampling off at the next picked request (1 in k of them).
    drive(sampler, clock, 5, 12.0)
    assert sampler.every == 1
    assert drive(sampler, clock, 5, 2.0) == 10


def test_the_sample_is_random_so_no_rhythm_of_the_client_aliases_with_it():
    """Requests cycling through 3 hosts while one in 3 is tracked: every host gets its third
    of the sample (every 3rd request would all be one host's), at the expected rate."""
    clock = ManualClock()
    sampler = Sampler(1.0, lambda: 1, clock.now_ns)
    sampler.every = 3
    sampler._last_ns = clock.now_ns()  # the clock stands still: k stays 3
    per_host = [0, 0, 0]
    for i in range(30_000):
        if sampler.take():
            per_host[i % 3] += 1
    assert sum(per_host) == pytest.approx(10_000, rel=0.05)
    assert min(per_host) > 0.3 * sum(per_host)


def test_turning_sampling_off_tracks_every_request_at_once():
    clock = ManualClock()
    sampler = Sampler(1.0, lambda: 1, clock.now_ns)
    drive(sampler, clock, 100, 4 * RESAMPLE_S)
    assert sampler.every > 1
    sampler.configure(0.0)
    assert sampler.every == 1
    assert drive(sampler, clock, 100, 2.0) == 200
    assert sampler.requests == 100 * 4 * RESAMPLE_S + 200


def test_in_flight_comes_from_the_sources_when_there_are_any():
    registry = StatsRegistry(TrackingConfig(), ManualClock())
    before = registry.get("a")
    before.on_send()
    assert before.in_flight == 1  # counted here
    pools = {"a": 4, "b": 2}
    other = {"a": 1}
    registry.add_in_flight_source(lambda key: pools.get(key, 0))
    after = registry.get("b")
    assert (before.in_flight, after.in_flight) == (4, 2)  # existing and new hosts
    pools["a"] = 5
    assert before.in_flight == 5  # live, never copied
    source = lambda key: other.get(key, 0)  # noqa: E731 (compared by identity below)
    registry.add_in_flight_source(source)
    assert registry.in_flight_sources == 2
    assert before.in_flight == 6  # two sessions on one policy: the sum
    registry.remove_in_flight_source(source)
    assert before.in_flight == 5
    registry.remove_in_flight_source()
    assert (before.in_flight, after.in_flight) == (1, 0)  # counted here again
    assert before.counted_in_flight == 1


def test_a_burst_after_a_pause_is_sampled_after_a_quarter_seconds_budget():
    """The rate measured across a pause says 1 (every request tracked); the burst after it
    is measured again after ``burst_count`` requests, not after a quarter second of tracking
    all of them (at 4,000 a second, ~1,000 requests)."""
    random.seed(3)
    clock = ManualClock()
    sampler = Sampler(100.0, lambda: 3, clock.now_ns)
    drive(sampler, clock, 4000, 1.0)
    assert sampler.every == 13  # 4,000 / (100 x 3)
    clock.advance(4 * 10**9)  # a pause: the next picked request measures a low rate
    drive(sampler, clock, 4000, 0.01)
    assert sampler.every == 1
    budget = burst_count(100.0, 3)
    assert budget == 75  # 100 x 3 x RESAMPLE_S
    tracked = drive(sampler, clock, 4000, 0.05)  # 200 requests, 50 ms
    assert sampler.every == 13
    assert tracked < budget + 200 / 13 + 15  # not all 200


def test_with_sampling_off_no_burst_turns_it_on():
    clock = ManualClock()
    sampler = Sampler(0.0, lambda: 3, clock.now_ns)
    assert drive(sampler, clock, 10_000, 0.5) == 5000
    assert sampler.every == 1
