"""How a sample of a host's answers shows it slower than its peers (pure logic).

Three ways, each a confidence statement at a given certainty: the host's median against its
peers' (:func:`~adaptive_lb.evidence.slow_by_evidence`), and the lower confidence bounds of
its body (p90) and of its tail (p99) above a threshold made from its peers' (the same
percentile, x ``outlier_factor``) plus the client's own lateness
(:func:`~adaptive_lb.evidence.tail_percentiles`). :class:`Gap` says which, with the
numbers; :mod:`adaptive_lb.health_rules` asks it of a host's window (a suspicion, or a
verdict when twice as sure) and of the answers that came after (the second, disjoint
sample).

Imports the config, the statistics' window type and :mod:`adaptive_lb.evidence`.
"""

from __future__ import annotations

from attrs import define

from adaptive_lb.config import HealthConfig
from adaptive_lb.evidence import body_percentile, slow_by_evidence, tail_percentiles
from adaptive_lb.stats import WindowStats

__all__ = ["Gap", "above", "threshold_text"]


def _s(seconds: float | None) -> str:
    return "n/a" if seconds is None else f"{seconds:.4f}s"


def above(latency: float | None, threshold: float | None) -> bool:
    """Whether ``latency`` is known and above a known ``threshold``."""
    return latency is not None and threshold is not None and latency > threshold


def threshold_text(
    config: HealthConfig,
    peers: float | None,
    bound: float | None,
    lateness_s: float,
    body: bool = False,
) -> str:
    """How a threshold was made, for the reason of a verdict: ``outlier_factor`` x the
    peers' ``peers`` (their p99, or their p90 with ``body``), their upper ``bound`` when
    there is one, ``slow_floor``, plus the client's lateness."""
    which = f"p{body_percentile(config.percentile):g}" if body else f"p{config.percentile:g}"
    parts = [f"{config.outlier_factor:.1f} x peer median {which} {_s(peers)}"]
    if bound is not None:
        parts.append(f"peer bound {_s(bound)}")
    parts.append(f"floor {_s(config.slow_floor)}")
    return f"max({', '.join(parts)}) + client lateness {_s(lateness_s)}"


@define(frozen=True)
class Gap:
    """Why a sample of a host's answers shows it slower than its peers at a certainty
    (None: it does not): its median (:func:`~adaptive_lb.evidence.slow_by_evidence`), its
    body or its tail (their lower confidence bounds, :func:`~adaptive_lb.evidence.tail_percentiles`,
    above ``body`` and ``tail``: a threshold and how it was made)."""

    config: HealthConfig
    peer_typical: float | None
    spread: float
    least: int
    lateness_s: float
    tail: tuple[float | None, str]
    body: tuple[float | None, str]

    def __call__(self, sample: WindowStats, certainty: float, tails: bool) -> str | None:
        config = self.config
        why = slow_by_evidence(
            sample, self.peer_typical, self.spread, config, self.least, self.lateness_s, certainty
        )
        if why is not None or not tails:
            return why
        bounds = tail_percentiles(sample.samples, config, certainty)
        if bounds is None:
            return None
        for (threshold, made), at in ((self.body, bounds[2]), (self.tail, bounds[0])):
            value = sample.latency.get(at)
            if above(value, threshold):
                return f"p{at:.3g} {_s(value)} > {_s(threshold)} = {made}, {sample.samples} samples"
        return None
