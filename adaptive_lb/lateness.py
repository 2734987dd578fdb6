"""The client's own lateness: how late this process runs its own timers (pure logic).

An answer's latency as the client measures it includes the client's delay in handling it:
a garbage collection, the GIL held by a busy thread, a CPU shared with other processes.
That delay is the client's, not the host's, and it lands on whichever hosts had requests in
flight at the moment. It is also what delays a periodic timer of the client's own: the
health refresh sleeps ``health.refresh_interval`` and measures how much longer the sleep
took (:class:`adaptive_lb.refresher.HealthRefresher`; the simulator feeds its own pauses).
:class:`ClientLateness` keeps the largest lateness seen in each interval of the statistics
window, so that the health judgement can discount what the client itself may have added to
any answer in the window (:mod:`adaptive_lb.judgement`).

Imports the standard library only.
"""

from __future__ import annotations

import threading

__all__ = ["ClientLateness", "discounted"]

_NS = 1_000_000_000


def discounted(latency_s: float, lateness_s: float, reference_s: float) -> float:
    """A host's latency ``latency_s`` without what the client itself may have added to it
    (``lateness_s``), compared with its peers' ``reference_s``: never below the reference
    (the client's lateness makes a host look slower, never faster). A saturated client
    serves its sockets in turn, and one host's answers can wait longer than the others' for
    as long as the client is late: a latency gap within that is no evidence."""
    if lateness_s <= 0.0:
        return latency_s
    return max(min(latency_s, reference_s), latency_s - lateness_s)


class ClientLateness:
    """The largest lateness of the client's own timer over a sliding window of
    ``window_s`` seconds in ``intervals`` slices. Thread-safe (one lock, taken a few times a
    second, never on the request path)."""

    __slots__ = ("_intervals", "_lock", "_slice_ns", "_slices")

    def __init__(self, window_s: float = 10.0, intervals: int = 5) -> None:
        self._lock = threading.Lock()
        self._intervals = max(1, intervals)
        self._slice_ns = max(1, round(window_s * _NS / self._intervals))
        self._slices: dict[int, float] = {}
        """Slice number (time // slice length) -> the largest lateness seen in it, s."""

    def reconfigure(self, window_s: float, intervals: int) -> None:
        """A new window length (a reload): what was seen is forgotten."""
        with self._lock:
            self._intervals = max(1, intervals)
            self._slice_ns = max(1, round(window_s * _NS / self._intervals))
            self._slices = {}

    def after_fork(self) -> None:
        """In a forked child: a new lock (the parent's refresh thread may have held this
        one at the fork) and nothing seen (the parent's lateness is not this process's)."""
        self._lock = threading.Lock()
        self._slices = {}

    def observe(self, now_ns: int, late_s: float) -> None:
        """The client's timer fired ``late_s`` seconds late at ``now_ns``."""
        if not late_s > 0.0:
            return
        with self._lock:
            current = now_ns // self._slice_ns
            if late_s > self._slices.get(current, 0.0):
                self._slices[current] = late_s
            oldest = current - self._intervals
            for key in [key for key in self._slices if key <= oldest]:
                del self._slices[key]

    def high(self, now_ns: int) -> float:
        """The largest lateness in the window ending at ``now_ns``, seconds (0 when none
        was seen)."""
        with self._lock:
            oldest = now_ns // self._slice_ns - self._intervals
            return max((late for key, late in self._slices.items() if key > oldest), default=0.0)
