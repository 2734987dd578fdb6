"""A host's health verdict and its way back (pure logic: no state, no clock, no driver).

:class:`HostHealth` is what :mod:`adaptive_lb.health.rules` produces from the previous one
and what snapshots, traces and logs show. A SLOW or ERRORING host's window still holds the
bad period, so its way back reads what it did *since its verdict* (:class:`Evidence`): a
clean streak, a :func:`hold_s`, a :class:`Probe`, relapses and the warm-up of
:func:`warming_penalty`. docs/design.md ("Health": quick to protect, quick to forgive)
gives the figures.

Imports attrs, the config model and :mod:`adaptive_lb.stats.health_state`.
"""

from __future__ import annotations

from attrs import define, evolve, field

from adaptive_lb.config import HealthConfig
from adaptive_lb.stats.health_state import HealthState

__all__ = [
    "CLEAN_STREAK",
    "MAX_RELAPSES",
    "RELAPSE_WINDOWS",
    "Evidence",
    "HostHealth",
    "Probe",
    "Slowness",
    "hold_s",
    "probe_requests",
    "warm_up_s",
    "warming_penalty",
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
"""After a failed probe the next one waits this many holds (at most the window): each costs a
stalled host's client a timeout, but the wait is also how late it may come back (gc-pause,
seed 1: back to half its share 0.7-2.7 s after the pause; 0.7-1.7 s without backoff)."""


def hold_s(
    min_state_duration: float, relapses: int, window_s: float, failed_probes: int = 0
) -> float:
    """How long a SLOW / ERRORING host stays so at least before any way back:
    ``min_state_duration`` x 2^``relapses``, at most ``window_s`` (never less than
    ``min_state_duration``); once a probe has failed, how long the next probe waits: that
    times :data:`PROBE_BACKOFF`, at most ``window_s`` (never less than the hold)."""
    hold = min_state_duration
    if relapses > 0 and min_state_duration > 0:
        doubled = min_state_duration * 2.0 ** min(relapses, MAX_RELAPSES)
        hold = min(doubled, max(min_state_duration, window_s))
    if failed_probes > 0:
        hold = max(hold, min(hold * PROBE_BACKOFF, window_s))
    return hold


def probe_requests(cause: str) -> int:
    """Requests a probe may send to an ERRORING host: one for a stall (one answer ends it,
    and each request caught in a stall hangs), :data:`CLEAN_STREAK` for errors (as many
    answers prove them stopped; a failure ends the probe at once)."""
    return 1 if cause == "stall" else CLEAN_STREAK


def warm_up_s(slow_start: float, min_state_duration: float) -> float:
    """How long a host back from a *stall* warms up: ``min_state_duration`` (at most
    ``slow_start``): a node stalled by a GC pause or SIGSTOP was serving at full speed until
    it stopped, nothing in it is cold, unlike a restarted one."""
    return min(slow_start, min_state_duration)


@define(frozen=True, slots=True)
class Probe:
    """A probe of an ERRORING host in progress: its requests are placed as a healthy
    host's until they are spent or one fails."""

    requests: int
    """Requests it may send to the host."""
    failures_at_start: int
    """The host's failure count when it started: any failure since fails it."""


@define(frozen=True, slots=True)
class Evidence:
    """A host's answers and failures as of the last refresh (its monotonic totals of
    successes and of errors + timeouts), and its returns."""

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
    """Relapses in a row."""
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


@define(frozen=True, slots=True)
class Slowness:
    """What a refresh concludes about a host's latency against its peers
    (:func:`~adaptive_lb.health.evidence.judge_slowness`)."""

    why: str | None = None
    """Why it is SLOW, at alpha squared (None: it is not)."""
    suspect_since_ns: int | None = None
    """Since when it has been suspected at every refresh (None: it is not)."""
    suspect_interval: int | None = None
    """The window's interval when the suspicion began: later intervals are the second
    sample."""
    suspect_ratio: float | None = None
    """Its tail's lower bound over the threshold while suspected (None: not above it): the
    latency factor's floor, the ramp before the verdict."""


@define(frozen=True, slots=True)
class HostHealth:
    """A host's health verdict and the numbers behind it."""

    state: HealthState
    since_ns: int
    """When the host entered ``state`` (clock nanoseconds)."""
    penalty: float
    """Score multiplier the policy applies to the host."""
    reason: str = ""
    """Why the host is in ``state``, with the numbers, for logs, traces and snapshots."""
    latency: float | None = None
    """Seconds at the configured percentile over the window (None: no sample)."""
    peer_median: float | None = None
    """Median of the peers' latency at the same percentile, seconds (None: no peer data)."""
    error_rate: float = 0.0
    """(errors + timeouts) / requests over the window."""
    samples: int = 0
    """Latency samples in the window."""
    requests: int = 0
    """Requests with an outcome in the window."""
    cause: str = ""
    """Why a SLOW / ERRORING host is penalised, which decides its way back: ``slow``,
    ``errors`` or ``stall``; empty for HEALTHY and WARMING."""
    evidence: Evidence = field(factory=Evidence)
    """Its answers and failures since the verdict, returns and relapses."""
    probe: Probe | None = None
    """The probe of this ERRORING host in progress (None: none)."""
    warm_up_s: float | None = None
    """How long this WARMING host's warm-up lasts (None: ``slow_start``; :func:`warm_up_s`
    after a stall)."""
    slowness: Slowness = field(factory=Slowness)
    """What the last refresh concluded about its latency, its suspicion too."""

    @classmethod
    def initial(cls, now_ns: int, config: HealthConfig) -> HostHealth:
        """The verdict for a host nothing is known about yet: HEALTHY."""
        return cls(HealthState.HEALTHY, now_ns, config.penalties.healthy, "no evidence yet")

    @classmethod
    def warming(
        cls, now_ns: int, config: HealthConfig, reason: str, warm_up_s: float | None = None
    ) -> HostHealth:
        """A host that has just come back: WARMING from ``now_ns`` for ``warm_up_s``
        (default ``slow_start``; HEALTHY at once if that is 0)."""
        if (config.slow_start if warm_up_s is None else warm_up_s) <= 0:
            return cls(HealthState.HEALTHY, now_ns, config.penalties.healthy, reason)
        penalty = config.penalties.warming
        return cls(HealthState.WARMING, now_ns, penalty, reason, warm_up_s=warm_up_s)


def warming_penalty(start: float, elapsed_s: float, slow_start: float, end: float = 1.0) -> float:
    """Penalty of a WARMING host ``elapsed_s`` after it came back: its traffic weight
    1 / penalty grows linearly from 1 / ``start`` to 1 / ``end`` over ``slow_start``
    seconds. Monotone non-increasing in ``elapsed_s``, exactly ``end`` from ``slow_start``
    on (and at once when ``start <= end``)."""
    if slow_start <= 0 or elapsed_s >= slow_start or start <= end:
        return end
    progress = max(0.0, elapsed_s) / slow_start
    weight = 1.0 / start + (1.0 / end - 1.0 / start) * progress
    return min(start, max(end, 1.0 / weight))  # 1 / (1 / start) may round above start
