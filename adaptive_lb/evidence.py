"""Judgement proportional to the evidence: how many answers a verdict needs (pure logic).

The tail rules of :mod:`adaptive_lb.health_rules` wait for ``health.min_samples`` answers
in the window before they judge a host. A client sending ten requests a second never gets
there (each of three hosts answers about three times a second), so a host 50 ms slower than
its peers would never be judged. The rules here judge from fewer answers when the gap is
large enough that few answers settle it:

* **Slow.** A host's typical latency (its window's median, ``m``) against its peers'
  (the median of their medians, ``p``). Latencies are roughly log-normal with a log-spread
  ``s`` (:func:`latency_spread`, measured on the cluster); the median of ``n`` samples
  has a standard error of about ``1.2533 * s / sqrt(n)`` in log space. The host is an
  outlier when its median is above ``outlier_factor`` x ``p`` by more than ``certainty``
  standard errors::

      ln(m / (outlier_factor * p)) > certainty * 1.2533 * s / sqrt(n)
      i.e.  n >= (certainty * 1.2533 * s / ln(m / (outlier_factor * p))) ** 2

  (:func:`samples_needed`), and never from fewer than :data:`MIN_EVIDENCE` answers. With
  the defaults (``certainty`` 3, ``outlier_factor`` 2, ``s`` 0.5): 50 ms among peers at
  1 ms is settled by 3 answers, 10 ms by 3, 4 ms by 8, 3 ms by 22, 2.5 ms by 71; 1.9 ms
  never (below the factor). The host's median must also be above ``health.slow_floor``.
  The host's spread is at least what the client's own jitter makes it at its median
  (``health.latency_factor.jitter``, :func:`adaptive_lb.latency_factor.floored_spread`):
  on a steady cluster (``s`` 0.2) a host at 3 ms among peers at 1.2 ms needs 24 answers,
  not 12: 1 ms of the client's own noise on a few answers would look the same.
* **Slow, by the tail.** From ``min_samples`` answers the tail rule judges a host by its
  latency at ``percentile`` (p99) against ``outlier_factor`` x its peers'. Over ``n``
  answers p99 is the ``n // 100 + 1``-th slowest: at 128 answers, the second slowest.
  A stall of the client's own (a garbage collection, a starved process) delays every
  request in flight at that moment, whichever host it went to: the host that happened to
  have two of them in flight shows the stall as its p99, its peers with one each do not.
  So the tail too must rest on :data:`MIN_EVIDENCE` answers: the host's latency at
  ``100 * (n - 2) / n`` (its third slowest answer) must be above the threshold as well,
  when that is below ``percentile`` (:func:`support_percentile`; p99 from 200 answers on
  rests on 3 by itself).
* **Erroring.** The error rate's lower confidence bound (Wilson's score interval,
  ``certainty`` standard deviations) above ``health.error_rate``: 4 failures in 4
  requests are enough, 5 in 10 are not (:func:`error_rate_lower_bound`).

These add to the tail rules, which keep judging busy hosts as before. No driver import, no
state: the health model computes the inputs at each refresh, never per request.

Imports the config, the statistics and the jitter floor of :mod:`adaptive_lb.latency_factor`.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Hashable, Iterable, Mapping

from adaptive_lb.config import HealthConfig
from adaptive_lb.latency_factor import floored_spread
from adaptive_lb.stats import WindowStats

__all__ = [
    "DEFAULT_SPREAD",
    "MIN_EVIDENCE",
    "MIN_SPREAD",
    "error_rate_lower_bound",
    "erroring_by_evidence",
    "latency_spread",
    "samples_needed",
    "slow_by_evidence",
    "support_percentile",
    "typical_samples",
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
_MEDIAN_SE = math.sqrt(math.pi / 2)  # standard error of a median / of a mean (normal)
_Z95 = 1.6449  # standard normal quantile of 0.95


def latency_spread(windows: Iterable[WindowStats]) -> float:
    """The cluster's log-spread of latency: the median over hosts with
    :data:`SPREAD_SAMPLES` answers of ``ln(p95 / p50) / 1.645`` (the sigma of a log-normal
    with those percentiles), at least :data:`MIN_SPREAD`; :data:`DEFAULT_SPREAD` when no
    host qualifies. Measured on every host, slow ones included: a slow host widens its own
    spread only if it is slow some of the time, and the median keeps one host from
    deciding."""
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
    return max(float(least), (certainty * _MEDIAN_SE * spread / margin) ** 2)


def support_percentile(samples: int, config: HealthConfig) -> float | None:
    """The percentile at which a host's latency over ``samples`` answers must also be above
    the SLOW threshold, so that the tail rule rests on :data:`MIN_EVIDENCE` answers (see
    the module docstring): ``100 * (samples - MIN_EVIDENCE + 1) / samples``, at most
    ``health.percentile``. None with fewer than :data:`MIN_EVIDENCE` answers."""
    if samples < MIN_EVIDENCE:
        return None
    return min(float(config.percentile), 100.0 * (samples - MIN_EVIDENCE + 1) / samples)


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
    least: int = MIN_EVIDENCE,
) -> str | None:
    """Why the host is a latency outlier by the evidence (its median against
    ``peer_typical``, its peers' median of medians, at the cluster's ``spread`` or the
    jitter's at the host's median, whichever is larger), or None while it is not (yet).
    ``least``: the fewest answers that may decide (1 for a host just back from SLOW: the
    evidence that sent it there is the rest)."""
    typical = window.latency.get(50.0)
    if typical is None or not peer_typical or typical <= config.slow_floor:
        return None
    ratio = typical / peer_typical
    own = floored_spread(spread, config.latency_factor.jitter, typical)
    needed = samples_needed(ratio, config.outlier_factor, own, config.certainty, least)
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
    how many answers of each peer the evidence rules' peer median rests on (the latency
    factor weighs its uncertainty too)."""
    counts: dict[Hashable, list[int]] = {}
    for key, window in windows.items():
        if window.samples >= MIN_EVIDENCE:
            counts.setdefault(groups.get(key), []).append(window.samples)
    return {group: round(statistics.median(values)) for group, values in counts.items()}
