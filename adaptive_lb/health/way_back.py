"""The way back for a penalised host: fresh evidence, hold time and relapses (pure logic).

A SLOW or ERRORING host's statistics window still holds the bad period long after it ended
(a GC-paused node's window holds the timeouts of the pause for a whole window). Judging its
return on that window alone keeps a recovered host out for up to ``tracking.window``. So the
health rules (:func:`adaptive_lb.health.rules.assess`) also look at what the host did *since
its verdict*, from its monotonic answer and failure counters, read at each refresh (no cost
on the request path):

* The *clean streak*: answers since the last failure (error or
  timeout) and since the verdict. A stalled host that answers again, or an erroring host
  that answers :data:`CLEAN_STREAK` times in a row, comes back (WARMING) at the next refresh.
* **Hold**: a penalised host stays penalised at least :func:`hold_s` --
  ``min_state_duration``, doubled for each *relapse*, at most the statistics window.
* **Probe**: an ERRORING host gets almost no traffic, so no evidence either. After the
  hold (and once nothing caught in a stall is in flight on it any more) it is *probed*:
  it stays ERRORING, but the next :func:`probe_requests` requests sent to it are placed as
  if it were healthy (the budget is spent in :meth:`~adaptive_lb.stats.host.HostStats.on_send`
  and ends at the first failure). The probe succeeds with its streak (WARMING); it fails
  at the first failure, or when it stalls: the next probe waits :func:`probe_wait_s`. One
  request at a time on a stalled host, not a warming ramp's worth: each request sent to a
  stalled host hangs until the client's timeout.
* **Relapse**: turning SLOW / ERRORING again within :data:`RELAPSE_WINDOWS` windows of the
  last return *after having answered since it* (a flapping host). A failed probe is not a
  relapse: the host never answered well. A bad verdict long after the last return starts
  the count again.

No state, no clock, no driver: :class:`Evidence` is an immutable value carried on each
:class:`~adaptive_lb.health.verdict.HostHealth`.

Imports attrs only.
"""

from __future__ import annotations

from attrs import define, evolve

__all__ = [
    "CLEAN_STREAK",
    "MAX_RELAPSES",
    "RELAPSE_WINDOWS",
    "Evidence",
    "Probe",
    "hold_s",
    "probe_requests",
    "probe_wait_s",
    "warm_up_s",
]

CLEAN_STREAK = 10
"""Answers in a row, none failed, that prove an ERRORING host's errors stopped. A host
still failing at the default ``error_rate`` (25 %) shows a failure within 10 answers with
94 % probability (1 - 0.75^10); a wrong return is a relapse, and relapses are held longer."""
RELAPSE_WINDOWS = 2
"""A bad verdict within this many statistics windows of the last return is a relapse (if
the host answered since): a return lasts ``slow_start`` (WARMING) plus a window."""
MAX_RELAPSES = 16
"""Relapses counted at most (the hold is capped long before)."""
PROBE_BACKOFF = 2.0
"""After a failed probe the next one waits this many holds (at most the window). Each failed
probe of a stalled host costs one request that waits for the client timeout; but between
probes nothing is in flight on the host to notice the stall's end, so the wait is also how
late it may come back. Measured on the gc-pause scenario with pauses of 18-21.5 s (seed 1):
back to half its fair share within 0.7-2.7 s of the pause's end, 0.05-0.06 % of requests
affected; with 1 (no backoff) 0.7-1.7 s and 0.06-0.07 %; the old warming probe 0.5-3.5 s."""


def hold_s(min_state_duration: float, relapses: int, window_s: float) -> float:
    """How long a SLOW / ERRORING host stays so at least before any way back:
    ``min_state_duration`` x 2^``relapses``, at most ``window_s`` (never less than
    ``min_state_duration``)."""
    if relapses <= 0 or min_state_duration <= 0:
        return min_state_duration
    doubled = min_state_duration * 2.0 ** min(relapses, MAX_RELAPSES)
    return min(doubled, max(min_state_duration, window_s))


def probe_wait_s(
    min_state_duration: float, relapses: int, failed_probes: int, window_s: float
) -> float:
    """How long an ERRORING host waits before the next probe: its :func:`hold_s`, times
    :data:`PROBE_BACKOFF` once a probe has failed (at most the statistics window, never less
    than the hold)."""
    hold = hold_s(min_state_duration, relapses, window_s)
    if failed_probes <= 0:
        return hold
    return max(hold, min(hold * PROBE_BACKOFF, window_s))


def probe_requests(cause: str) -> int:
    """Requests a probe may send to an ERRORING host: one for a stall (one answer ends it,
    and each request caught in a stall hangs), :data:`CLEAN_STREAK` for errors (as many
    answers prove them stopped; a failure ends the probe at once)."""
    return 1 if cause == "stall" else CLEAN_STREAK


def warm_up_s(slow_start: float, min_state_duration: float) -> float:
    """How long a host back from a *stall* warms up: ``min_state_duration`` (at most
    ``slow_start``). A stalled node (a GC pause, SIGSTOP) was serving at full speed until it
    stopped: its caches and JIT are warm, unlike a restarted one's, which is what
    ``slow_start`` protects. Its answers after the stall are the evidence it is back; a
    relapse is held longer (:func:`hold_s`)."""
    return min(slow_start, min_state_duration)


@define(frozen=True, slots=True)
class Probe:
    """A probe of an ERRORING host in progress (see the module docstring)."""

    requests: int
    """Requests it may send to the host."""
    failures_at_start: int
    """The host's failure count when it started: any failure since fails it."""


@define(frozen=True, slots=True)
class Evidence:
    """A host's answers and failures as of the last refresh, and its returns.

    ``answers`` and ``failures`` below are the host's monotonic totals (successes; errors
    + timeouts) since its statistics were created."""

    clean_from: int = 0
    """The answer count at which the current clean streak started (the last failure, or
    the last SLOW / ERRORING verdict)."""
    failures_seen: int = 0
    """The failure count at the last refresh."""
    returned_ns: int | None = None
    """When the host last came back from SLOW / ERRORING (None: never)."""
    answers_at_return: int = 0
    """The answer count when it came back."""
    relapses: int = 0
    """Relapses in a row (see the module docstring)."""
    failed_probes: int = 0
    """Probes failed since the verdict (0 again when the host comes back)."""
    probe_failed_ns: int | None = None
    """When the last probe failed (None: none since the verdict)."""

    def observe(self, answers: int, failures: int) -> tuple[Evidence, int]:
        """This refresh's evidence and the clean streak: answers since the last failure
        (and since the verdict). Any failure since the last refresh ends the streak."""
        clean_from = self.clean_from
        if failures != self.failures_seen or answers < clean_from:
            clean_from = answers
        evidence = self
        if clean_from != self.clean_from or failures != self.failures_seen:
            evidence = evolve(self, clean_from=clean_from, failures_seen=failures)
        return evidence, answers - clean_from

    def turned_bad(self, now_ns: int, answers: int, window_s: float) -> Evidence:
        """A HEALTHY or WARMING host turned SLOW / ERRORING now: the streak restarts and
        the relapse count goes up (a relapse), stays (a failed probe, or a return long
        ago that is still recent) or restarts at 0."""
        recent = (
            self.returned_ns is not None
            and now_ns - self.returned_ns < RELAPSE_WINDOWS * window_s * 1e9
        )
        if recent and answers > self.answers_at_return:
            relapses = min(self.relapses + 1, MAX_RELAPSES)
        elif recent:
            relapses = self.relapses
        else:
            relapses = 0
        return evolve(
            self, clean_from=answers, relapses=relapses, failed_probes=0, probe_failed_ns=None
        )

    def restarted(self, answers: int) -> Evidence:
        """A penalised host changed bad state (e.g. SLOW -> ERRORING): only answers from
        now on count."""
        return evolve(self, clean_from=answers)

    def probe_failed(self, answers: int, now_ns: int) -> Evidence:
        """A probe failed now: the streak restarts, the next probe waits longer."""
        return evolve(
            self,
            clean_from=answers,
            failed_probes=self.failed_probes + 1,
            probe_failed_ns=now_ns,
        )

    def came_back(self, now_ns: int, answers: int) -> Evidence:
        """The host left SLOW / ERRORING now."""
        return evolve(
            self,
            returned_ns=now_ns,
            answers_at_return=answers,
            failed_probes=0,
            probe_failed_ns=None,
        )
