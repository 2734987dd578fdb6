"""One counted, rate-limited path for every exception caught inside adaptive-lb.

adaptive-lb never lets its own failure reach the driver or the application: the plan falls
back to the child's, a failed health refresh keeps the last verdicts, a failed snapshot
leaves a scrape without the policy's numbers. Each such failure is counted here by *stage*
(where it happened) and logged with its traceback at most once per ``interval_s`` per
stage, so a failure that repeats on every request or every refresh costs a counter
increment, not a log line.

No driver import: the simulator and the pure modules may use it too. Imports the clock only.
"""

from __future__ import annotations

import logging
import threading

from adaptive_lb.core.clock import Clock

__all__ = ["ERROR_STAGES", "ErrorLog"]

ERROR_STAGES = (
    "plan",
    "tracing",
    "tracking",
    "health_refresh",
    "probes",
    "snapshot",
    "config_watch",
)
"""Where an internal error can happen: building a query plan (the child's plan is used),
recording a decision or request span, request tracking, the periodic health refresh (the
last verdicts stay), sending or counting an active probe (that probe is not counted), a
snapshot for a scrape or a metric collection (that collection goes without the policy's
numbers), the config file watcher (the config in force stays)."""

_DEFAULT_INTERVAL_S = 60.0


class ErrorLog:
    """Counts internal errors by stage and logs each stage at most once per interval.

    :meth:`record` is called from an ``except`` block (it logs the exception being
    handled). Counting takes one lock acquisition; the log line, when due, is written
    outside the lock.
    """

    def __init__(
        self,
        clock: Clock,
        logger: logging.Logger,
        interval_s: float = _DEFAULT_INTERVAL_S,
    ) -> None:
        self._clock = clock
        self._log = logger
        self._interval_ns = round(interval_s * 1e9)
        self._lock = threading.Lock()
        self._counts = dict.fromkeys(ERROR_STAGES, 0)
        self._last_logged_ns: dict[str, int] = {}

    def record(self, stage: str, what: str) -> None:
        """Count an error in ``stage`` (one of :data:`ERROR_STAGES`) and log it, with the
        exception being handled and ``what`` was done about it, unless this stage was
        logged less than the interval ago."""
        now = self._clock.now_ns()
        with self._lock:
            count = self._counts.get(stage, 0) + 1
            self._counts[stage] = count
            last = self._last_logged_ns.get(stage)
            if last is not None and now - last < self._interval_ns:
                return
            self._last_logged_ns[stage] = now
        self._log.error(
            "adaptive-lb: internal error in %s; %s (%d in %s so far, logged at most once "
            "every %.0f s)",
            stage,
            what,
            count,
            stage,
            self._interval_ns / 1e9,
            exc_info=True,
        )

    @property
    def total(self) -> int:
        """Every error counted, all stages together."""
        return sum(self._counts.values())

    def counts(self) -> dict[str, int]:
        """Errors by stage (a copy; every stage listed, zeros included)."""
        with self._lock:
            return dict(self._counts)
