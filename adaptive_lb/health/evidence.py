"""Judgement proportional to the evidence: the statistics every verdict rests on, and
whether a host is slower than its peers at a stated false-alarm budget (pure logic).

* **A median's gap** (:func:`slow_by_evidence`): latencies are about log-normal with the
  cluster's log-spread (:func:`latency_spread`); the answers a gap needs are
  :func:`samples_needed`, never fewer than :data:`MIN_EVIDENCE`.
* **A quantile's interval** (:func:`tail_ranks`, :func:`tail_percentiles`): distribution-free,
  from the order statistics of ``n`` answers, at a false-alarm probability ``alpha``
  (:func:`false_alarm`; :func:`twice_as_sure`: at ``alpha ** 2``).
* **An error rate's lower bound** (:func:`error_rate_lower_bound`, Wilson's score interval).
* **Slowness** (:func:`judge_slowness`): the median test and the tail test of
  :meth:`Baseline.gap`; a verdict needs evidence at alpha squared from the window alone, or
  at alpha from the window (a *suspicion*) and again from the answers of the window's
  intervals entered since (a disjoint sample).

docs/design.md ("Judgement proportional to the evidence", "Judging without false alarms")
gives the formulas and figures. Imports the config, the statistics, the jitter floor of
:mod:`adaptive_lb.stats.latency_factor` and the lateness discount of
:mod:`adaptive_lb.stats.lateness`.
"""

from __future__ import annotations

import functools
import math
import statistics
from collections.abc import Hashable, Iterable, Mapping

from attrs import define, evolve

from adaptive_lb.config import HealthConfig
from adaptive_lb.health.verdict import Slowness
from adaptive_lb.stats.host import WindowStats
from adaptive_lb.stats.latency_factor import MEDIAN_SE, floored_spread
from adaptive_lb.stats.lateness import discounted, majority_lateness

__all__ = [
    "DEFAULT_SPREAD",
    "MIN_EVIDENCE",
    "MIN_SPREAD",
    "Baseline",
    "bound_percentiles",
    "error_rate_lower_bound",
    "erroring_by_evidence",
    "false_alarm",
    "judge_slowness",
    "latency_spread",
    "samples_needed",
    "seconds_text",
    "slow_by_evidence",
    "tail_percentiles",
    "tail_ranks",
    "twice_as_sure",
    "upper_bound_windows",
]

MIN_EVIDENCE = 3
"""Fewest answers (or requests, for errors) any verdict rests on: one or two answers can be
one unlucky request each."""
DEFAULT_SPREAD = 0.5
"""Log-spread of a healthy host's latencies when no host has :data:`SPREAD_SAMPLES` yet
(typical of Cassandra reads: p95 about 2.3 x p50)."""
MIN_SPREAD = 0.2
"""The least log-spread assumed: a cluster measured steadier than this (p95 < 1.4 x p50)
still needs a few answers, not one."""
SPREAD_SAMPLES = 10
"""Answers a host needs before its p95 / p50 counts in :func:`latency_spread`."""
_Z95 = 1.6449  # standard normal quantile of 0.95
_NS = 1_000_000_000


def latency_spread(windows: Iterable[WindowStats]) -> float:
    """The cluster's log-spread of latency: the median over hosts with
    :data:`SPREAD_SAMPLES` answers of ``ln(p95 / p50) / 1.645`` (the sigma of a log-normal
    with those percentiles), at least :data:`MIN_SPREAD`; :data:`DEFAULT_SPREAD` when no
    host qualifies (the median keeps one slow host from deciding)."""
    spreads = []
    for window in windows:
        p50, p95 = window.latency.get(50.0), window.latency.get(95.0)
        if window.samples >= SPREAD_SAMPLES and p50 and p95 and p95 >= p50:
            spreads.append(math.log(p95 / p50) / _Z95)
    if not spreads:
        return DEFAULT_SPREAD
    return max(MIN_SPREAD, statistics.median(spreads))


def samples_needed(ratio: float, outlier_factor: float, spread: float, certainty: float) -> float:
    """Answers needed before a host whose median latency is ``ratio`` x its peers' is an
    outlier: ``(certainty * 1.2533 * spread / ln(ratio / outlier_factor)) ** 2`` (the
    median's standard error in log space), at least :data:`MIN_EVIDENCE`; ``math.inf`` when
    ``ratio`` is not above ``outlier_factor``."""
    if not ratio > outlier_factor:
        return math.inf
    margin = math.log(ratio / outlier_factor)
    return max(float(MIN_EVIDENCE), (certainty * MEDIAN_SE * spread / margin) ** 2)


def twice_as_sure(certainty: float) -> float:
    """The certainty of a test whose false-alarm probability is the square of one at
    ``certainty`` (:func:`false_alarm`): what one sample must show to be worth two disjoint
    ones (4.63 for 3)."""
    return -statistics.NormalDist().inv_cdf(false_alarm(certainty) ** 2)


def false_alarm(certainty: float) -> float:
    """The one-sided false-alarm probability of a test at ``certainty`` standard deviations
    (``health.certainty`` 3: 0.00135), the ``alpha`` of :func:`tail_ranks`."""
    return 0.5 * math.erfc(certainty / math.sqrt(2.0))


@functools.lru_cache(maxsize=4096)
def tail_ranks(samples: int, percentile: float, alpha: float) -> tuple[int, int]:
    """``(low, high)``: the ranks from the slowest of the order statistics of ``samples``
    answers that bound the ``percentile`` quantile from below and from above, each with
    confidence ``1 - alpha`` (distribution-free: the count of answers above the true
    quantile is Binomial(samples, q), ``q = 1 - percentile / 100``; ``low`` is the smallest
    ``k`` with ``P(Binomial >= k) <= alpha``, ``high`` the largest with ``P(Binomial < k) <=
    alpha``, at least 1). At ``alpha`` 0.00135, p99 of 1,000 answers lies between the 22nd
    slowest and the 2nd."""
    q = max(0.0, min(1.0, 1.0 - percentile / 100.0))
    if samples <= 0 or q <= 0.0:
        return samples + 1, 1
    if q >= 1.0:
        return 1, samples
    log_ratio = math.log(q) - math.log1p(-q)
    log_pmf = samples * math.log1p(-q)  # P(Binomial = 0)
    below = 0.0  # P(Binomial < k)
    high = 1
    for k in range(samples + 1):
        pmf = math.exp(log_pmf)
        if below + pmf <= alpha:
            high = max(1, k + 1)
        below += pmf
        if 1.0 - below <= alpha:  # P(Binomial >= k + 1) <= alpha
            return k + 1, high
        log_pmf += log_ratio + math.log(samples - k) - math.log(k + 1) if k < samples else 0.0
    return samples + 1, high


def tail_percentiles(
    samples: int, config: HealthConfig, certainty: float | None = None
) -> tuple[float, float] | None:
    """The percentiles of a window of ``samples`` answers at which the lower and upper
    confidence bounds of its latency at ``health.percentile`` lie (:func:`tail_ranks` at
    ``certainty``, default ``health.certainty``); None with fewer than :data:`MIN_EVIDENCE`
    answers, or when the lower bound would need more answers than the window holds."""
    if samples < MIN_EVIDENCE:
        return None
    alpha = false_alarm(config.certainty if certainty is None else certainty)
    low, high = tail_ranks(samples, float(config.percentile), alpha)
    low = max(low, MIN_EVIDENCE)
    if low > samples:
        return None
    return 100.0 * (samples - low + 1) / samples, 100.0 * (samples - high + 1) / samples


def error_rate_lower_bound(failures: int, requests: int, certainty: float) -> float:
    """Lower end of Wilson's score interval for ``failures`` / ``requests`` at ``certainty``
    standard deviations: the error rate the evidence makes sure of (0 with no request)."""
    if requests <= 0:
        return 0.0
    rate = failures / requests
    z2 = certainty * certainty
    centre = rate + z2 / (2 * requests)
    margin = certainty * math.sqrt(rate * (1 - rate) / requests + z2 / (4 * requests * requests))
    return max(0.0, (centre - margin) / (1 + z2 / requests))


def slow_by_evidence(
    window: WindowStats,
    peer_typical: float | None,
    spread: float,
    config: HealthConfig,
    lateness_s: float = 0.0,
    certainty: float | None = None,
    noise_s: float = 0.0,
) -> str | None:
    """Why the host is a latency outlier by its median against ``peer_typical`` (its peers'
    median of medians; :func:`samples_needed` at ``certainty``, default
    ``health.certainty``), or None while it is not (yet). ``lateness_s``: the client's
    typical lateness, taken off the host's median; it and ``noise_s``, what may have delayed
    most of the host's answers (:meth:`Baseline.noise`), floor the spread (a saturated
    client delays a burst of answers, and a host whose few answers fell in it shows a median
    that is the client's)."""
    typical = window.latency.get(50.0)
    if typical is None or not peer_typical:
        return None
    typical = discounted(typical, lateness_s, peer_typical)
    if typical <= config.slow_floor:
        return None
    ratio = typical / peer_typical
    own = floored_spread(spread, max(config.latency_factor.jitter, lateness_s, noise_s), typical)
    sure = config.certainty if certainty is None else certainty
    needed = samples_needed(ratio, config.outlier_factor, own, sure)
    if window.samples < needed:
        return None
    return (
        f"p50 {typical:.4f}s = {ratio:.1f} x peer median {peer_typical:.4f}s, "
        f"{window.samples} samples (>= {math.ceil(needed)} needed at spread {own:.2f})"
    )


def erroring_by_evidence(window: WindowStats, config: HealthConfig) -> str | None:
    """Why the host is ERRORING, or None while it is not (yet): over ``min_samples``
    requests, its error rate above ``health.error_rate``; over fewer (at least
    :data:`MIN_EVIDENCE`), the lower bound of that rate."""
    failures, requests = window.errors + window.timeouts, window.requests
    if requests >= config.min_samples:
        if window.error_rate <= config.error_rate:
            return None
        return (
            f"error+timeout rate {window.error_rate:.1%} > {config.error_rate:.1%} "
            f"over {requests} requests"
        )
    bound = error_rate_lower_bound(failures, requests, config.certainty)
    if requests < MIN_EVIDENCE or bound <= config.error_rate:
        return None
    return (
        f"{failures} of {requests} requests failed: error+timeout rate at least "
        f"{bound:.1%} > {config.error_rate:.1%}"
    )


def upper_bound_windows(
    windows: Mapping[Hashable, WindowStats], config: HealthConfig
) -> dict[Hashable, WindowStats]:
    """Each window with its latency at ``health.percentile`` replaced by that percentile's
    upper confidence bound (None without one), for the peers' median of it."""
    percentile = float(config.percentile)
    upper = {}
    for key, window in windows.items():
        bounds = tail_percentiles(window.samples, config)
        value = None if bounds is None else window.latency.get(bounds[1])
        upper[key] = evolve(window, latency={percentile: value})
    return upper


def bound_percentiles(samples: int, config: HealthConfig) -> list[float] | None:
    """The percentiles a window of ``samples`` answers is read at for the confidence bounds
    of :func:`tail_percentiles`, at ``health.certainty`` and :func:`twice_as_sure`."""
    bounds = tail_percentiles(samples, config)
    if bounds is None:
        return None
    strong = tail_percentiles(samples, config, twice_as_sure(config.certainty)) or ()
    return [*bounds, *strong]


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
    peer_samples: int = 0
    """About how many answers of each peer ``typical`` rests on (the median sample count of
    the peers it was taken from)."""
    probe_slow: str | None = None
    """Why the host's probes say it is still clearly slow (None: they do not, or no probe;
    :func:`~adaptive_lb.health.peers.still_slow`)."""
    recent: WindowStats | None = None
    """The answers of the window's intervals entered since the host was suspected (the
    second, disjoint sample)."""
    lateness_levels: tuple[float, ...] = ()
    """Every lateness the client saw over the window, increasing
    (:meth:`ClientLateness.levels <adaptive_lb.stats.lateness.ClientLateness.levels>`)."""

    @property
    def lateness_s(self) -> float:
        """The client's largest lateness over the window (what it may have added to any one
        answer): added to the tail's threshold."""
        return self.lateness_levels[-1] if self.lateness_levels else 0.0

    @property
    def typical_lateness_s(self) -> float:
        """Its (upper) median lateness (what it added to most answers): taken off the host's
        median by the median rule."""
        levels = self.lateness_levels
        return levels[len(levels) // 2] if levels else 0.0

    def noise(self, samples: int, certainty: float) -> float:
        """The client's lateness that may have delayed most of ``samples`` answers
        (:func:`~adaptive_lb.stats.lateness.majority_lateness` at ``certainty``)."""
        return majority_lateness(self.lateness_levels, samples, false_alarm(certainty))

    def reference(self, config: HealthConfig) -> float | None:
        """``outlier_factor`` x the peers' tail, above their upper confidence bound, at least
        ``slow_floor``; None without the peers' tail. A SLOW host is forgiven below
        ``recovery_factor`` x this: the client's own lateness weakens the evidence both
        ways, so it never makes a slow host look recovered."""
        if self.tail is None:
            return None
        return max(config.outlier_factor * self.tail, self.tail_bound or 0.0, config.slow_floor)

    def threshold(self, config: HealthConfig) -> float | None:
        """The tail's SLOW threshold: :meth:`reference` plus what the client itself may have
        added to any answer; None without the peers' tail."""
        reference = self.reference(config)
        return None if reference is None else reference + self.lateness_s

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
            noise_s=self.noise(sample.samples, certainty),
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


def judge_slowness(
    window: WindowStats,
    baseline: Baseline,
    config: HealthConfig,
    now_ns: int,
    previous: Slowness | None = None,
) -> Slowness:
    """Whether ``window`` shows its host slower than ``baseline`` (see the module
    docstring). ``previous``: what the last refresh concluded (its suspicion)."""
    latency = window.latency.get(float(config.percentile))
    tails = window.samples >= config.min_samples and latency is not None
    strong_why = baseline.gap(window, config, twice_as_sure(config.certainty), tails)
    weak_why = strong_why or baseline.gap(window, config, config.certainty, tails)
    if weak_why is None:
        return Slowness()
    threshold = baseline.threshold(config)
    old = previous or Slowness()
    since, interval = old.suspect_since_ns, old.suspect_interval
    if since is None:
        since, interval = now_ns, window.interval
    bounds = tail_percentiles(window.samples, config)
    low = None if bounds is None else window.latency.get(bounds[0])
    ratio = None
    if tails and low is not None and threshold and low > threshold:
        ratio = low / threshold
    why = strong_why
    recent = baseline.recent
    if why is None and recent is not None and recent.interval == window.interval:
        again = baseline.gap(recent, config, config.certainty, True)
        if again is not None:
            held_s = (now_ns - since) / _NS
            why = f"{weak_why}; again in the {recent.samples} answers of the last {held_s:.1f}s"
    return Slowness(why, since, interval, ratio)
