"""A host's active probes: what was sent, how each ended, when (no driver import).

One :class:`ProbeRecord` per host, on its :class:`~adaptive_lb.stats.host.HostStats`
(``stats.probes``). The sender (:mod:`adaptive_lb.runtime.prober`) writes it from the driver's
threads, the health refresh and the exporters read it. Probes are counted here and only
here: they never enter the host's in-flight count, outcome totals or latency window, which
are the user's requests.

Imports nothing from adaptive-lb (the statistics layer imports it).
"""

from __future__ import annotations

import threading
from collections import deque

__all__ = ["OUTCOMES", "RTT_SAMPLES", "ProbeRecord"]

ANSWERED = "answered"
"""The host answered the probe (a result, or a refusal for the client's own reasons)."""
FAILED = "failed"
"""It answered with an error (overloaded, server error...) or the connection broke."""
TIMEOUT = "timeout"
"""No answer within ``health.probe_timeout``."""
UNSENT = "unsent"
"""The driver had no connection to send it on (host down or pool busy)."""
OUTCOMES = (ANSWERED, FAILED, TIMEOUT, UNSENT)
"""How a probe ends, as counted and exported."""
RTT_SAMPLES = 8
"""Round trips of answered probes kept per host (the last ones): what
:mod:`adaptive_lb.health.peers` compares with the host's peers'."""


class ProbeRecord:
    """One host's probes. Counters only grow; ``outstanding`` is at most one probe.

    Read without a lock (plain attributes); written under the record's lock."""

    __slots__ = (
        "_lock",
        "answered",
        "failed",
        "failures_cleared",
        "held_answers",
        "held_caught",
        "held_ns",
        "held_reason",
        "last_answer_ns",
        "last_failure_ns",
        "last_latency_s",
        "last_outcome",
        "last_sent_ns",
        "next_ns",
        "outstanding",
        "reason",
        "rtts",
        "sent",
        "timed_out",
        "unsent",
        "user_answer_ns",
        "user_answers",
    )

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.sent = 0
        """Probes sent."""
        self.answered = 0
        self.failed = 0
        self.timed_out = 0
        self.unsent = 0
        self.outstanding = False
        """A probe is on its way (at most one per host)."""
        self.last_sent_ns: int | None = None
        self.last_answer_ns: int | None = None
        """When a probe last answered (clock ns)."""
        self.last_failure_ns: int | None = None
        """When a probe last failed or timed out (clock ns)."""
        self.last_outcome: str | None = None
        """How the last probe ended (one of :data:`OUTCOMES`)."""
        self.last_latency_s: float | None = None
        """How long the last answered probe took, seconds."""
        self.rtts: deque[tuple[int, float]] = deque(maxlen=RTT_SAMPLES)
        """The last answered probes: (when it answered, clock ns; its round trip, s)."""
        self.reason = ""
        """Why the last probe was sent."""
        self.next_ns = 0
        """No probe before this (clock ns): the interval, jittered."""
        self.failures_cleared = 0
        """The host's user failure count that a probe answer has cleared: more failures
        than this make it *suspected* (see :mod:`adaptive_lb.health.probes`)."""
        self.user_answers = 0
        """The host's user answer count at the last scheduling pass, and when it last
        changed (``user_answer_ns``): how fresh its user evidence is."""
        self.user_answer_ns: int | None = None
        self.held_ns: int | None = None
        """Since when a probe due for ``held_reason`` has waited, at every refresh, for a
        slot of the fleet's budget (:mod:`adaptive_lb.stats.fleet`); None: none waits. The
        health model judges the host by what that probe would have shown
        (:func:`adaptive_lb.health.probes.judge`)."""
        self.held_reason = ""
        self.held_answers = 0
        """The host's user answer count when the probe began to wait."""
        self.held_caught = False
        """The host had requests in flight at some refresh while the probe waited."""

    def hold(self, now_ns: int, reason: str, in_flight: int) -> None:
        """A probe due for ``reason`` waits for a slot of the fleet's budget this refresh,
        with ``in_flight`` requests on the host (a new reason starts a new wait)."""
        with self._lock:
            if self.held_ns is None or self.held_reason != reason:
                self.held_ns, self.held_reason = now_ns, reason
                self.held_answers, self.held_caught = self.user_answers, False
            self.held_caught = self.held_caught or in_flight > 0

    def release(self) -> None:
        """No probe of the host waits for a slot (sent, or no longer due)."""
        if self.held_ns is not None:
            with self._lock:
                self.held_ns = None

    def begin(self, now_ns: int, next_ns: int, reason: str) -> bool:
        """Claim the host for one probe sent now; False if one is outstanding."""
        with self._lock:
            if self.outstanding:
                return False
            self.outstanding = True
            self.sent += 1
            self.last_sent_ns = now_ns
            self.next_ns = next_ns
            self.reason = reason
            return True

    def end(self, outcome: str, now_ns: int, failures_at_send: int = 0) -> None:
        """The outstanding probe ended with ``outcome`` at ``now_ns``."""
        with self._lock:
            if not self.outstanding:
                return
            self.outstanding = False
            self.last_outcome = outcome
            if outcome == ANSWERED:
                self.answered += 1
                sent = self.last_sent_ns if self.last_sent_ns is not None else now_ns
                self.last_latency_s = max(0, now_ns - sent) / 1e9
                self.rtts.append((now_ns, self.last_latency_s))
                self.last_answer_ns = now_ns
                self.failures_cleared = max(self.failures_cleared, failures_at_send)
            elif outcome == UNSENT:
                self.unsent += 1
            else:
                if outcome == TIMEOUT:
                    self.timed_out += 1
                else:
                    self.failed += 1
                self.last_failure_ns = now_ns

    def recent_rtts(self, since_ns: int) -> list[float]:
        """Round trips (s) of the kept answered probes that answered from ``since_ns`` on."""
        with self._lock:
            kept = tuple(self.rtts)
        return [rtt for at_ns, rtt in kept if at_ns >= since_ns]

    def counts(self) -> dict[str, int]:
        """Probes ended, by outcome (:data:`OUTCOMES`)."""
        return {
            ANSWERED: self.answered,
            FAILED: self.failed,
            TIMEOUT: self.timed_out,
            UNSENT: self.unsent,
        }
