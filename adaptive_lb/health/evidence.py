"""Judgement proportional to the evidence: the statistics every verdict rests on (pure logic).

* **A median's gap** (:func:`samples_needed`, :func:`slow_by_evidence`): latencies are about
  log-normal with the cluster's log-spread ``s`` (:func:`latency_spread`); the median of
  ``n`` answers has a standard error of ``1.2533 * s / sqrt(n)`` in log space, so a host
  whose median ``m`` is above ``outlier_factor`` x its peers' ``p`` is an outlier once
  ``n >= (certainty * 1.2533 * s / ln(m / (outlier_factor * p))) ** 2``, never from fewer
  than :data:`MIN_EVIDENCE` answers; its spread is floored by the client's jitter and
  lateness, and its typical lateness is taken off its median first.
* **A quantile's interval** (:func:`tail_ranks`, :func:`tail_percentiles`): distribution-free,
  from the order statistics of ``n`` answers, at a false-alarm probability ``alpha``
  (:func:`false_alarm`; :func:`twice_as_sure`: at ``alpha ** 2``).
* **An error rate's lower bound** (:func:`error_rate_lower_bound`, Wilson's score interval).

docs/design.md ("Judgement proportional to the evidence", "Judging without false alarms")
gives the figures. Imports the config, the statistics, the jitter floor of
:mod:`adaptive_lb.stats.latency_factor` and the lateness discount of
:mod:`adaptive_lb.stats.lateness`.
"""

from __future__ import annotations

import functools
import math
import statistics
from collections.abc import Hashable, Iterable, Mapping

from attrs import evolve

from adaptive_lb.config import HealthConfig
from adaptive_lb.stats.host import WindowStats
from adaptive_lb.stats.latency_factor import MEDIAN_SE, floored_spread
from adaptive_lb.stats.lateness import discounted

__all__ = [
    "DEFAULT_SPREAD",
    "MIN_EVIDENCE",
    "MIN_SPREAD",
    "bound_percentiles",
    "error_rate_lower_bound",
    "erroring_by_evidence",
    "false_alarm",
    "latency_spread",
    "samples_needed",
    "slow_by_evidence",
    "tail_percentiles",
    "tail_ranks",
    "twice_as_sure",
    "typical_samples",
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


def samples_needed(
    ratio: float, outlier_factor: float, spread: float, certainty: float, least: int = MIN_EVIDENCE
) -> float:
    """Answers needed before a host whose median latency is ``ratio`` x its peers' is an
    outlier (see the module docstring); ``math.inf`` when ``ratio`` is not above
    ``outlier_factor``. At least ``least``."""
    if not ratio > outlier_factor:
        return math.inf
    margin = math.log(ratio / outlier_factor)
    return max(float(least), (certainty * MEDIAN_SE * spread / margin) ** 2)


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
    """Why the host is a latency outlier by the evidence (its median against
    ``peer_typical``, its peers' median of medians; see the module docstring), or None
    while it is not (yet), from :data:`MIN_EVIDENCE` answers at least. ``lateness_s``:
    the client's own lateness, taken off the host's median and the jitter floor when it
    is larger. ``certainty``: standard errors of confidence (default ``health.certainty``).
    ``noise_s``: the client's largest lateness over the window, a floor of the spread too:
    a saturated client delays a burst of answers, and a host whose few answers fell in it
    shows a median that is the client's."""
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
    """Why the host is ERRORING by the evidence (the lower bound of its error rate above
    ``health.error_rate``), or None while it is not (yet)."""
    if window.requests < MIN_EVIDENCE:
        return None
    failures = window.errors + window.timeouts
    bound = error_rate_lower_bound(failures, window.requests, config.certainty)
    if bound <= config.error_rate:
        return None
    return (
        f"{failures} of {window.requests} requests failed: error+timeout rate at least "
        f"{bound:.1%} > {config.error_rate:.1%}"
    )


def typical_samples(
    windows: Mapping[Hashable, WindowStats], groups: Mapping[Hashable, Hashable]
) -> dict[Hashable, int]:
    """Per group, the median sample count of its hosts with ``MIN_EVIDENCE`` answers: about
    how many answers of each peer the evidence rules' peer median rests on."""
    counts: dict[Hashable, list[int]] = {}
    for key, window in windows.items():
        if window.samples >= MIN_EVIDENCE:
            counts.setdefault(groups.get(key), []).append(window.samples)
    return {group: round(statistics.median(values)) for group, values in counts.items()}


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
