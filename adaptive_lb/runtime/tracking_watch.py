"""Is request tracking reaching a policy? :class:`TrackingWatch` knows, counts the plans made
while it is not, and warns once.

A policy planning with no request tracking sees every host idle (0 in flight) and unmeasured
(no latency, no errors): its plan is a random choice among the replicas, at extra cost. The
usual cause is a missing ``adaptive_lb.attach(session)``. Driver-free: the policy (and the
simulator, which feeds the statistics itself) declares the tracking it has.

Imports the clock and the counters only.
"""

from __future__ import annotations

import logging
import threading

from adaptive_lb.core.clock import Clock
from adaptive_lb.core.counting import counter_value, new_counter

__all__ = ["UNTRACKED_PLANS_BEFORE_WARNING", "UNTRACKED_SECONDS_BEFORE_WARNING", "TrackingWatch"]

UNTRACKED_PLANS_BEFORE_WARNING = 1000
"""Plans made with no request tracking attached after which one WARNING is logged..."""
UNTRACKED_SECONDS_BEFORE_WARNING = 30.0
"""...or seconds since the first such plan, whichever comes first (then never again)."""


class TrackingWatch:
    """Whether something feeds a policy's statistics per attempt, and the plans made while
    nothing does. The policy reads :attr:`sources` on its hot path (0: call
    :meth:`note_plan`)."""

    def __init__(self, clock: Clock, log: logging.Logger) -> None:
        self._clock = clock
        self._log = log
        self._lock = threading.Lock()
        self.sources = 0
        """Trackers attached (request trackers of sessions, or the simulator's feedback)."""
        self._plans = new_counter()
        self._first_ns: int | None = None
        self._warned = False

    @property
    def attached(self) -> bool:
        """At least one tracker is attached."""
        return self.sources > 0

    @property
    def untracked_plans(self) -> int:
        """Plans made while no tracker was attached."""
        return counter_value(self._plans)

    def attach(self, attached: bool = True) -> None:
        """One tracker more (``attached``) or fewer."""
        with self._lock:
            self.sources = max(0, self.sources + (1 if attached else -1))

    def detach_all(self) -> None:
        """No tracker any more (a forked child: they all stayed in the parent, and so may
        the lock)."""
        self._lock = threading.Lock()
        self.sources = 0

    def note_plan(self) -> None:
        """A plan was made with no tracker attached: count it, and warn once after
        :data:`UNTRACKED_PLANS_BEFORE_WARNING` plans or
        :data:`UNTRACKED_SECONDS_BEFORE_WARNING` seconds."""
        count = next(self._plans) + 1
        if self._warned:
            return
        now = self._clock.now_ns()
        first = self._first_ns
        if first is None:
            self._first_ns = first = now
        if (
            count < UNTRACKED_PLANS_BEFORE_WARNING
            and now - first < UNTRACKED_SECONDS_BEFORE_WARNING * 1e9
        ):
            return
        self._warned = True
        self._log.warning(
            "adaptive-lb: %d query plans made but no request tracking reaches this policy, "
            "so every host looks idle and unmeasured: call adaptive_lb.attach(session) "
            "(or adaptive_lb.instrument(session)) once after cluster.connect()",
            count,
        )
