"""Per-host statistics: in-flight count, windowed outcomes and latency (no driver import).

One :class:`HostStats` per host. The policy's hot path reads plain attributes without a
lock (``in_flight``, ``health_penalty``, ``health_state``, ``rack_penalty``); request
tracking calls one lifecycle method per event (:meth:`HostStats.on_send`, then exactly one
of ``on_success`` / ``on_error`` / ``on_timeout`` / ``on_abandon`` / ``on_unsent``), each a
single acquisition of the host's lock, so no count is ever lost -- also under free-threaded
CPython, where an unlocked ``x += 1`` can be.

Latency goes into HdrHistograms (``latency_min`` .. ``latency_max`` in microseconds,
``significant_digits`` precision) over a sliding window of ``intervals`` rotating interval
histograms; outcome counters rotate with them. The window covers between
``window - window / intervals`` and ``window`` seconds of the past: the current (partial)
interval plus the ``intervals - 1`` before it.

Cost on the request path: ``HdrHistogram.record_value`` is pure Python (~1-2 us), so
samples are recorded by ``HostStats._record``, an inlined equivalent that writes the same
counts slot of the same histogram object (the unit tests pin it to hdrh's own
``record_value``). The per-request events call nothing while they hold the host's lock, so
that threads do not convoy on it (see the note above :meth:`HostStats.on_send`).

Memory: a host's interval histograms are allocated on its first latency sample (idle
hosts, e.g. in remote datacenters, hold none) and then reused -- a rotation clears them with
one ``memset`` -- so an active host holds ``intervals`` histograms for ever (10 KiB each with
the default config). :meth:`HostStats.window_stats` merges them into a short-lived scratch
histogram.

Percentiles are computed only by :meth:`HostStats.window_stats` (the health refresh), never
per request, by :func:`percentile_values`: a cumulative sum in C and a binary search instead
of hdrh's per-slot Python loop (tens of us instead of ~270-400 us; the same results).
"""

from __future__ import annotations

import array
import bisect
import ctypes
import itertools
import sys
import threading
from collections.abc import Hashable, Iterator, Sequence
from typing import Any

from attrs import define, field
from hdrh.histogram import HdrHistogram

from adaptive_lb.clock import Clock
from adaptive_lb.config import TrackingConfig
from adaptive_lb.health_state import HealthState

__all__ = ["HostStats", "StatsRegistry", "WindowStats", "percentile_values"]

_NS_PER_US = 1000

_WORD_SIZE = 4
"""Bytes per histogram counter: 4 halves the memory of hdrh's default 8, and no slot of a
window can reach 2**32 samples. With the default config a histogram holds 2,560 counters
(10 KiB), so an active host holds at most ``intervals`` x 10 KiB."""

_TYPECODES = {array.array(code).itemsize: code for code in "QLIH"}
"""array typecode of an unsigned integer, by size in bytes (hdrh's counter word sizes)."""


@define(frozen=True, slots=True)
class WindowStats:
    """A host's numbers over the sliding window, at one instant."""

    requests: int
    """Attempts that ended with an outcome (successes + errors + timeouts)."""
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
    error_rate: float = field(init=False)
    """(errors + timeouts) / requests; 0 when there were none."""

    def __attrs_post_init__(self) -> None:
        rate = (self.errors + self.timeouts) / self.requests if self.requests else 0.0
        object.__setattr__(self, "error_rate", rate)


def percentile_values(histogram: HdrHistogram, percentiles: Sequence[float]) -> dict[float, int]:
    """The value at each percentile, exactly as ``histogram.get_percentile_to_value_dict``
    gives it (percentiles above 100 are left out), but computed with a C-level cumulative
    sum over the slots between the histogram's min and max values and a binary search per
    percentile, instead of a Python loop over every slot. Empty when the histogram holds no
    sample. ``min_value`` and ``max_value`` must bound the recorded values (hdrh keeps them
    exact; after its ``add``, ``min_value`` may be lower)."""
    total = histogram.get_total_count()
    if not total:
        return {}
    last = histogram.counts_len - 1
    first = min(max(0, histogram.get_counts_array_index(histogram.min_value)), last)
    end = min(max(0, histogram.get_counts_array_index(histogram.max_value)), last) + 1
    size = histogram.word_size
    raw = bytes(histogram.counts)
    counts = array.array(_TYPECODES[size], raw[first * size : end * size])
    cumulative = list(itertools.accumulate(counts))
    result: dict[float, int] = {}
    for percentile in sorted(set(percentiles)):
        if percentile > 100:
            break
        target = histogram.get_target_count_at_percentile(percentile)
        # min(): only if total_count overstated the counts, which _Interval never does.
        offset = min(bisect.bisect_left(cumulative, target), len(cumulative) - 1)
        value = histogram.get_value_from_index(first + offset)
        if percentile:
            result[percentile] = histogram.get_highest_equivalent_value(value)
        else:
            result[percentile] = histogram.get_lowest_equivalent_value(value)
    return result


def _clear(histogram: HdrHistogram) -> None:
    """Empty ``histogram`` in place (hdrh's ``reset`` loops in Python over every slot)."""
    counts = histogram.counts
    ctypes.memset(ctypes.addressof(counts), 0, ctypes.sizeof(counts))
    histogram.total_count = 0
    histogram.min_value = sys.maxsize
    histogram.max_value = 0


class _Interval:
    """One slice of the window: outcome counters and a latency histogram (allocated on the
    first sample, then reused).

    :meth:`HostStats._record` writes ``counts`` (the histogram's own counts array) directly
    and keeps ``samples`` / ``min_us`` / ``max_us`` here, in slots, which is cheaper than the
    histogram's attributes; :meth:`synced_histogram` copies them into the histogram before
    it is read."""

    __slots__ = (
        "counts",
        "errors",
        "histogram",
        "max_us",
        "min_us",
        "samples",
        "successes",
        "timeouts",
    )

    def __init__(self) -> None:
        self.successes = 0
        self.errors = 0
        self.timeouts = 0
        self.samples = 0
        self.min_us = sys.maxsize
        self.max_us = 0
        self.histogram: HdrHistogram | None = None
        self.counts: ctypes.Array[Any] | None = None

    def allocate(self, histogram: HdrHistogram) -> ctypes.Array[Any]:
        """Adopt ``histogram`` (empty) for this interval's samples; its counts array."""
        self.histogram = histogram
        self.counts = histogram.counts
        return self.counts

    def synced_histogram(self) -> HdrHistogram | None:
        """The histogram, with its total, min and max brought up to date; None when the
        interval holds no sample."""
        histogram = self.histogram
        if histogram is None or not self.samples:
            return None
        histogram.total_count = self.samples
        histogram.min_value = self.min_us
        histogram.max_value = self.max_us
        return histogram

    def clear(self) -> None:
        """Forget every count (the histogram is kept for reuse)."""
        self.successes = self.errors = self.timeouts = 0
        if self.samples:
            self.samples = 0
            self.min_us = sys.maxsize
            self.max_us = 0
            _clear(self.histogram)


@define(frozen=True, slots=True)
class _Layout:
    """A tracking config with the numbers derived from it: the window's interval length and
    hdrh's index arithmetic for the histograms (every histogram of a host has this layout).
    :class:`HostStats` publishes one as a single reference, so a reader outside the lock
    never pairs one config's slot arithmetic with another config's histograms."""

    config: TrackingConfig
    alpha: float
    min_us: int
    max_us: int
    interval_ns: int
    unit_magnitude: int
    sub_bucket_mask: int
    sub_bucket_half: int
    sub_bucket_half_magnitude: int
    bucket_shift: int

    @classmethod
    def of(cls, config: TrackingConfig) -> _Layout:
        """The layout of ``config``."""
        min_us = max(1, round(config.latency_min * 1e6))
        max_us = max(min_us + 1, round(config.latency_max * 1e6))
        probe = _histogram(config, min_us, max_us)
        return cls(
            config=config,
            alpha=config.ewma_alpha,
            min_us=min_us,
            max_us=max_us,
            interval_ns=max(1, round(config.window * 1e9 / config.intervals)),
            unit_magnitude=probe.unit_magnitude,
            sub_bucket_mask=probe.sub_bucket_mask,
            sub_bucket_half=probe.sub_bucket_half_count,
            sub_bucket_half_magnitude=probe.sub_bucket_half_count_magnitude,
            bucket_shift=probe.unit_magnitude + probe.sub_bucket_half_count_magnitude + 1,
        )

    def new_histogram(self) -> HdrHistogram:
        """An empty histogram of this layout."""
        return _histogram(self.config, self.min_us, self.max_us)


def _histogram(config: TrackingConfig, min_us: int, max_us: int) -> HdrHistogram:
    # hdrh needs highest >= 2 x lowest; values are clamped to [min_us, max_us] anyway.
    return HdrHistogram(
        min_us, max(max_us, 2 * min_us), config.significant_digits, word_size=_WORD_SIZE
    )


class HostStats:
    """Live statistics of one host. See the module docstring for the threading contract.

    Public attributes read without a lock: ``in_flight``, ``health_penalty``,
    ``health_state`` (the last two written only by the health model), ``rack_penalty``
    (written only by the policy), the ``*_total`` counters, ``underflows`` and ``ewma_s``.
    """

    __slots__ = (
        "__weakref__",
        "_clock_now",
        "_current",
        "_deadline_ns",
        "_intervals",
        "_layout",
        "_lock",
        "abandons_total",
        "errors_total",
        "ewma_s",
        "health_penalty",
        "health_state",
        "in_flight",
        "rack_penalty",
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
        """State from the health model (read lock-free by the policy)."""
        self.rack_penalty = 1.0
        """Score multiplier for the host's rack, written by the policy that owns these
        statistics: 1 in the client's rack (or when none is known), else
        ``non_local_rack_penalty`` x the rack's proximity factor (read lock-free)."""
        self.ewma_s: float | None = None
        """Smoothed latency in seconds, updated per sample: cheap to read between refreshes."""
        self.requests_total = 0
        """Attempts that ended with an outcome since creation (Prometheus counter)."""
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
        self._clock_now = clock.now_ns
        self._configure(config)

    def _configure(self, config: TrackingConfig) -> None:
        # Caller holds the lock (or is __init__). The layout and the intervals laid out by
        # it are replaced together: readers outside the lock only ever see one layout.
        layout = _Layout.of(config)
        self._intervals = [_Interval() for _ in range(config.intervals)]
        self._current = 0
        self._deadline_ns = self._clock_now() + layout.interval_ns
        self._layout = layout

    def reconfigure(self, config: TrackingConfig) -> None:
        """Adopt a new window / histogram layout (the window starts empty; in-flight,
        totals and the EWMA carry over)."""
        with self._lock:
            self._configure(config)

    @property
    def config(self) -> TrackingConfig:
        """The tracking config in force."""
        return self._layout.config

    # ---------------------------------------------------------------- lifecycle
    #
    # The two per-request events, on_send and on_success, call nothing while they hold the
    # lock (the sample's histogram slot is computed before it is taken; only an interval's
    # rotation or first sample makes a call) and take it with ``with``. Under the GIL a
    # thread is switched out only where the interpreter checks for it, at calls and loop
    # jumps; a switch while the lock is held makes every other thread that wants it block,
    # and each hand-over then costs a futex wait and wake. With ``acquire()`` (a call: a
    # switch point right after it), two threads sending and completing requests on the same
    # hosts got through 3x fewer events than one; ``with`` costs ~0.1 us more per event.

    def on_send(self) -> None:
        """An attempt was sent to this host."""
        with self._lock:
            self.in_flight += 1

    def on_success(self, latency_ns: int) -> None:
        """The attempt got a response; its latency counts."""
        # The most frequent event of all: _release() and _record() are inlined here (two
        # Python calls saved, ~0.2 us); keep the three in step.
        now = self._clock_now()
        # One read of the layout: the slot below is computed for it, and written only if
        # it is still the layout in force once the lock is held (a reload publishes a new
        # layout, with new intervals, under the lock).
        layout = self._layout
        value = latency_ns // _NS_PER_US
        if value < layout.min_us:
            value = layout.min_us
        elif value > layout.max_us:
            value = layout.max_us
        bucket = (value | layout.sub_bucket_mask).bit_length() - layout.bucket_shift
        slot = (
            ((bucket + 1) << layout.sub_bucket_half_magnitude)
            + (value >> (bucket + layout.unit_magnitude))
            - layout.sub_bucket_half
        )
        seconds = value / 1e6
        with self._lock:
            if self.in_flight > 0:
                self.in_flight -= 1
            else:
                self.underflows += 1
            if now >= self._deadline_ns:
                self._rotate(now)  # once per interval
            interval = self._intervals[self._current]
            interval.successes += 1
            self.requests_total += 1
            counts = interval.counts
            if counts is None or self._layout is not layout:
                # The interval's first sample (its histogram is allocated), or a
                # reconfigure changed the layout since the slot was computed.
                self._record(interval, latency_ns)
            else:
                counts[slot] += 1
                interval.samples += 1
                if value > interval.max_us:
                    interval.max_us = value
                if value < interval.min_us:
                    interval.min_us = value
                ewma = self.ewma_s
                self.ewma_s = seconds if ewma is None else ewma + layout.alpha * (seconds - ewma)

    def on_error(self, latency_ns: int, *, fast: bool = True) -> None:
        """The attempt failed. A *fast* error (overloaded, unavailable, broken connection)
        does not enter the latency statistics: a node that fails fast must never look fast.
        A slow one (``fast=False``: the host made us wait before failing, e.g. a server-side
        timeout) does."""
        now = self._clock_now()
        with self._lock:
            self._release()
            if now >= self._deadline_ns:
                self._rotate(now)
            interval = self._intervals[self._current]
            interval.errors += 1
            self.requests_total += 1
            self.errors_total += 1
            if not fast:
                self._record(interval, latency_ns)

    def on_timeout(self, latency_ns: int) -> None:
        """The attempt timed out (client side, or the coordinator reported a timeout); it
        took at least ``latency_ns``, which is recorded."""
        now = self._clock_now()
        with self._lock:
            self._release()
            if now >= self._deadline_ns:
                self._rotate(now)
            interval = self._intervals[self._current]
            interval.timeouts += 1
            self.requests_total += 1
            self.timeouts_total += 1
            self._record(interval, latency_ns)

    def on_abandon(self) -> None:
        """The attempt is released without an outcome (another attempt won, or shutdown)."""
        with self._lock:
            self._release()
            self.abandons_total += 1

    def on_unsent(self) -> None:
        """The attempt counted by :meth:`on_send` was never written to the host."""
        with self._lock:
            self._release()
            self.unsent_total += 1

    # The helpers below run with the lock held.

    def _release(self) -> None:
        if self.in_flight > 0:
            self.in_flight -= 1
        else:
            self.underflows += 1

    def _record(self, interval: _Interval, latency_ns: int) -> None:
        """Clamp the latency to the histogram's range and count it in ``interval``, exactly
        as ``HdrHistogram.record_value`` would (inlined: that method costs ~1-2 us), then
        update the EWMA."""
        layout = self._layout
        value = latency_ns // _NS_PER_US
        if value < layout.min_us:
            value = layout.min_us
        elif value > layout.max_us:
            value = layout.max_us
        counts = interval.counts
        if counts is None:
            counts = interval.allocate(layout.new_histogram())
        bucket = (value | layout.sub_bucket_mask).bit_length() - layout.bucket_shift
        counts[
            ((bucket + 1) << layout.sub_bucket_half_magnitude)
            + (value >> (bucket + layout.unit_magnitude))
            - layout.sub_bucket_half
        ] += 1
        interval.samples += 1
        if value > interval.max_us:
            interval.max_us = value
        if value < interval.min_us:
            interval.min_us = value
        seconds = value / 1e6
        ewma = self.ewma_s
        self.ewma_s = seconds if ewma is None else ewma + layout.alpha * (seconds - ewma)

    def _rotate(self, now: int) -> None:
        """Move to the interval that contains ``now``, clearing every interval skipped on
        the way (after ``window`` seconds of idleness, that is all of them)."""
        interval_ns = self._layout.interval_ns
        elapsed = (now - self._deadline_ns) // interval_ns + 1
        intervals = self._intervals
        count = len(intervals)
        for _ in range(min(elapsed, count)):
            self._current = (self._current + 1) % count
            intervals[self._current].clear()
        self._deadline_ns += elapsed * interval_ns

    # ---------------------------------------------------------------- reading

    def window_stats(self, percentiles: Sequence[float] = (50.0, 95.0, 99.0)) -> WindowStats:
        """Counts and latency percentiles over the window. Under the host's lock the
        counters are summed and the interval histograms merged into a scratch histogram
        (a C-level add per interval, a few us each); the percentiles are read outside it."""
        now = self._clock_now()
        # Allocated before taking the lock when the host has ever recorded a sample.
        layout = self._layout
        scratch = layout.new_histogram() if self.ewma_s is not None else None
        with self._lock:
            if now >= self._deadline_ns:
                self._rotate(now)
            successes = errors = timeouts = 0
            for interval in self._intervals:
                successes += interval.successes
                errors += interval.errors
                timeouts += interval.timeouts
                histogram = interval.synced_histogram()
                if histogram is not None:
                    if scratch is None or scratch.counts_len != histogram.counts_len:
                        scratch = self._layout.new_histogram()  # a reconfigure raced us
                    # HdrHistogram.add() does exactly this for equal layouts (always the
                    # case here), plus ~10 us of Python range checks under our lock.
                    scratch.encoder.add(histogram.encoder)
                    scratch.total_count += histogram.total_count
                    scratch.min_value = min(scratch.min_value, histogram.min_value)
                    scratch.max_value = max(scratch.max_value, histogram.max_value)
            ewma = self.ewma_s
            in_flight = self.in_flight
        samples = scratch.get_total_count() if scratch is not None else 0
        if samples:
            values = percentile_values(scratch, percentiles)
            latency = {float(p): values[p] / 1e6 if p in values else None for p in percentiles}
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
        """The stats of ``key`` if it has any (never creates them)."""
        return self._stats.get(key)

    def remove(self, key: Hashable) -> None:
        """Forget ``key``; its memory goes once nothing refers to it. A HostStats still
        referenced (requests in flight) keeps working, it is just no longer listed."""
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
        """The known keys (a copy)."""
        return list(self._stats)

    def items(self) -> list[tuple[Hashable, HostStats]]:
        """(key, stats) pairs (a copy)."""
        return list(self._stats.items())

    def __len__(self) -> int:
        return len(self._stats)

    def __contains__(self, key: object) -> bool:
        return key in self._stats

    def __iter__(self) -> Iterator[Hashable]:
        return iter(list(self._stats))
