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

Cost on the request path: a sample is written straight into its histogram's counts slot
(``record_value``'s arithmetic, inlined: as a call it costs ~1-2 us), and the per-request
events call nothing while they hold the lock (see the note above
:meth:`HostStats.on_send`). Every HdrHistogram internal used is in :mod:`adaptive_lb._hdr`.
A host's histograms are allocated on its first latency sample (idle hosts hold none) and
then reused, ``intervals`` x 10 KiB with the default config. Percentiles are computed only
by :meth:`HostStats.window_stats` (the health refresh), never per request.
"""

from __future__ import annotations

import threading
from collections.abc import Hashable, Iterator, Sequence

from attrs import define, field

from adaptive_lb._hdr import HistogramLayout, Recorder, merge_into, percentile_values
from adaptive_lb.clock import Clock
from adaptive_lb.config import TrackingConfig
from adaptive_lb.health_state import HealthState

__all__ = ["HostStats", "StatsRegistry", "WindowStats"]

_NS_PER_US = 1000


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


@define(frozen=True, slots=True)
class _Layout(HistogramLayout):
    """A tracking config with the numbers derived from it: the window's interval length and
    (inherited) the histograms' range and slot arithmetic (every histogram of a host has
    this layout). :class:`HostStats` publishes one as a single reference, so a reader
    outside the lock never pairs one config's slot arithmetic with another config's
    histograms."""

    config: TrackingConfig
    alpha: float
    interval_ns: int

    @classmethod
    def for_config(cls, config: TrackingConfig) -> _Layout:
        """The layout of ``config``."""
        min_us = max(1, round(config.latency_min * 1e6))
        max_us = max(min_us + 1, round(config.latency_max * 1e6))
        return cls.of(
            min_us,
            max_us,
            config.significant_digits,
            config=config,
            alpha=config.ewma_alpha,
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
        "_penalty_after_probe",
        "abandons_total",
        "errors_total",
        "ewma_s",
        "health_penalty",
        "health_state",
        "in_flight",
        "probe_left",
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
        self.probe_left = 0
        """Requests the probe of this ERRORING host may still send at the probe's penalty
        (:meth:`start_probe`; 0: no probe)."""
        self._penalty_after_probe = 1.0
        self._lock = threading.Lock()
        self._clock_now = clock.now_ns
        self._configure(config)

    def _configure(self, config: TrackingConfig) -> None:
        # Caller holds the lock (or is __init__). The layout and the intervals laid out by
        # it are replaced together: readers outside the lock only ever see one layout.
        layout = _Layout.for_config(config)
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
            if self.probe_left:
                self.probe_left -= 1
                if not self.probe_left:
                    self.health_penalty = self._penalty_after_probe

    def on_success(self, latency_ns: int) -> None:
        """The attempt got a response; its latency counts."""
        # The most frequent event of all: _settle() and _record() are inlined here, with
        # _Layout.clamp_us, HistogramLayout.slot_of and Recorder.add (Python calls saved,
        # ~0.1 us each); keep them in step (test_stats pins this copy to hdrh's own
        # record_value and to _record).
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
            interval = self._settle(now)
            interval.errors += 1
            self.errors_total += 1
            if self.probe_left:
                self._end_probe()
            if not fast:
                self._record(interval, latency_ns)

    def on_timeout(self, latency_ns: int) -> None:
        """The attempt timed out (client side, or the coordinator reported a timeout); it
        took at least ``latency_ns``, which is recorded."""
        now = self._clock_now()
        with self._lock:
            interval = self._settle(now)
            interval.timeouts += 1
            self.timeouts_total += 1
            if self.probe_left:
                self._end_probe()
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

    # ---------------------------------------------------------------- health

    def publish_health(self, state: HealthState, penalty: float) -> None:
        """The health model's verdict: ``state`` and ``penalty`` from now on (a probe in
        progress ends)."""
        with self._lock:
            self.probe_left = 0
            self.health_state = state
            self.health_penalty = penalty

    def start_probe(self, requests: int, penalty: float, after: float) -> None:
        """Probe this (ERRORING) host: its next ``requests`` attempts are placed at
        ``penalty``, then (or at its first error or timeout) the penalty is ``after``. The
        budget is spent by :meth:`on_send`, so concurrent plans share it; a few plans made
        at the same instant may still place the host at ``penalty``."""
        with self._lock:
            self._penalty_after_probe = after
            self.probe_left = requests
            self.health_penalty = penalty if requests > 0 else after

    # The helpers below run with the lock held.

    def _end_probe(self) -> None:
        self.probe_left = 0
        self.health_penalty = self._penalty_after_probe

    def _release(self) -> None:
        if self.in_flight > 0:
            self.in_flight -= 1
        else:
            self.underflows += 1

    def _settle(self, now: int) -> _Interval:
        """Release an attempt that ended with an outcome at ``now``: the interval that
        counts it."""
        self._release()
        if now >= self._deadline_ns:
            self._rotate(now)
        self.requests_total += 1
        return self._intervals[self._current]

    def _record(self, interval: _Interval, latency_ns: int) -> None:
        """Clamp the latency to the histograms' range and count it in ``interval`` (its
        histogram allocated on its first sample), then update the EWMA."""
        layout = self._layout
        value = layout.clamp_us(latency_ns)
        counts = interval.counts
        if counts is None:
            counts = interval.allocate(layout)
        interval.add(counts, layout.slot_of(value), value)
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
            successes = errors = timeouts = samples = 0
            for interval in self._intervals:
                successes += interval.successes
                errors += interval.errors
                timeouts += interval.timeouts
                histogram = interval.synced_histogram()
                if histogram is not None:
                    if scratch is None or self._layout is not layout:
                        # The first sample since, or a reconfigure raced us.
                        layout = self._layout
                        scratch = layout.new_histogram()
                    merge_into(scratch, histogram)
                    samples += interval.samples
            ewma = self.ewma_s
            in_flight = self.in_flight
        if scratch is not None and samples:
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
