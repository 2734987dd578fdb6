"""The replica cache: a bounded LRU of ``(ring, routing key) -> ring position`` that steps
aside when it does not pay for itself (no driver import).

Measured on this machine (``benchmarks/replica_cache.py``, a whole replica lookup): ~0.58 us
when the cache hits, ~0.87 us without the cache (the Murmur3 hash and the bisect of the
ring), ~1.57 us when it misses (the same, plus the LRU's bookkeeping, an eviction and a
Python call). A hit saves ~0.3 us, a miss loses ~0.7 us. With many more distinct partition
keys than entries -- user ids, random UUIDs, time buckets -- almost every lookup misses, and
the cache is only a cost.

So the cache judges itself. After it has seen ``capacity`` lookups since it was (re)started
-- enough to fill it -- it measures its hit ratio over windows of at least
:data:`JUDGED_LOOKUPS` lookups, reviewed every :data:`REVIEW_EVERY_MISSES` misses (a
cache that hits is rarely reviewed, and never turned off). Below :data:`BREAK_EVEN_HIT_RATIO`
it turns itself off: lookups then compute the position directly and are counted as
*bypassed*. After :meth:`ReplicaCache.trial_after` bypassed lookups it turns itself on
again for a trial judged the same way, in case the workload's keys have changed. Everything
is counted in lookups, not in time, so the simulator and the tests see exactly what
production does.

Imports the counters only.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from functools import lru_cache
from typing import TYPE_CHECKING, Any

from adaptive_lb.core.counting import counter_value, new_counter

if TYPE_CHECKING:
    from functools import _lru_cache_wrapper

__all__ = [
    "BREAK_EVEN_HIT_RATIO",
    "JUDGED_LOOKUPS",
    "MIN_TRIAL_INTERVAL",
    "REVIEW_EVERY_MISSES",
    "ReplicaCache",
]

BREAK_EVEN_HIT_RATIO = 0.7
"""Below this hit ratio the cache costs more than it saves and steps aside: a miss loses
~0.7 us against no cache, a hit saves ~0.3 us (module docstring); they break even at 0.68
to 0.71 on both drivers."""
REVIEW_EVERY_MISSES = 1024
"""Misses between two reviews of the hit ratio."""
JUDGED_LOOKUPS = 1024
"""The fewest lookups a hit ratio is judged on."""
MIN_TRIAL_INTERVAL = 1_000_000
"""The fewest bypassed lookups before the cache is tried again (see
:meth:`ReplicaCache.trial_after`)."""


class ReplicaCache:
    """A bounded LRU map, ``lookup(ring, routing_key) -> ring position``, with hit, miss,
    eviction, invalidation and bypass counts, in use only while it pays (module docstring).

    It is :func:`functools.lru_cache` around the resolver's ring lookup: the LRU bookkeeping
    and its counters run in C, without a Python-level lock per lookup (an ``OrderedDict``
    behind a lock cost ~0.5 us more per miss, and threads convoyed on it). Hits and misses
    are lru_cache's own exact counts. Evictions are derived: a miss inserts one entry, so
    they are the misses less the entries held -- one too many where two threads missed the
    same key at once, or where the lookup raised (a routing key that is not bytes).
    :meth:`clear` and :meth:`resize` empty the cache and carry the counts over; a lookup
    racing one of them may go uncounted.

    The resolver reads :attr:`active` on every lookup: when it is false it computes the
    position itself and calls :meth:`bypass`. The review runs in whichever thread misses
    or bypasses at the right count; two threads reviewing at once reach the same verdict.
    """

    __slots__ = (
        "_baseline",
        "_bypassed",
        "_compute",
        "_counts_lock",
        "_earlier",
        "_misses_to_review",
        "_trial_at",
        "_warm_at",
        "active",
        "capacity",
        "invalidations",
        "lookup",
        "missed_here",
        "trials",
    )

    def __init__(self, capacity: int, compute: Callable[[Any, bytes], int]) -> None:
        if capacity < 0:
            raise ValueError(f"capacity must be >= 0, got {capacity}")
        self._compute = compute
        self._bypassed = new_counter()
        self._counts_lock = threading.Lock()
        self._earlier = (0, 0, 0)
        """(hits, misses, evictions) of the caches that :meth:`clear` / :meth:`resize`
        replaced or emptied."""
        self.invalidations = 0
        self.trials = 0
        """Times the cache was turned on again after stepping aside."""
        self.missed_here = threading.local()
        """``missed``: whether this thread's last lookup computed its answer (lru_cache runs
        the computation in the calling thread), which tells a decision trace hit from miss."""
        self.capacity = capacity
        self.lookup: _lru_cache_wrapper[int] = lru_cache(maxsize=capacity)(self._miss)
        """The cached lookup (the hot path calls it directly while :attr:`active`)."""
        self._trial_at = 0
        self._warm_at = 0
        self._baseline: tuple[int, int] | None = None
        """(hits, misses) when the window being judged began (None: still filling)."""
        self._misses_to_review = REVIEW_EVERY_MISSES
        self.active = False
        """Lookups go through the cache (read by the resolver on every lookup)."""
        self._start(capacity > 0)

    # ------------------------------------------------------------------ hot path

    def _miss(self, ring: Any, routing_key: bytes) -> int:
        # lru_cache calls this on a miss, in the thread that looked up. The countdown is not
        # atomic: a lost decrement only delays a review.
        self.missed_here.missed = True
        self._misses_to_review -= 1
        if self._misses_to_review <= 0:
            self._misses_to_review = REVIEW_EVERY_MISSES
            self._review()
        return self._compute(ring, routing_key)

    def bypass(self) -> None:
        """Count one lookup resolved without the cache; start a trial when one is due."""
        if next(self._bypassed) >= self._trial_at and self.capacity and not self.active:
            with self._counts_lock:
                if not self.active:
                    self.trials += 1
                    self._start(True)

    # ------------------------------------------------------------------ the verdict

    def _start(self, active: bool) -> None:
        # (Re)start judging: the next ``capacity`` lookups fill the cache, unjudged.
        info = self.lookup.cache_info()
        self._warm_at = info.hits + info.misses + self.capacity
        self._baseline = None
        self._misses_to_review = REVIEW_EVERY_MISSES
        self.active = active

    def _review(self) -> None:
        info = self.lookup.cache_info()
        hits, misses = info.hits, info.misses
        baseline = self._baseline
        if baseline is None:
            if hits + misses >= self._warm_at:
                self._baseline = (hits, misses)
            return
        judged_hits, judged_misses = hits - baseline[0], misses - baseline[1]
        judged = judged_hits + judged_misses
        if judged < JUDGED_LOOKUPS:
            return
        if judged_hits < BREAK_EVEN_HIT_RATIO * judged:
            self._trial_at = counter_value(self._bypassed) + self.trial_after()
            self.active = False
        else:
            self._baseline = (hits, misses)

    def trial_after(self) -> int:
        """Bypassed lookups before the next trial: at least :data:`MIN_TRIAL_INTERVAL`, and
        20 times a trial's length, so that trials that fail cost under 5 % of the misses
        an always-on cache would have paid."""
        return max(MIN_TRIAL_INTERVAL, 20 * (self.capacity + JUDGED_LOOKUPS + REVIEW_EVERY_MISSES))

    # ------------------------------------------------------------------ management

    def _retire(self) -> None:
        # The lru_cache's counts only: the bypassed lookups keep their own counter.
        info = self.lookup.cache_info()
        hits, misses, evictions = self._earlier
        evicted = info.misses - info.currsize if self.capacity else 0
        self._earlier = (hits + info.hits, misses + info.misses, evictions + evicted)

    def _counts(self) -> tuple[int, int, int]:
        info = self.lookup.cache_info()
        hits, misses, evictions = self._earlier
        evicted = info.misses - info.currsize if self.capacity else 0
        return hits + info.hits, misses + info.misses, evictions + evicted

    def clear(self) -> None:
        """Drop every entry (counted as one invalidation). A cache in use refills before it
        is judged again; one that stepped aside stays aside."""
        with self._counts_lock:
            self._retire()
            self.lookup.cache_clear()
            self.invalidations += 1
            if self.active:
                self._start(True)

    def resize(self, capacity: int) -> None:
        """Change the capacity. The cache is emptied (counted as one invalidation) and, when
        ``capacity`` is not 0, put to a new trial: this happens only when a reloaded config
        changes ``replica_cache_size``."""
        if capacity < 0:
            raise ValueError(f"capacity must be >= 0, got {capacity}")
        with self._counts_lock:
            self._retire()
            self.capacity = capacity
            self.lookup = lru_cache(maxsize=capacity)(self._miss)
            self.invalidations += 1
            self._start(capacity > 0)

    # ------------------------------------------------------------------ counts

    @property
    def hits(self) -> int:
        """Lookups answered from the cache."""
        with self._counts_lock:
            return self._counts()[0]

    @property
    def misses(self) -> int:
        """Lookups the cache was asked and had to compute."""
        with self._counts_lock:
            return self._counts()[1]

    @property
    def evictions(self) -> int:
        """Entries dropped to make room (not those dropped by an invalidation)."""
        with self._counts_lock:
            return self._counts()[2]

    @property
    def bypassed(self) -> int:
        """Lookups resolved without the cache: it had stepped aside, its size is 0, or the
        routing key was too long to keep."""
        return counter_value(self._bypassed)

    def __len__(self) -> int:
        return self.lookup.cache_info().currsize

    @property
    def hit_ratio(self) -> float:
        """hits / (hits + misses + bypassed lookups): the share of all lookups the cache
        answered; 0 when nothing was looked up."""
        with self._counts_lock:
            hits, misses, _ = self._counts()
        total = hits + misses + self.bypassed
        return hits / total if total else 0.0
