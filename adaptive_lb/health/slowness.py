"""Whether a host is slower than its peers, at a stated false-alarm budget (pure logic).

Two tests, each a confidence statement at a given certainty (:meth:`Baseline.gap`): the
host's median against its peers' (:func:`~adaptive_lb.health.evidence.slow_by_evidence`),
and the lower confidence bound of its tail (p99) above a threshold made from its peers'
(the same percentile, x ``outlier_factor``) plus the client's own lateness
(:meth:`Baseline.threshold`). :func:`judge_slowness` asks them at each refresh: a
verdict needs evidence at alpha squared, from the window alone (twice as sure) or at alpha
from the window (a *suspicion*) and again from the answers of the window's intervals
entered since (a disjoint sample: a burst of the client's own lateness is not in both).
:mod:`adaptive_lb.health.rules` turns the answer into states.

Imports the config, the statistics' window type and :mod:`adaptive_lb.health.evidence`.
"""

from __future__ import annotations

from attrs import define

from adaptive_lb.config import HealthConfig
from adaptive_lb.health.evidence import (
    DEFAULT_SPREAD,
    slow_by_evidence,
    tail_percentiles,
    twice_as_sure,
)
from adaptive_lb.stats.host import WindowStats

__all__ = ["Baseline", "Slowness", "judge_slowness", "seconds_text"]

_NS = 1_000_000_000


def seconds_text(seconds: float | None) -> str:
    """``seconds`` as a verdict's reason shows them (``n/a``: unknown)."""
    return "n/a" if seconds is None else f"{seconds:.4f}s"


_s = seconds_text


@define(frozen=True, slots=True)
class Baseline:
    """What a host's window is judged against at a refresh: its peers' numbers (None where
    no peer has the answers; :mod:`adaptive_lb.health.peers`) and the client's own lateness
    (:mod:`adaptive_lb.stats.lateness`)."""

    tail: float | None = None
    """The peers' median latency at ``health.percentile`` (None: the host cannot be SLOW by
    its tail: nothing to be an outlier of)."""
    tail_bound: float | None = None
    """The peers' median upper confidence bound of that percentile."""
    typical: float | None = None
    """The peers' median p50, of hosts with a few answers (the median rule's reference)."""
    spread: float = DEFAULT_SPREAD
    """The cluster's log-spread of latency (:func:`~adaptive_lb.health.evidence.latency_spread`)."""
    lateness_s: float = 0.0
    """The client's largest lateness over the window: added to the tail's threshold."""
    typical_lateness_s: float = 0.0
    """Its median lateness: taken off the host's median by the median rule."""

    def threshold(self, config: HealthConfig) -> float | None:
        """The tail's SLOW threshold: ``outlier_factor`` x the peers' tail, above their upper
        confidence bound, at least ``slow_floor``, plus what the client itself may have
        added to any answer; None without the peers' tail."""
        if self.tail is None:
            return None
        threshold = max(
            config.outlier_factor * self.tail, self.tail_bound or 0.0, config.slow_floor
        )
        return threshold + self.lateness_s

    def gap(
        self,
        sample: WindowStats,
        config: HealthConfig,
        certainty: float,
        tails: bool,
    ) -> str | None:
        """Why ``sample`` shows its host slower than its peers at ``certainty`` (None: it
        does not): its median, or (``tails``) the lower confidence bound of its tail above its
        threshold."""
        why = slow_by_evidence(
            sample,
            self.typical,
            self.spread,
            config,
            self.typical_lateness_s,
            certainty,
            noise_s=self.lateness_s,
        )
        if why is not None or not tails:
            return why
        bounds = tail_percentiles(sample.samples, config, certainty)
        if bounds is None:
            return None
        threshold, at = self.threshold(config), bounds[0]
        value = sample.latency.get(at)
        if value is None or threshold is None or value <= threshold:
            return None
        parts = [
            f"{config.outlier_factor:.1f} x peer median p{config.percentile:g} {_s(self.tail)}"
        ]
        if self.tail_bound is not None:
            parts.append(f"peer bound {_s(self.tail_bound)}")
        parts.append(f"floor {_s(config.slow_floor)}")
        made = f"max({', '.join(parts)}) + client lateness {_s(self.lateness_s)}"
        return f"p{at:.3g} {_s(value)} > {_s(threshold)} = {made}, {sample.samples} samples"


@define(frozen=True, slots=True)
class Slowness:
    """What a refresh concludes about a host's latency against its peers."""

    why: str | None = None
    """Why it is SLOW, at alpha squared (None: it is not)."""
    threshold: float | None = None
    """The tail's threshold (None: no peer tail)."""
    suspect_since_ns: int | None = None
    """Since when it has been suspected at every refresh (None: it is not)."""
    suspect_interval: int | None = None
    """The window's interval when the suspicion began: later intervals are the second
    sample."""
    suspect_ratio: float | None = None
    """Its tail's lower bound over the threshold while suspected (None: not above it): the
    latency factor's floor, the ramp before the verdict."""


def judge_slowness(
    window: WindowStats,
    baseline: Baseline,
    config: HealthConfig,
    now_ns: int,
    suspected: tuple[int | None, int | None] = (None, None),
    recent: WindowStats | None = None,
) -> Slowness:
    """Whether ``window`` shows its host slower than ``baseline`` (see the module
    docstring). ``suspected``: since when (clock ns) and since which interval of the window
    the host has been suspected (None, None: it was not at the last refresh). ``recent``:
    the answers of the window's intervals entered since."""
    latency = window.latency.get(float(config.percentile))
    tails = window.samples >= config.min_samples and latency is not None
    strong_why = baseline.gap(window, config, twice_as_sure(config.certainty), tails)
    weak_why = strong_why or baseline.gap(window, config, config.certainty, tails)
    threshold = baseline.threshold(config)
    if weak_why is None:
        return Slowness(threshold=threshold)
    since, interval = suspected
    if since is None:
        since, interval = now_ns, window.interval
    bounds = tail_percentiles(window.samples, config)
    low = None if bounds is None else window.latency.get(bounds[0])
    ratio = None
    if tails and low is not None and threshold and low > threshold:
        ratio = low / threshold
    why = strong_why
    if why is None and recent is not None and recent.interval == window.interval:
        again = baseline.gap(recent, config, config.certainty, True)
        if again is not None:
            held_s = (now_ns - since) / _NS
            why = f"{weak_why}; again in the {recent.samples} answers of the last {held_s:.1f}s"
    return Slowness(why, threshold, since, interval, ratio)
