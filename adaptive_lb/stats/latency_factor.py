"""The latency factor: between health verdicts, the latency each host shows weighs in its
score in proportion to the evidence (pure logic, no driver import).

A health verdict (SLOW) waits until the evidence is beyond doubt and then costs the host
64 x; before that, and for hosts slower than their peers by less than
``health.outlier_factor``, nothing in the score said that a host answers slowly. Under load
the in-flight term says it (a slow host holds more requests), but a thin client has nothing
in flight anywhere: every host scores 1 and gets a third of the requests. Finagle's and
Linkerd's *peak-EWMA* cost fills that gap: a slow answer raises a host's cost at once, and
the cost decays with time (a 10 s time constant) so that the host is tried again. Used as is
here, a latency estimate per host would send a thin client's every request to whichever
host answered fastest last (with nothing in flight, the lowest factor always wins:
Finagle's power of two choices randomises, this policy's ordering does not), so the factor
is built to be *exactly 1 for hosts that are not surely slower than their peers*:

* **The gap, with its uncertainty.** At each health refresh, a host's median latency over
  its window ``m`` (``n`` answers) against its peers' median of medians ``p`` (the true
  peers of :mod:`adaptive_lb.health.peers`, hosts with a few answers: the reference the
  evidence rules of :mod:`adaptive_lb.health.evidence` use). Latencies are roughly log-normal with
  the cluster's log-spread ``s``; the median of ``n`` answers has a standard error of
  about ``1.2533 * s / sqrt(n)`` in log space, and the peers' reference, from about ``n_p``
  answers a host (the median count of the group's hosts with a few), one of
  ``1.2533 * s / sqrt(n_p)``, so the log-gap ``g = ln(m / p)`` lies, with
  ``health.latency_factor.certainty`` (``c``, 2) standard errors of confidence, in::

      [low, high] = g -/+ c * 1.2533 * s * sqrt(1 / n + 1 / n_p)      (:func:`gap_bounds`)

  (``low`` with the jitter floor below).
* **A floor for the client's own jitter.** An answer's latency as the client measures it
  includes the client's delay in handling it: its other threads and the GIL, the
  scheduler, a collection, the driver's event loop -- a few hundred microseconds to about
  a millisecond on a busy Python client, the same for every host. On answers of a
  millisecond or two that is a large ratio, and it comes in bursts that the cluster's
  ``s`` (measured from p95 / p50 over windows of a few answers) does not show: against
  Simulacron (hosts answering in ~1-2 ms) one late answer among a few lifted an equal
  host's median 1.7 x over its peers' while ``s`` read 0.21. So below the gap each side's
  spread is at least ``ln(1 + jitter / latency)`` at that side's median
  (``health.latency_factor.jitter``, ``J``, 1 ms; :func:`floored_spread`)::

      low = g - c * 1.2533 * sqrt(s_h ** 2 / n + s_p ** 2 / n_p)
      s_h = max(s, ln(1 + J / m)),  s_p = max(s, ln(1 + J / p))

  1 ms is ln 2 on 1 ms answers, 0.18 on 5 ms ones: it weighs where the jitter can fake a
  gap and fades where latencies are large (the real Cassandra of the tests, 2.5-5 ms with
  ``s`` 0.4-0.7, is all but untouched). The upper bound keeps ``s`` alone: the jitter only
  ever delays an answer, so it can make a host look slower, never faster. Relative noise
  has its floor in ``s`` itself (at least 0.2, :data:`adaptive_lb.health.evidence.MIN_SPREAD`).
* **Peak-sensitive, decaying with time** (the envelope ``e``, a log-ratio, kept per host)::

      e(t) = max(0, min(high, max(low, e(t - dt) - dt * ln 2 / half_life)))

  Evidence that the host is surely slower (``low``) raises ``e`` at once; evidence that it
  is surely not that slow (``high``, e.g. fresh fast answers) lowers it at once; without
  either (no answer in the window: a host the factor keeps away gets none) ``e`` decays
  linearly, i.e. the ratio it stands for halves every ``half_life`` seconds, like
  Finagle's cost (``exp(-dt / tau)``, tau = half_life / ln 2) -- so the host is tried
  again, later the slower it was.
* **Factor**: ``min(cap, max(1, exp(e) / dead_band))``: the ratio the host is surely slower
  by, beyond a dead band, bounded (:func:`factor_of`). It multiplies ``in_flight + 1``:
  under load a host twice as slow gets about half the in-flight of its peers, not none.

Why equal hosts keep an even share: a host's factor leaves 1 only when its median is above
its peers' by ``c`` standard errors *and* by ``dead_band`` (1.25). A thin client's window
holds ~30 answers per host: the median of a host no slower than its peers would have to be
1.25 x theirs plus 2 standard errors, about 5 of its own standard errors off, which does not
happen; a single answer (a host back after being avoided) must be
``exp(c * 1.2533 * s) * dead_band`` (2.7 x at ``s`` = 0.3) above the peers' median. Hosts
no slower than their peers all score the same, and ties are broken at random. Only a
slower host is ever penalised, never a faster one favoured.

After a stall or errors (leaving ERRORING) and when a host comes back up, ``e`` starts from
0: the latency of requests caught in a stall or a restart is not the host's service time,
and the health model and the probes judge those.

Imports the config and the lateness discount (:mod:`adaptive_lb.stats.lateness`);
:mod:`adaptive_lb.health.model` calls :meth:`LatencyRecord.update` at
each refresh and publishes the factor on the host's statistics, which the score reads.
"""

from __future__ import annotations

import math

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
    """``(g, low, high)``: the log-gap ``ln(median / peer)`` of a host whose median over
    ``samples`` answers is ``median_s`` against its peers' ``peer_s`` (from about
    ``peer_samples`` answers a host), and its confidence interval at ``certainty``
    standard errors of the difference of the two medians,
    ``1.2533 * sqrt(s_h ** 2 / samples + s_p ** 2 / peer_samples)``. Below the gap each
    side's spread is floored by ``jitter_s`` (:func:`floored_spread`; client-side noise
    only ever delays an answer, so it can make a host look slower, never faster); above
    it, ``s_h = s_p = spread``."""
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


class LatencyRecord:
    """One host's latency envelope and what it was made from at the last refresh. Written
    by the health refresh (and reset under the health model's lock); read without a lock by
    the snapshot."""

    __slots__ = ("excess", "factor", "high", "low", "ratio", "updated_ns")

    def __init__(self) -> None:
        self.excess = 0.0
        """The envelope ``e``: the log of the ratio the host is held slower by (>= 0)."""
        self.factor = 1.0
        """The score factor published at the last refresh."""
        self.ratio: float | None = None
        """The host's median over its peers' at the last refresh (None: no evidence)."""
        self.low: float | None = None
        """The lower confidence bound of that ratio (None: no evidence)."""
        self.high: float | None = None
        """Its upper confidence bound (None: no evidence)."""
        self.updated_ns: int | None = None
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
        """Fold the host's window at ``now_ns`` (its median ``median_s`` over ``samples``
        answers, against its peers' ``peer_s`` from about ``peer_samples`` answers a host)
        into the envelope; the new factor. ``held``: its probes say it is still clearly
        slow (:mod:`adaptive_lb.health.probe_latency`): the envelope does not decay meanwhile.
        ``suspect_ratio``: how far its tail's lower confidence bound is above the SLOW
        threshold while that has not persisted long enough for a verdict
        (:mod:`adaptive_lb.health.rules`): the factor is at least that ratio meanwhile, the
        ramp before the verdict. ``lateness_s``: the client's own lateness over the window
        (:mod:`adaptive_lb.stats.lateness`): taken off the host's median, and the jitter floor
        when it is larger."""
        bounds: tuple[float, float] | None = None
        if median_s and peer_s and median_s > 0 and peer_s > 0 and samples > 0 < peer_samples:
            jitter = max(config.jitter, lateness_s)
            median_s = discounted(median_s, lateness_s, peer_s)
            gap, low, high = gap_bounds(
                median_s, peer_s, samples, peer_samples, spread, config.certainty, jitter
            )
            bounds = (low, high)
            self.ratio, self.low, self.high = math.exp(gap), math.exp(low), math.exp(high)
        else:
            self.ratio = self.low = self.high = None
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
