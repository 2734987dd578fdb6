"""Per-host statistics: in-flight count, windowed outcomes and latency (no driver import).

One :class:`HostStats` per host. The policy's hot path reads two plain attributes without a
lock, ``in_flight`` and ``health_penalty``; request tracking calls one lifecycle method per
event (:meth:`HostStats.on_send`, then exactly one of ``on_success`` / ``on_error`` /
``on_timeout`` / ``on_abandon``), each a single acquisition of the host's lock, so no count
is ever lost -- also under free-threaded CPython, where an unlocked ``x += 1`` can be.

Latency goes into HdrHistograms (1 us .. 60 s, 2 significant digits by default) over a
sliding window of ``intervals`` rotating interval histograms; outcome counters rotate with
them. Percentiles are computed only by :meth:`HostStats.window_stats` (the health refresh),
never per request: ``get_value_at_percentile`` costs ~200-270 us here.
"""

from __future__ import annotations

import threading
from collections.abc import Hashable, Iterator, Sequence

from attrs import define, field
from hdrh.histogram import HdrHistogram

from adaptive_lb.clock import Clock
from adaptive_lb.config import TrackingConfig
from adaptive_lb.health_state import HealthState

__all__ = ["HostStats", "StatsRegistry", "WindowStats"]

_NS_PER_US = 1000
_FOLD_BATCH = 512
"""Latency samples buffered per interval before they are folded into its histogram."""


@define(frozen=True, slots=True)
class WindowStats:
    """A host's numbers over the sliding window, at one instant."""

    requests: int
    """Attempts that ended with an outcome (success + errors + timeouts)."""
    successes: int
    errors: int
    timeouts: int
    samples: int
    """Latency samples recorded (successes, timeouts and slow errors; never fast errors)."""
    latency: dict[float, float | None] = field(factory=dict)
    """Seconds at each requested percentile; None when there is no sample."""
    ewma: float | None = None
    """Smoothed latency, seconds (None before the first sample)."""
    in_flight: int = 0

    @property
    def error_rate(self) -> float:
        """(errors + timeouts) / requests; 0 when there were none."""
        return (self.errors + self.timeouts) / self.requests if self.requests else 0.0


class _Interval:
    """One slice of the window: counters, and a histogram allocated on first sample (idle
    hosts, e.g. in remote datacenters, hold no histogram memory).

    Samples are appended to ``pending`` (one list append on the request path) and folded
    into the histogram in batches -- when the list is full, when the interval rotates, or
    when the window is read -- so the driver's I/O thread does not pay HdrHistogram's
    pure-Python ``record_value`` (~1 us) on every response."""

    __slots__ = ("errors", "histogram", "pending", "successes", "timeouts")

    def __init__(self) -> None:
        self.successes = 0
        self.errors = 0
        self.timeouts = 0
        self.histogram: HdrHistogram | None = None
        self.pending: list[int] = []


class HostStats:
    """Live statistics of one host. See the module docstring for the threading contract."""

    __slots__ = (
        "__weakref__",
        "_alpha",
        "_clock",
        "_config",
        "_current",
        "_deadline_ns",
        "_interval_ns",
        "_intervals",
        "_lock",
        "_max_us",
        "_min_us",
        "abandons_total",
        "errors_total",
        "ewma_s",
        "health_penalty",
        "health_state",
        "in_flight",
        "requests_total",
        "timeouts_total",
        "underflows",
        "unsent_total",
    )

    def __init__(self, config: TrackingConfig, clock: Clock) -> None:
        self.in_flight = 0
        """Attempts sent and not yet released (read lock-free by the policy)."""
        self.health_penalty = 1.0
        """Score multiplier from the health model (read lock-free by the policy)."""
        self.health_state = HealthState.HEALTHY
        self.ewma_s: float | None = None
        """Smoothed latency in seconds, updated per sample: cheap to read between refreshes."""
        self.requests_total = 0
        self.errors_total = 0
        self.timeouts_total = 0
        self.abandons_total = 0
        """Attempts released without an outcome (superseded, shutdown)."""
        self.unsent_total = 0
        """Attempts counted in flight that the driver then could not write (no connection
        available): released, and not requests the host ever saw."""
        self.underflows = 0
        """Releases that found nothing in flight: a tracking bug if ever non-zero."""
        self._lock = threading.Lock()
        self._clock = clock
        self._configure(config)

    def _configure(self, config: TrackingConfig) -> None:
        self._config = config
        self._alpha = config.ewma_alpha
        self._min_us = max(1, round(config.latency_min * 1e6))
        self._max_us = max(self._min_us + 1, round(config.latency_max * 1e6))
        self._interval_ns = max(1, round(config.window * 1e9 / config.intervals))
        self._intervals = [_Interval() for _ in range(config.intervals)]
        self._current = 0
        self._deadline_ns = self._clock.now_ns() + self._interval_ns

    def reconfigure(self, config: TrackingConfig) -> None:
        """Adopt a new window / histogram layout (the window starts empty)."""
        with self._lock:
            self._configure(config)

    # ---------------------------------------------------------------- lifecycle

    def on_send(self) -> None:
        """An attempt was sent to this host."""
        with self._lock:
            self.in_flight += 1

    def on_success(self, latency_ns: int) -> None:
        """The attempt got a response; its latency counts."""
        now = self._clock.now_ns()
        with self._lock:
            self._release()
            if now >= self._deadline_ns:
                self._rotate(now)
            self._intervals[self._current].successes += 1
            self.requests_total += 1
            self._record(latency_ns)

    def on_error(self, latency_ns: int, *, fast: bool = True) -> None:
        """The attempt failed. A *fast* error (overloaded, unavailable, broken connection)
        does not enter the latency statistics: a node that fails fast must never look fast.
        A slow one (the host made us wait before failing) does."""
        now = self._clock.now_ns()
        with self._lock:
            self._release()
            if now >= self._deadline_ns:
                self._rotate(now)
            self._intervals[self._current].errors += 1
            self.requests_total += 1
            self.errors_total += 1
            if not fast:
                self._record(latency_ns)

    def on_timeout(self, latency_ns: int) -> None:
        """The attempt timed out (client side, or the coordinator reported a timeout); it
        took at least ``latency_ns``, which is recorded."""
        now = self._clock.now_ns()
        with self._lock:
            self._release()
            if now >= self._deadline_ns:
                self._rotate(now)
            self._intervals[self._current].timeouts += 1
            self.requests_total += 1
            self.timeouts_total += 1
            self._record(latency_ns)

    def on_unsent(self) -> None:
        """The attempt counted by :meth:`on_send` was never written to the host."""
        with self._lock:
            self._release()
            self.unsent_total += 1

    def on_abandon(self) -> None:
        """The attempt is released without an outcome (another attempt won, or shutdown)."""
        with self._lock:
            self._release()
            self.abandons_total += 1

    # Callers hold the lock.
    def _release(self) -> None:
        if self.in_flight > 0:
            self.in_flight -= 1
        else:
            self.underflows += 1

    def _record(self, latency_ns: int) -> None:
        value = latency_ns // _NS_PER_US
        if value < self._min_us:
            value = self._min_us
        elif value > self._max_us:
            value = self._max_us
        pending = self._intervals[self._current].pending
        pending.append(value)
        if len(pending) >= _FOLD_BATCH:
            self._fold(self._intervals[self._current])
        seconds = value / 1e6
        ewma = self.ewma_s
        self.ewma_s = seconds if ewma is None else ewma + self._alpha * (seconds - ewma)

    def _fold(self, interval: _Interval) -> None:
        # Caller holds the lock.
        pending = interval.pending
        if not pending:
            return
        histogram = interval.histogram
        if histogram is None:
            histogram = interval.histogram = self._new_histogram()
        record = histogram.record_value
        for value in pending:
            record(value)
        pending.clear()

    def _new_histogram(self) -> HdrHistogram:
        return HdrHistogram(self._min_us, self._max_us, self._config.significant_digits)

    def _rotate(self, now: int) -> None:
        # Skip as many intervals as have fully elapsed (a long idle gap clears the window).
        elapsed = (now - self._deadline_ns) // self._interval_ns + 1
        count = len(self._intervals)
        self._fold(self._intervals[self._current])
        for _ in range(min(elapsed, count)):
            self._current = (self._current + 1) % count
            # A fresh slot: cheaper than HdrHistogram.reset(), which loops in Python.
            self._intervals[self._current] = _Interval()
        self._deadline_ns += elapsed * self._interval_ns

    # ---------------------------------------------------------------- reading

    def window_stats(self, percentiles: Sequence[float] = (50.0, 95.0, 99.0)) -> WindowStats:
        """Counts and latency percentiles over the window. The expensive part (merging the
        interval histograms and reading percentiles) runs outside the host's lock, so
        request tracking is never blocked by it."""
        now = self._clock.now_ns()
        with self._lock:
            if now >= self._deadline_ns:
                self._rotate(now)
            # Interval objects are replaced, never mutated, once rotated out (their samples
            # were folded on rotation); the current one keeps changing, so its samples are
            # folded and its histogram merged under the lock (a C-level add).
            intervals = list(self._intervals)
            current = self._intervals[self._current]
            self._fold(current)
            successes = sum(i.successes for i in intervals)
            errors = sum(i.errors for i in intervals)
            timeouts = sum(i.timeouts for i in intervals)
            merged = self._new_histogram()
            if current.histogram is not None:
                merged.add(current.histogram)
            ewma = self.ewma_s
            in_flight = self.in_flight
        for interval in intervals:
            if interval is not current and interval.histogram is not None:
                merged.add(interval.histogram)
        samples = merged.get_total_count()
        if samples:
            values = merged.get_percentile_to_value_dict(list(percentiles))
            latency = {float(p): values[p] / 1e6 for p in percentiles}
        else:
            latency = {float(p): None for p in percentiles}
        return WindowStats(
            requests=successes + errors + timeouts,
            successes=successes,
            errors=errors,
            timeouts=timeouts,
            samples=samples,
            latency=latency,
            ewma=ewma,
            in_flight=in_flight,
        )


class StatsRegistry:
    """Host key -> :class:`HostStats`. Lookups of existing keys take no lock (a dict read);
    creation and removal do."""

    def __init__(self, config: TrackingConfig, clock: Clock) -> None:
        self._config = config
        self._clock = clock
        self._stats: dict[Hashable, HostStats] = {}
        self._lock = threading.Lock()

    def get(self, key: Hashable) -> HostStats:
        """The stats of ``key``, created on first use."""
        stats = self._stats.get(key)
        if stats is None:
            with self._lock:
                stats = self._stats.get(key)
                if stats is None:
                    stats = HostStats(self._config, self._clock)
                    self._stats[key] = stats
        return stats

    def peek(self, key: Hashable) -> HostStats | None:
        """The stats of ``key`` if it has any."""
        return self._stats.get(key)

    def remove(self, key: Hashable) -> None:
        """Forget ``key``. A HostStats still referenced (requests in flight) keeps working."""
        with self._lock:
            self._stats.pop(key, None)

    def reconfigure(self, config: TrackingConfig) -> None:
        """Apply a new tracking config to every host (their windows restart empty)."""
        with self._lock:
            self._config = config
            stats = list(self._stats.values())
        for host_stats in stats:
            host_stats.reconfigure(config)

    def keys(self) -> list[Hashable]:
        """The known keys."""
        return list(self._stats)

    def items(self) -> list[tuple[Hashable, HostStats]]:
        """(key, stats) pairs."""
        return list(self._stats.items())

    def __len__(self) -> int:
        return len(self._stats)

    def __contains__(self, key: object) -> bool:
        return key in self._stats

    def __iter__(self) -> Iterator[Hashable]:
        return iter(list(self._stats))
