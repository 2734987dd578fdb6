"""Per-host statistics: in-flight count, outcome totals and the sliding latency window
(no driver import).

One :class:`HostStats` per host. The policy's hot path reads plain attributes without a
lock (``in_flight``, ``health_penalty``, ``health_state``, ``rack_penalty``). ``in_flight``
is the driver's own count of the host's pool when request tracking gave one
(:meth:`HostStats.read_in_flight_from`, set through
:class:`adaptive_lb.stats.registry.StatsRegistry`), else the attempts counted here; request
tracking calls one lifecycle method per event (:meth:`HostStats.on_send`, then exactly one
of ``on_success`` / ``on_error`` / ``on_timeout`` / ``on_abandon`` / ``on_unsent``), each a
single acquisition of the host's lock, so no count is ever lost -- also under free-threaded
CPython, where an unlocked ``x += 1`` can be.

An outcome is not recorded into the window's histograms on the request path: it is
appended, under that same lock, to the host's list of events, and the window
(:class:`adaptive_lb.stats.window.SlidingWindow`) replays the list in order when it is read --
by :meth:`HostStats.window_stats`, every health refresh -- or when the list reaches
``EVENTS_LIMIT`` events. Replaying gives exactly what recording each event at once gave
(the interval boundaries travel in the list as events), while the request path does an
append instead of the histogram arithmetic, and the replay runs it in one tight loop.
Percentiles are computed only by :meth:`HostStats.window_stats`, never per request.

Imports its row's records (window, probe record, server load, latency factor, health
states), :mod:`adaptive_lb.stats._hdr`, attrs, the config and the clock only.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence

from attrs import define, field

from adaptive_lb.config import TrackingConfig
from adaptive_lb.core.clock import Clock
from adaptive_lb.stats._hdr import percentile_values
from adaptive_lb.stats.health_state import HealthState
from adaptive_lb.stats.latency_factor import LatencyRecord
from adaptive_lb.stats.probe_record import ProbeRecord
from adaptive_lb.stats.server_load import ServerLoadRecord
from adaptive_lb.stats.window import ERROR, ROTATE, TIMEOUT, SlidingWindow, WindowLayout

__all__ = ["EVENTS_LIMIT", "HostStats", "WindowStats"]

EVENTS_LIMIT = 1024
"""Events a host keeps before the request that appends the last one replays them itself:
bounds the list (~40 KiB) when nothing reads the window. With the health refresh running
(every 200 ms by default) only a host answering over ~5,000 requests a second reaches it;
the replay then costs that request's thread ~0.4 ms, the work its 1,024 events saved."""


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
    interval: int = 0
    """The number of the window's current interval (:attr:`SlidingWindow.rotations`)."""
    in_flight: int = 0
    """Tracked attempts in flight (:attr:`HostStats.counted_in_flight`): the requests
    whose answers the window waits for, which is what the stall rule needs; the driver's
    pool count also holds streams orphaned by timeouts that may never be answered."""
    error_rate: float = field(init=False)
    """(errors + timeouts) / requests; 0 when there were none."""

    def __attrs_post_init__(self) -> None:
        rate = (self.errors + self.timeouts) / self.requests if self.requests else 0.0
        object.__setattr__(self, "error_rate", rate)


class HostStats:
    """Live statistics of one host. See the module docstring for the threading contract.

    Public attributes read without a lock: ``in_flight`` (a property: the driver's pool
    count, or :attr:`counted_in_flight`), ``health_penalty``,
    ``health_state`` (the last two written only by the health model), ``rack_penalty``
    (written only by the policy), the ``*_total`` counters and ``underflows``.
    """

    __slots__ = (
        "__weakref__",
        "_clock_now",
        "_deadline_ns",
        "_events",
        "_lock",
        "_penalty_after_probe",
        "_replay_lock",
        "_window",
        "abandons_total",
        "counted_in_flight",
        "errors_total",
        "health_penalty",
        "health_state",
        "latency",
        "latency_factor",
        "load",
        "pool_in_flight",
        "probe_left",
        "probes",
        "rack_penalty",
        "requests_total",
        "server_load",
        "timeouts_total",
        "underflows",
        "unsent_total",
    )

    def __init__(self, config: TrackingConfig, clock: Clock) -> None:
        self.counted_in_flight = 0
        """Attempts of tracked requests sent and not yet released: every attempt while
        traffic is thin, a sample of them otherwise, which is why the driver's count (or
        the simulator's model of it) is used when there is one (:attr:`in_flight`)."""
        self.pool_in_flight: Callable[[], int] | None = None
        """Reads the driver's in-flight count of this host's pool
        (:meth:`read_in_flight_from`); None: :attr:`in_flight` is the counted one."""
        self.health_penalty = 1.0
        """Score multiplier from the health model (read lock-free by the policy)."""
        self.health_state = HealthState.HEALTHY
        """State from the health model (read lock-free by the policy)."""
        self.rack_penalty = 1.0
        """Score multiplier for the host's rack, written by the policy that owns these
        statistics: 1 in the client's rack (or when none is known), else
        ``non_local_rack_penalty`` x the rack's proximity factor (read lock-free)."""
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
        self.probes = ProbeRecord()
        """adaptive-lb's own probes of this host (:mod:`adaptive_lb.stats.probe_record`),
        counted apart from the user's requests above."""
        self.server_load = 1.0
        """Score multiplier from the host's own view of its load (read lock-free by the
        policy, written by the health refresh: :func:`adaptive_lb.stats.server_load.publish`)."""
        self.load = ServerLoadRecord()
        """Reads of the host's thread pools (:mod:`adaptive_lb.stats.server_load`), counted
        apart from the user's requests."""
        self.latency_factor = 1.0
        """Score multiplier from the latency the host shows against its peers' (read
        lock-free by the policy, written by the health refresh:
        :mod:`adaptive_lb.stats.latency_factor`)."""
        self.latency = LatencyRecord()
        """The envelope the latency factor comes from, and its inputs at the last refresh."""
        self._lock = threading.Lock()
        """Guards the counters above and the events list (the request path's lock)."""
        self._replay_lock = threading.Lock()
        """Serialises replays (taken before ``_lock``, never after it): batches of events
        reach the window in the order they were taken."""
        self._clock_now = clock.now_ns
        self._configure(config)

    def _configure(self, config: TrackingConfig) -> None:
        # Caller holds both locks (or is __init__): the events recorded for the old window
        # are dropped with it.
        layout = WindowLayout.for_config(config)
        self._window = SlidingWindow(layout)
        self._events: list[int | tuple[int, int | None]] = []
        self._deadline_ns = self._clock_now() + layout.interval_ns

    def reconfigure(self, config: TrackingConfig) -> None:
        """Adopt a new window / histogram layout (the window starts empty; in-flight,
        totals carry over)."""
        with self._replay_lock, self._lock:
            self._configure(config)

    @property
    def in_flight(self) -> int:
        """Requests in flight on this host: the driver's count when request tracking
        reads it from the session's pools, else :attr:`counted_in_flight`. Read lock-free
        by every plan."""
        read = self.pool_in_flight
        if read is None:
            return self.counted_in_flight
        return read()

    @in_flight.setter
    def in_flight(self, value: int) -> None:
        self.counted_in_flight = value

    def read_in_flight_from(self, read: Callable[[], int] | None) -> None:
        """Take :attr:`in_flight` from ``read()`` (the driver's pool count of this host),
        or again from the attempts counted here (None)."""
        self.pool_in_flight = read

    @property
    def config(self) -> TrackingConfig:
        """The tracking config in force."""
        return self._window.layout.config

    # ---------------------------------------------------------------- lifecycle
    #
    # The per-request events call nothing while they hold the lock (list.append is not a
    # call to the interpreter: it never lets another thread in; only an interval's
    # deadline makes a call, once per interval) and take it with ``with``. Under the GIL a
    # thread is switched out only where the interpreter checks for it, at calls and loop
    # jumps; a switch while the lock is held makes every other thread that wants it block,
    # and each hand-over then costs a futex wait and wake. With ``acquire()`` (a call: a
    # switch point right after it), two threads sending and completing requests on the same
    # hosts got through 3x fewer events than one; ``with`` costs ~0.1 us more per event.

    def on_send(self) -> None:
        """An attempt was sent to this host."""
        with self._lock:
            self.counted_in_flight += 1
            if self.probe_left:
                self.probe_left -= 1
                if not self.probe_left:
                    self.health_penalty = self._penalty_after_probe

    def on_success(self, latency_ns: int) -> None:
        """The attempt got a response; its latency counts."""
        # _settle's steps, inlined: the most frequent event of all.
        now = self._clock_now()
        with self._lock:
            if self.counted_in_flight > 0:
                self.counted_in_flight -= 1
            else:
                self.underflows += 1
            self.requests_total += 1
            if now >= self._deadline_ns:
                self._mark_rotation(now)  # once per interval
            events = self._events
            events.append(latency_ns)
        if len(events) >= EVENTS_LIMIT:
            self.replay()

    def on_error(self, latency_ns: int, *, fast: bool = True) -> None:
        """The attempt failed. A *fast* error (overloaded, unavailable, broken connection)
        does not enter the latency statistics: a node that fails fast must never look fast.
        A slow one (``fast=False``: the host made us wait before failing, e.g. a server-side
        timeout) does."""
        self._settle((ERROR, None if fast else latency_ns))

    def on_timeout(self, latency_ns: int) -> None:
        """The attempt timed out (client side, or the coordinator reported a timeout); it
        took at least ``latency_ns``, which is recorded."""
        self._settle((TIMEOUT, latency_ns))

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

    # The helpers below, but _settle, run with the lock held.

    def _settle(self, event: tuple[int, int | None]) -> None:
        """Release an attempt that failed (an error or timeout ``event``): it ends a probe."""
        now = self._clock_now()
        with self._lock:
            self._release()
            self.requests_total += 1
            if event[0] == TIMEOUT:
                self.timeouts_total += 1
            else:
                self.errors_total += 1
            if self.probe_left:
                self.probe_left = 0
                self.health_penalty = self._penalty_after_probe
            if now >= self._deadline_ns:
                self._mark_rotation(now)
            self._events.append(event)

    def _release(self) -> None:
        if self.counted_in_flight > 0:
            self.counted_in_flight -= 1
        else:
            self.underflows += 1

    def _mark_rotation(self, now: int) -> None:
        """The window moves to the interval that contains ``now`` (an event in the list)."""
        interval_ns = self._window.layout.interval_ns
        steps = (now - self._deadline_ns) // interval_ns + 1
        self._deadline_ns += steps * interval_ns
        self._events.append((ROTATE, steps))

    # ---------------------------------------------------------------- reading

    def replay(self) -> SlidingWindow:
        """Bring the window up to date with the events recorded so far; the window."""
        with self._replay_lock:
            return self._replay()

    def _replay(self) -> SlidingWindow:
        # Caller holds the replay lock: the list is taken under the request path's lock
        # (an O(1) swap) and replayed outside it.
        with self._lock:
            events = self._events
            # Always a new list: one still in place (even empty now) keeps being appended
            # to, so it must never be replayed.
            self._events = []
            window = self._window
        if events:
            window.replay(events)
        return window

    def window_stats(
        self,
        percentiles: Sequence[float] = (50.0, 95.0, 99.0),
        more: Callable[[int], Sequence[float] | None] | None = None,
        newer_than: int | None = None,
    ) -> WindowStats:
        """Counts and latency percentiles over the window, with every event recorded so far
        replayed; the window first moves to the interval of now. The intervals' histograms
        are merged into a scratch histogram (a C-level add per interval, a few us each)
        under the replay lock; the percentiles are read outside it. ``more``: more
        percentiles, from the window's sample count (None: none). ``newer_than``: only the
        intervals entered after the one numbered so (:meth:`SlidingWindow.counts`)."""
        now = self._clock_now()
        with self._replay_lock:
            with self._lock:
                if now >= self._deadline_ns:
                    self._mark_rotation(now)
            window = self._replay()
            counts = window.counts(newer_than)
            interval = window.rotations
        in_flight = self.counted_in_flight
        if more is not None:
            extra = more(counts.samples)
            if extra is not None:
                percentiles = [*percentiles, *extra]
        if counts.histogram is not None:
            values = percentile_values(counts.histogram, percentiles)
            latency = {float(p): values[p] / 1e6 if p in values else None for p in percentiles}
        else:
            latency = {float(p): None for p in percentiles}
        return WindowStats(
            requests=counts.successes + counts.errors + counts.timeouts,
            successes=counts.successes,
            errors=counts.errors,
            timeouts=counts.timeouts,
            samples=counts.samples,
            latency=latency,
            interval=interval,
            in_flight=in_flight,
        )
