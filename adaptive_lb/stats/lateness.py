"""The client's own lateness: how late this process runs its own timers (pure logic).

An answer's latency as the client measures it includes the client's delay in handling it:
a garbage collection, the GIL held by a busy thread, a CPU shared with other processes.
That delay is the client's, not the host's, and it lands on whichever hosts had requests in
flight at the moment. It is also what delays a periodic timer of the client's own: the
health refresh sleeps ``health.refresh_interval`` and measures how much longer the sleep
took (:class:`adaptive_lb.runtime.refresher.HealthRefresher`; the simulator feeds its own pauses).
:class:`ClientLateness` keeps what it saw over the statistics window, so that the health
judgement (:mod:`adaptive_lb.health.rules`, :mod:`adaptive_lb.health.evidence`) can discount what
the client itself may have added: the largest lateness to any one answer (a tail), the
median to most of them (a median), and what a majority of a host's ``n`` answers may all
have had (:func:`majority_lateness`, the median rule's noise). It also sums how long the
client has not read answers at all (:attr:`ClientLateness.paused_total_s`), from the
health thread's lateness and a timer on the driver's event loop (a callback can keep the
loop while the health thread runs on time), so that a host's silence is counted in the
client's own running time (the stall rule, :mod:`adaptive_lb.health.model`).

Imports the standard library only.
"""

from __future__ import annotations

import collections
import functools
import math
import threading
from collections.abc import Sequence

__all__ = [
    "LOOP_TIMER_LOST_S",
    "MAJORITY_SAMPLES",
    "MAX_OBSERVATIONS",
    "ClientLateness",
    "discounted",
    "majority_lateness",
]

_NS = 1_000_000_000
MAX_OBSERVATIONS = 4096
"""Observations kept: a window's worth at the shortest refresh interval (10 ms) and more."""


def discounted(latency_s: float, lateness_s: float, reference_s: float) -> float:
    """A host's latency ``latency_s`` without what the client itself may have added to it
    (``lateness_s``), compared with its peers' ``reference_s``: never below the reference
    (the client's lateness makes a host look slower, never faster). A saturated client
    serves its sockets in turn, and one host's answers can wait longer than the others' for
    as long as the client is late: a latency gap within that is no evidence."""
    if lateness_s <= 0.0:
        return latency_s
    return max(min(latency_s, reference_s), latency_s - lateness_s)


LOOP_TIMER_LOST_S = 30.0
"""A timer on the driver's event loop this late is counted no later, and replaced: a loop
kept that long has every request stuck anyway, and a timer the loop dropped must not hide
a stall for ever."""
_LOOP_TIMER_LOST_NS = round(LOOP_TIMER_LOST_S * _NS)


def _loop_late_ns(due_ns: int, now_ns: int) -> int:
    """How late, at ``now_ns``, the event loop's timer due at ``due_ns`` is (at most
    :data:`LOOP_TIMER_LOST_S`)."""
    return min(max(0, now_ns - due_ns), _LOOP_TIMER_LOST_NS)


MAJORITY_SAMPLES = 400
"""Answers counted at most by :func:`majority_lateness` (more would only lower the level)."""


def majority_lateness(levels: Sequence[float], samples: int, alpha: float) -> float:
    """The client's lateness that a majority of a host's ``samples`` answers may all have
    had, at false-alarm probability ``alpha``: the level of ``levels`` (the window's
    lateness observations, increasing) exceeded a fraction ``p`` of the time, ``p`` the
    largest with P(Binomial(samples, p) > samples / 2) <= ``alpha``: answers at
    independent moments. One or two answers may all have fallen in the client's worst
    moment (the largest lateness); a hundred seldom fall in more than its worst third (about
    the 70th percentile). 0 when nothing was seen."""
    if not levels:
        return 0.0
    p = _majority_fraction(min(max(1, samples), MAJORITY_SAMPLES), alpha)
    return levels[min(len(levels) - 1, math.floor((1.0 - p) * len(levels)))]


@functools.lru_cache(maxsize=1024)
def _majority_fraction(samples: int, alpha: float) -> float:
    """The largest ``p`` (to 1e-4) with P(Binomial(samples, p) > samples / 2) <= ``alpha``."""
    low, high = 0.0, 0.5
    while high - low > 1e-4:
        middle = (low + high) / 2.0
        if _majority_tail(samples, middle) <= alpha:
            low = middle
        else:
            high = middle
    return low


def _majority_tail(samples: int, p: float) -> float:
    """P(Binomial(samples, p) > samples / 2), for 0 < p <= 0.5: its terms from the first,
    each from the last (they only fall), until they no longer count."""
    k = samples // 2 + 1
    odds = p / (1.0 - p)
    term = math.exp(
        math.lgamma(samples + 1)
        - math.lgamma(k + 1)
        - math.lgamma(samples - k + 1)
        + k * math.log(p)
        + (samples - k) * math.log1p(-p)
    )
    total = 0.0
    while k <= samples and term > total * 1e-12:
        total += term
        term *= (samples - k) / (k + 1) * odds
        k += 1
    return total


class ClientLateness:
    """How late the client's own timer fired over a sliding window of ``window_s`` seconds
    (in ``intervals`` slices, as the statistics window), and how long, in all, the client has
    not read answers (:attr:`paused_total_s`). Thread-safe (one lock, taken a few times a
    second, never on the request path); at most :data:`MAX_OBSERVATIONS` kept."""

    __slots__ = (
        "_intervals",
        "_lock",
        "_loop_due_ns",
        "_loop_late_ns",
        "_loop_seen_ns",
        "_paused_ns",
        "_seen",
        "_slice_ns",
        "loop_timers_fired",
    )

    def __init__(self, window_s: float = 10.0, intervals: int = 5) -> None:
        self._lock = threading.Lock()
        self._intervals = max(1, intervals)
        self._slice_ns = max(1, round(window_s * _NS / self._intervals))
        self._seen: collections.deque[tuple[int, float]] = collections.deque(
            maxlen=MAX_OBSERVATIONS
        )
        """(slice number, lateness in s) of each observation, oldest first."""
        self._paused_ns = 0
        """How long the client has not read answers, in all (never forgotten): per
        observation, the larger of the health thread's lateness and how much later the
        event loop ran since the last one (one pause delays both)."""
        self._loop_due_ns: int | None = None
        """When the timer on the driver's event loop in flight was due (None: none)."""
        self._loop_late_ns = 0
        """How late the event loop's timers fired, in all."""
        self._loop_seen_ns = 0
        """That, with the lateness of the timer in flight, at the last observation."""
        self.loop_timers_fired = 0
        """The event loop's timers fired so far. Until the first has, the loop's timing
        counts for nothing (a reactor that never fires them must not hide a stall)."""

    def reconfigure(self, window_s: float, intervals: int) -> None:
        """A new window length (a reload): what was seen is forgotten."""
        with self._lock:
            self._intervals = max(1, intervals)
            self._slice_ns = max(1, round(window_s * _NS / self._intervals))
            self._seen.clear()

    def after_fork(self) -> None:
        """In a forked child: a new lock (the parent's refresh thread may have held this
        one at the fork) and nothing seen (the parent's lateness is not this process's, nor
        its event loop)."""
        self._lock = threading.Lock()
        self._seen = collections.deque(maxlen=MAX_OBSERVATIONS)
        self._loop_due_ns = None

    def observe(self, now_ns: int, late_s: float) -> None:
        """The client's timer fired ``late_s`` seconds late at ``now_ns`` (early counts as
        on time)."""
        late_s = max(0.0, late_s)
        with self._lock:
            self._seen.append((now_ns // self._slice_ns, late_s))
            loop_ns = self._loop_late_ns
            due = self._loop_due_ns
            if due is not None and self.loop_timers_fired:
                loop_ns += _loop_late_ns(due, now_ns)
            loop_ran_late, self._loop_seen_ns = max(0, loop_ns - self._loop_seen_ns), loop_ns
            self._paused_ns += max(round(late_s * _NS), loop_ran_late)

    def loop_timer_due(self, now_ns: int) -> bool:
        """A timer on the driver's event loop is about to be set, due at ``now_ns``: False
        while the last one has not fired (then none is set), unless it is
        :data:`LOOP_TIMER_LOST_S` late (lost: replaced)."""
        with self._lock:
            due = self._loop_due_ns
            if due is not None and now_ns - due < _LOOP_TIMER_LOST_NS:
                return False
            self._loop_due_ns = now_ns
            return True

    def loop_timer_fired(self, now_ns: int) -> None:
        """The event loop's timer fired at ``now_ns`` (on the loop's thread): the loop did
        not run from when it was due until now."""
        with self._lock:
            due, self._loop_due_ns = self._loop_due_ns, None
            self.loop_timers_fired += 1
            if due is not None:
                self._loop_late_ns += _loop_late_ns(due, now_ns)

    def loop_timer_lost(self) -> None:
        """The timer in flight will not fire (setting it failed, or its loop is gone)."""
        with self._lock:
            self._loop_due_ns = None

    @property
    def paused_total_s(self) -> float:
        """How long, in all, the client has not read answers, as of the last observation:
        its pauses (a GC, the GIL held by a long C call, a stopped process: its health
        thread wakes late; a user callback keeping the driver's event loop: the loop's timer
        fires late). Between two readings, a silence that long is the client's, not a
        host's."""
        return self._paused_ns / _NS

    def levels(self, now_ns: int) -> tuple[float, ...]:
        """Every lateness seen in the window ending at ``now_ns``, seconds, in increasing
        order (empty when none was seen)."""
        oldest = now_ns // self._slice_ns - self._intervals
        with self._lock:
            seen = self._seen
            while seen and seen[0][0] <= oldest:
                seen.popleft()
            return tuple(sorted(late for _, late in seen))
