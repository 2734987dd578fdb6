"""The latency factor: between health verdicts, the latency each host shows weighs in its
score in proportion to the evidence (pure logic, no driver import).

A peak-EWMA cost that is *exactly 1 for a host not surely slower than its peers*: the
log-gap of the host's median over its peers' gets a confidence interval
(:func:`gap_bounds`), an envelope follows it and decays (:func:`next_excess`), and the
factor is :func:`factor_of` the envelope. docs/design.md ("The latency factor") gives the
formulas and the figures. :mod:`adaptive_lb.health.model` updates a :class:`LatencyRecord`
per host at each refresh.

Imports the config and the lateness discount (:mod:`adaptive_lb.stats.lateness`).
"""

from __future__ import annotations

import math

from attrs import define

from adaptive_lb.config import LatencyFactorConfig
from adaptive_lb.stats.lateness import discounted

__all__ = [
    "MEDIAN_SE",
    "LatencyRecord",
    "factor_of",
    "floored_spread",
    "gap_bounds",
    "next_excess",
]

MEDIAN_SE = math.sqrt(math.pi / 2.0)
"""Standard error of a median of normal samples, in units of the mean's (1.2533)."""
_LN2 = math.log(2.0)
_NS = 1_000_000_000
_MAX_EXCESS = 50.0
"""Bound of the envelope (a log-ratio): ``exp`` never overflows."""


def gap_bounds(
    median_s: float,
    peer_s: float,
    samples: int,
    peer_samples: int,
    spread: float,
    certainty: float,
    jitter_s: float = 0.0,
) -> tuple[float, float, float]:
    """``(g, low, high)``: the log-gap ``ln(median_s / peer_s)`` (medians of ``samples`` and
    of about ``peer_samples`` answers a peer) and its confidence interval at ``certainty``
    standard errors, ``1.2533 * sqrt(s_h ** 2 / samples + s_p ** 2 / peer_samples)``; below
    the gap each spread is floored by ``jitter_s`` (:func:`floored_spread`: client-side
    noise only ever delays an answer), above it both are ``spread``."""
    gap = math.log(median_s / peer_s)
    both = 1.0 / samples + 1.0 / peer_samples
    own = floored_spread(spread, jitter_s, median_s)
    peers = floored_spread(spread, jitter_s, peer_s)
    low = certainty * MEDIAN_SE * math.sqrt(own * own / samples + peers * peers / peer_samples)
    high = certainty * MEDIAN_SE * spread * math.sqrt(both)
    return gap, gap - low, gap + high


def floored_spread(spread: float, jitter_s: float, latency_s: float) -> float:
    """The log-spread of answers taking ``latency_s``: the cluster's ``spread``, or what
    ``jitter_s`` of client-side noise (scheduling, the event loop, a collection) gives
    them, ``ln(1 + jitter_s / latency_s)``, when that is larger. The same noise is a large
    ratio on a fast answer and a small one on a slow answer."""
    if jitter_s <= 0.0 or latency_s <= 0.0:
        return spread
    return max(spread, math.log1p(jitter_s / latency_s))


def next_excess(
    previous: float,
    elapsed_s: float,
    half_life_s: float,
    bounds: tuple[float, float] | None,
) -> float:
    """The envelope ``elapsed_s`` after ``previous``: decayed by ``ln 2`` per
    ``half_life_s`` (no memory with 0), then held within ``bounds`` (``(low, high)`` of
    :func:`gap_bounds`, None without evidence), at least 0."""
    decay = max(0.0, elapsed_s) * _LN2 / half_life_s if half_life_s > 0 else _MAX_EXCESS
    excess = previous - decay
    if bounds is not None:
        low, high = bounds
        excess = min(high, max(low, excess))
    return min(_MAX_EXCESS, max(0.0, excess))


def factor_of(excess: float, config: LatencyFactorConfig) -> float:
    """The score factor of envelope ``excess``: ``exp(excess) / dead_band``, at least 1,
    at most ``cap``."""
    if excess <= 0.0:
        return 1.0
    return min(config.cap, max(1.0, math.exp(excess) / config.dead_band))


@define(eq=False)
class LatencyRecord:
    """One host's latency envelope and what it was made from at the last refresh. Written
    by the health refresh (and reset under the health model's lock); read without a lock by
    the snapshot."""

    excess: float = 0.0
    """The envelope ``e``: the log of the ratio the host is held slower by (>= 0)."""
    factor: float = 1.0
    """The score factor published at the last refresh."""
    ratio: float | None = None
    """The host's median over its peers' at the last refresh (None: no evidence)."""
    low: float | None = None
    """The lower confidence bound of that ratio (None: no evidence)."""
    updated_ns: int | None = None
    """When the envelope was last updated (clock ns)."""

    def update(
        self,
        now_ns: int,
        median_s: float | None,
        peer_s: float | None,
        samples: int,
        peer_samples: int,
        spread: float,
        config: LatencyFactorConfig,
        held: bool = False,
        suspect_ratio: float | None = None,
        lateness_s: float = 0.0,
    ) -> float:
        """Fold the host's window at ``now_ns`` into the envelope (:func:`gap_bounds` of its
        arguments); the new factor. ``held``: its probes say it is still clearly slow: no
        decay meanwhile. ``suspect_ratio``: while it is suspected, the factor's floor (the
        ramp before the verdict). ``lateness_s``: the client's own lateness, taken off the
        host's median, and the jitter floor when larger."""
        bounds: tuple[float, float] | None = None
        if median_s and peer_s and median_s > 0 and peer_s > 0 and samples > 0 < peer_samples:
            jitter = max(config.jitter, lateness_s)
            median_s = discounted(median_s, lateness_s, peer_s)
            gap, low, high = gap_bounds(
                median_s, peer_s, samples, peer_samples, spread, config.certainty, jitter
            )
            bounds = (low, high)
            self.ratio, self.low = math.exp(gap), math.exp(low)
        else:
            self.ratio = self.low = None
        previous = self.updated_ns
        elapsed_s = 0.0 if previous is None or held else (now_ns - previous) / _NS
        self.excess = next_excess(self.excess, elapsed_s, config.half_life, bounds)
        if suspect_ratio is not None and suspect_ratio > 1.0:
            self.excess = max(self.excess, math.log(suspect_ratio * config.dead_band))
        self.updated_ns = now_ns
        self.factor = factor_of(self.excess, config)
        return self.factor

    def reset(self) -> None:
        """Forget the envelope (the host left ERRORING, or came back up)."""
        self.excess = 0.0
        self.factor = 1.0
