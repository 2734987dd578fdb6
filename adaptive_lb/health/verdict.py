"""A host's health verdict (:class:`HostHealth`: its state, penalty and the numbers behind
them) and the warm-up ramp of a host coming back (:func:`warming_penalty`).

The verdict is what the rules of :mod:`adaptive_lb.health.rules` produce from the previous
one, what :class:`adaptive_lb.health.model.HealthModel` keeps per host and what snapshots,
traces and logs show. Pure logic: no state, no threads, no clock, no driver.

May import: the config model, :mod:`adaptive_lb.stats.health_state` and
:mod:`adaptive_lb.health.way_back` (the evidence and probe a verdict carries); attrs.
"""

from __future__ import annotations

from attrs import define, field

from adaptive_lb.config import HealthConfig
from adaptive_lb.health.way_back import Evidence, Probe
from adaptive_lb.stats.health_state import HealthState

__all__ = ["HostHealth", "warming_penalty"]


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
    """Why a SLOW / ERRORING host is penalised, which decides its way back: ``slow``
    (latency outlier), ``errors`` (error rate) or ``stall`` (no answer with requests in
    flight); empty for HEALTHY and WARMING."""
    evidence: Evidence = field(factory=Evidence)
    """Its answers and failures since the verdict, returns and relapses
    (:mod:`adaptive_lb.health.way_back`)."""
    probe: Probe | None = None
    """The probe of this ERRORING host in progress (None: none); see
    :mod:`adaptive_lb.health.way_back`."""
    warm_up_s: float | None = None
    """How long this WARMING host's warm-up lasts (None: ``slow_start``; shorter after a
    stall, see :func:`~adaptive_lb.health.way_back.warm_up_s`)."""
    suspect_since_ns: int | None = None
    """Since when the lower confidence bound of its tail has been above the SLOW threshold
    at every refresh (None: it is not): a tail-only verdict needs the same of the answers
    that came after (:mod:`adaptive_lb.health.rules`)."""
    suspect_interval: int | None = None
    """The window's interval (:attr:`~adaptive_lb.stats.host.WindowStats.interval`) when the
    suspicion began: the answers of later intervals are the second, disjoint sample."""
    suspect_ratio: float | None = None
    """That bound over the threshold at this refresh (None: not above it): the latency
    factor's floor while the suspicion lasts (:mod:`adaptive_lb.stats.latency_factor`)."""

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
