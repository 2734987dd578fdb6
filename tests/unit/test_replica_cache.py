"""The replica cache judges itself: on while it pays, aside while it does not, tried again
now and then (no driver: the cache is pure logic)."""

from __future__ import annotations

import threading

import pytest

from adaptive_lb.plan import replica_cache
from adaptive_lb.plan.replica_cache import (
    BREAK_EVEN_HIT_RATIO,
    JUDGED_LOOKUPS,
    REVIEW_EVERY_MISSES,
    ReplicaCache,
)

RING = "ring"


def position(ring: object, key: bytes) -> int:
    return int.from_bytes(key, "big") % 97


class Resolver:
    """What ReplicaResolver.replicas does with the cache, and nothing else."""

    def __init__(self, capacity: int) -> None:
        self.computed = 0
        self.cache = ReplicaCache(capacity, self.compute)

    def compute(self, ring: object, key: bytes) -> int:
        self.computed += 1
        return position(ring, key)

    def lookup(self, key: bytes) -> tuple[int, bool | None]:
        cache = self.cache
        if cache.active:
            cache.missed_here.missed = False
            point = cache.lookup(RING, key)
            return point, not cache.missed_here.missed
        cache.bypass()
        return self.compute(RING, key), None


def keys(count: int, start: int = 0) -> list[bytes]:
    return [i.to_bytes(8, "big") for i in range(start, start + count)]


def lookups_to_judge(capacity: int) -> int:
    """Misses after which an all-miss cache has certainly been judged: it fills, then a
    judged window, then the review that ends it."""
    return capacity + JUDGED_LOOKUPS + 2 * REVIEW_EVERY_MISSES


def test_a_cache_that_never_hits_steps_aside_and_answers_stay_right():
    resolver = Resolver(capacity=64)
    cache = resolver.cache
    distinct = keys(50_000)
    judged_by = lookups_to_judge(64)
    for i, key in enumerate(distinct):
        point, hit = resolver.lookup(key)
        assert point == position(RING, key)
        if i < 64:
            assert cache.active and hit is False  # filling: never judged
    assert not cache.active
    assert cache.hits == 0 and cache.misses <= judged_by
    assert cache.bypassed == len(distinct) - cache.misses
    assert resolver.computed == len(distinct)  # every lookup computed once, no more
    assert cache.hit_ratio == 0.0


def test_a_cache_whose_keys_fit_stays_on():
    resolver = Resolver(capacity=1024)
    cache = resolver.cache
    hot = keys(1000)
    for _ in range(20):
        for key in hot:
            resolver.lookup(key)
    assert cache.active
    assert (cache.hits, cache.misses, cache.bypassed) == (19_000, 1000, 0)


def test_the_break_even_hit_ratio_decides():
    # One key in four is new, the others a small hot set: 75 % hits stays on...
    resolver = Resolver(capacity=256)
    fresh = iter(keys(10**6, start=10**6))
    hot = keys(16)
    for i in range(40_000):
        resolver.lookup(next(fresh) if i % 4 == 0 else hot[i % 16])
    assert resolver.cache.active
    # ...while under the break-even ratio it steps aside.
    assert BREAK_EVEN_HIT_RATIO > 0.3
    resolver = Resolver(capacity=256)
    for i in range(40_000):
        resolver.lookup(next(fresh) if i % 10 < 7 else hot[i % 16])
    assert not resolver.cache.active


def test_a_trial_turns_it_back_on_when_the_keys_have_changed(monkeypatch):
    monkeypatch.setattr(replica_cache, "MIN_TRIAL_INTERVAL", 5000)
    resolver = Resolver(capacity=64)
    cache = resolver.cache
    assert cache.trial_after() == 20 * (64 + JUDGED_LOOKUPS + REVIEW_EVERY_MISSES)
    for key in keys(lookups_to_judge(64)):
        resolver.lookup(key)
    assert not cache.active and cache.trials == 0
    # The workload turns to a hot set: the next trial finds it and the cache stays on.
    hot = keys(32)
    for i in range(cache.trial_after() + 1):
        resolver.lookup(hot[i % 32])
    assert cache.active and cache.trials == 1
    for key in hot:
        resolver.lookup(key)
    before = cache.hits
    for i in range(10 * JUDGED_LOOKUPS):
        assert resolver.lookup(hot[i % 32])[1] is True
    assert cache.active and cache.hits == before + 10 * JUDGED_LOOKUPS


def test_a_failed_trial_steps_aside_again(monkeypatch):
    monkeypatch.setattr(replica_cache, "MIN_TRIAL_INTERVAL", 5000)
    resolver = Resolver(capacity=64)
    cache = resolver.cache
    fresh = iter(keys(10**6))
    while cache.active:
        resolver.lookup(next(fresh))
    for _ in range(cache.trial_after() + 1):
        resolver.lookup(next(fresh))
    assert cache.active and cache.trials == 1
    misses = cache.misses
    while cache.active:
        resolver.lookup(next(fresh))
    assert cache.misses - misses <= lookups_to_judge(64)  # the trial's bounded cost


def test_size_zero_never_uses_the_cache_nor_tries_it(monkeypatch):
    monkeypatch.setattr(replica_cache, "MIN_TRIAL_INTERVAL", 10)
    resolver = Resolver(capacity=0)
    cache = resolver.cache
    assert not cache.active
    count = 2 * cache.trial_after()
    for key in keys(count):
        assert resolver.lookup(key)[1] is None
    assert (cache.hits, cache.misses, cache.trials, cache.bypassed) == (0, 0, 0, count)


def test_clear_keeps_the_verdict_and_resize_starts_a_trial():
    resolver = Resolver(capacity=64)
    cache = resolver.cache
    for key in keys(lookups_to_judge(64)):
        resolver.lookup(key)
    assert not cache.active
    cache.clear()  # a new token map: the keys are no more cacheable than before
    assert not cache.active and cache.invalidations == 1
    cache.resize(100_000)  # the operator sized it for the keys: try it
    assert cache.active and len(cache) == 0 and cache.invalidations == 2
    cache.resize(0)
    assert not cache.active


def test_every_lookup_is_counted_once_under_threads():
    resolver = Resolver(capacity=128)
    cache = resolver.cache
    per_thread = 20_000

    def run(offset: int) -> None:
        hot = keys(100)
        fresh = keys(per_thread, start=10**7 * (offset + 1))
        for i in range(per_thread):
            resolver.lookup(hot[i % 100] if i % 2 else fresh[i])

    threads = [threading.Thread(target=run, args=(n,)) for n in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert cache.hits + cache.misses + cache.bypassed == 4 * per_thread
    assert resolver.computed == cache.misses + cache.bypassed


@pytest.mark.parametrize("capacity", [-1])
def test_a_negative_capacity_is_refused(capacity):
    with pytest.raises(ValueError, match="capacity must be >= 0"):
        ReplicaCache(capacity, position)
