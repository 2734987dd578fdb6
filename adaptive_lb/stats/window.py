"""A host's sliding window of outcomes and latency, filled by replaying recorded events
(no driver import).

The request path does not write histograms. :class:`~adaptive_lb.stats.host.HostStats` appends
each outcome to a list of *events* under its lock, in the order they happened, and a
:class:`SlidingWindow` replays them later, in the same order, on whichever thread reads the
window (the health refresh) or when the list grows long. An event is one of:

* an ``int``: a success, with its latency in ns (the common case: no allocation beyond it);
* ``(TIMEOUT, latency_ns)``: a timeout, whose latency is a sample;
* ``(ERROR, latency_ns)`` / ``(ERROR, None)``: an error, slow (a sample) or fast (none);
* ``(ROTATE, steps)``: the window moved ``steps`` intervals on (appended by the recorder
  when an event found the interval's deadline past).

Replaying the stream gives exactly what recording each event as it happened gave: the same
intervals, counts and histogram slots. Only the replayer touches the intervals.

The window is ``intervals`` rotating interval histograms (HdrHistograms over ``latency_min``
.. ``latency_max`` in microseconds, ``significant_digits`` precision) with their outcome
counters. It covers between ``window - window / intervals`` and ``window`` seconds of the
past: the current (partial) interval plus the ``intervals - 1`` before it. A histogram is
allocated on its interval's first sample (idle hosts hold none) and then reused.

Imports hdrh (its internals through :mod:`adaptive_lb.stats._hdr`), attrs and the config only.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from attrs import define
from hdrh.histogram import HdrHistogram

from adaptive_lb.config import TrackingConfig
from adaptive_lb.stats._hdr import HistogramLayout, Recorder, merge_into

__all__ = ["ERROR", "ROTATE", "TIMEOUT", "SlidingWindow", "WindowCounts", "WindowLayout"]

ROTATE = 0
"""Event tag: ``(ROTATE, steps)``, the window moves ``steps`` intervals on."""
TIMEOUT = 1
"""Event tag: ``(TIMEOUT, latency_ns)``."""
ERROR = 2
"""Event tag: ``(ERROR, latency_ns)`` for a slow error, ``(ERROR, None)`` for a fast one."""

_NS_PER_US = 1000


@define(frozen=True, slots=True)
class WindowLayout(HistogramLayout):
    """A tracking config with the numbers derived from it: the window's interval length and
    (inherited) the histograms' range and slot arithmetic."""

    config: TrackingConfig
    interval_ns: int

    @classmethod
    def for_config(cls, config: TrackingConfig) -> WindowLayout:
        """The layout of ``config``."""
        min_us = max(1, round(config.latency_min * 1e6))
        max_us = max(min_us + 1, round(config.latency_max * 1e6))
        return cls.of(
            min_us,
            max_us,
            config.significant_digits,
            config=config,
            interval_ns=max(1, round(config.window * 1e9 / config.intervals)),
        )

    def clamp_us(self, latency_ns: int) -> int:
        """``latency_ns`` in microseconds, clamped to the histograms' range."""
        value = latency_ns // _NS_PER_US
        if value < self.min_us:
            return self.min_us
        if value > self.max_us:
            return self.max_us
        return value


class _Interval(Recorder):
    """One slice of the window: outcome counters, and the latency samples recorded into a
    histogram (allocated on the first sample, then reused; see :class:`Recorder`)."""

    __slots__ = ("errors", "successes", "timeouts")

    def __init__(self) -> None:
        super().__init__()
        self.successes = 0
        self.errors = 0
        self.timeouts = 0

    def clear(self) -> None:
        """Forget every count (the histogram is kept for reuse)."""
        self.successes = self.errors = self.timeouts = 0
        super().clear()


@define(frozen=True, slots=True)
class WindowCounts:
    """What the window holds at one instant: outcome counts, and the intervals' samples
    merged into one histogram (None when there is no sample)."""

    successes: int
    errors: int
    timeouts: int
    samples: int
    histogram: HdrHistogram | None


class SlidingWindow:
    """The intervals of one host under one layout. Not thread-safe: its owner serialises
    :meth:`replay` and :meth:`counts` (HostStats does, under its replay lock)."""

    __slots__ = ("_current", "_intervals", "layout", "rotations")

    def __init__(self, layout: WindowLayout) -> None:
        self.layout = layout
        self._intervals = [_Interval() for _ in range(layout.config.intervals)]
        self._current = 0
        self.rotations = 0
        """Intervals entered since the window was made: the number of the current one."""

    def replay(self, events: Iterable[int | tuple[int, int | None]]) -> None:
        """Apply ``events`` (see the module docstring), in order."""
        # Successes are the bulk: their recording is inlined (HistogramLayout.slot_of and
        # Recorder.add, with the interval's counters kept in locals until the interval
        # changes or the events end); test_window and test_stats pin it to hdrh's
        # record_value.
        layout = self.layout
        min_us, max_us = layout.min_us, layout.max_us
        mask, shift = layout.sub_bucket_mask, layout.bucket_shift
        half_magnitude, half = layout.sub_bucket_half_magnitude, layout.sub_bucket_half
        unit = layout.unit_magnitude
        interval = self._intervals[self._current]
        counts = interval.counts
        successes = 0
        low, high = interval.min_us, interval.max_us
        for event in events:
            if type(event) is int:
                value = event // _NS_PER_US
                if value < min_us:
                    value = min_us
                elif value > max_us:
                    value = max_us
                if counts is None:
                    counts = interval.allocate(layout)
                bucket = (value | mask).bit_length() - shift
                counts[((bucket + 1) << half_magnitude) + (value >> (bucket + unit)) - half] += 1
                successes += 1
                if value > high:
                    high = value
                if value < low:
                    low = value
                continue
            # Any other event: the interval's counters are brought up to date first.
            interval.successes += successes
            interval.samples += successes
            interval.min_us, interval.max_us = low, high
            successes = 0
            tag, latency_ns = event  # type: ignore[misc]
            if tag == ROTATE:
                self._rotate(latency_ns or 0)
                interval = self._intervals[self._current]
                counts = interval.counts
            else:
                if tag == TIMEOUT:
                    interval.timeouts += 1
                else:
                    interval.errors += 1
                if latency_ns is not None:
                    self._record(interval, latency_ns)
                    counts = interval.counts
            low, high = interval.min_us, interval.max_us
        interval.successes += successes
        interval.samples += successes
        interval.min_us, interval.max_us = low, high

    def _record(self, interval: _Interval, latency_ns: int) -> None:
        """Count one latency sample in ``interval``."""
        layout = self.layout
        value = layout.clamp_us(latency_ns)
        counts = interval.counts
        if counts is None:
            counts = interval.allocate(layout)
        interval.add(counts, layout.slot_of(value), value)

    def _rotate(self, steps: int) -> None:
        """Move ``steps`` intervals on, clearing each one entered (all of them after a
        whole window of idleness)."""
        intervals = self._intervals
        count = len(intervals)
        self.rotations += steps
        for _ in range(min(steps, count)):
            self._current = (self._current + 1) % count
            intervals[self._current].clear()

    def counts(self, newer_than: int | None = None) -> WindowCounts:
        """The counters summed over the intervals, and their histograms merged into a new
        histogram of this layout (made only when there is a sample). ``newer_than``: only
        the intervals entered after the one numbered so (:attr:`rotations`): answers that
        arrived since then, none that was in the window at that time."""
        scratch: HdrHistogram | None = None
        successes = errors = timeouts = samples = 0
        intervals = self._intervals
        if newer_than is not None:
            newest = max(0, min(len(intervals), self.rotations - newer_than))
            intervals = [intervals[(self._current - j) % len(intervals)] for j in range(newest)]
        for interval in intervals:
            successes += interval.successes
            errors += interval.errors
            timeouts += interval.timeouts
            histogram = interval.synced_histogram()
            if histogram is not None:
                if scratch is None:
                    scratch = self.layout.new_histogram()
                merge_into(scratch, histogram)
                samples += interval.samples
        return WindowCounts(successes, errors, timeouts, samples, scratch if samples else None)

    def current_interval(self) -> _Interval:
        """The interval being filled (tests look at its slots)."""
        return self._intervals[self._current]

    def histograms(self) -> Sequence[HdrHistogram | None]:
        """Each interval's histogram object, allocated or not (tests check their reuse)."""
        return [interval.histogram for interval in self._intervals]
