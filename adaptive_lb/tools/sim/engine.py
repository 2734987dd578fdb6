"""The discrete-event engine: a priority queue of callbacks on a virtual clock.

Every event is ``(time_ns, seq, callback, arg)``; ``seq`` makes events at the same instant
run in the order they were scheduled, so a run is a pure function of its seeds. Before each
callback the engine moves the shared :class:`~adaptive_lb.core.clock.ManualClock` to the event's
time, so the policies' own tracking and health code (which read that clock) see virtual time.

Imports the library's clock only.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable
from typing import Any

from adaptive_lb.core.clock import ManualClock

__all__ = ["NS_PER_S", "Engine"]

NS_PER_S = 1_000_000_000


class Engine:
    """Runs callbacks in virtual-time order until stopped or out of events."""

    __slots__ = ("_queue", "_seq", "_stopped", "clock", "events", "now")

    def __init__(self, clock: ManualClock | None = None) -> None:
        self.clock = clock if clock is not None else ManualClock(0)
        self.now: int = self.clock.now_ns()
        """Current virtual time, ns (the clock's value, readable without a call)."""
        self._queue: list[tuple[int, int, Callable[[Any], None], Any]] = []
        self._seq = 0
        self._stopped = False
        self.events = 0
        """Events run so far."""

    def at(self, time_ns: int, callback: Callable[[Any], None], arg: Any = None) -> None:
        """Run ``callback(arg)`` at ``time_ns`` (not earlier than now)."""
        if time_ns < self.now:
            time_ns = self.now
        self._seq += 1
        heapq.heappush(self._queue, (time_ns, self._seq, callback, arg))

    def after(self, delay_ns: int, callback: Callable[[Any], None], arg: Any = None) -> None:
        """Run ``callback(arg)`` ``delay_ns`` from now."""
        self._seq += 1
        heapq.heappush(self._queue, (self.now + max(0, delay_ns), self._seq, callback, arg))

    def every(self, interval_ns: int, callback: Callable[[], None], start_ns: int = 0) -> None:
        """Run ``callback()`` every ``interval_ns`` from ``start_ns`` until the engine stops."""

        def tick(_: Any) -> None:
            callback()
            self.after(interval_ns, tick)

        self.at(max(start_ns, self.now), tick)

    def stop(self) -> None:
        """End :meth:`run` after the current event."""
        self._stopped = True

    def run(self, until_ns: int | None = None) -> None:
        """Run events in time order until :meth:`stop`, no events left, or ``until_ns``."""
        queue = self._queue
        pop = heapq.heappop
        set_clock = self.clock.set
        self._stopped = False
        count = 0
        while queue and not self._stopped:
            if until_ns is not None and queue[0][0] > until_ns:
                break
            time_ns, _, callback, arg = pop(queue)
            if time_ns != self.now:
                self.now = time_ns
                set_clock(time_ns)
            callback(arg)
            count += 1
        self.events += count
        if until_ns is not None and not self._stopped and until_ns > self.now:
            self.now = until_ns
            set_clock(until_ns)

    def __len__(self) -> int:
        return len(self._queue)
