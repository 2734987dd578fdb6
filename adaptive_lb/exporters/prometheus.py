"""Prometheus metrics, computed at scrape time from ``policy.snapshot()``.

No Prometheus call is made per request: the policy keeps plain counters and the health
model's last window statistics; :class:`AdaptiveLbCollector` turns them into metric
families when Prometheus scrapes. Host labels are ``address``, ``dc``, ``rack``; with
several policies (one per execution profile) a ``policy`` label tells them apart.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from typing import Any

from prometheus_client import REGISTRY, CollectorRegistry, start_http_server
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    InfoMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector

from adaptive_lb.health_state import HealthState

__all__ = ["AdaptiveLbCollector", "start_prometheus_server"]

_HOST_LABELS = ["policy", "address", "dc", "rack"]


class AdaptiveLbCollector(Collector):
    """A ``prometheus_client`` collector for one or more AdaptiveLoadBalancingPolicy."""

    def __init__(self, policies: Any | Sequence[Any], names: Sequence[str] | None = None):
        self.policies = list(policies) if isinstance(policies, (list, tuple)) else [policies]
        self.names = list(names) if names else [str(i) for i in range(len(self.policies))]

    def collect(self) -> Iterator[Metric]:
        """Build every family from the policies' snapshots."""
        in_flight = GaugeMetricFamily(
            "adaptive_lb_host_in_flight", "Attempts in flight on the host.", labels=_HOST_LABELS
        )
        # Summary-style: quantiles (and the window's request count) as of the last health
        # refresh; no _sum, which a sliding HdrHistogram window does not keep.
        latency = Metric(
            "adaptive_lb_host_latency_seconds",
            "Latency over the statistics window, as of the last health refresh.",
            "summary",
        )
        requests = CounterMetricFamily(
            "adaptive_lb_host_requests", "Attempts completed with an outcome.", labels=_HOST_LABELS
        )
        errors = CounterMetricFamily(
            "adaptive_lb_host_errors", "Attempts that failed.", labels=_HOST_LABELS
        )
        timeouts = CounterMetricFamily(
            "adaptive_lb_host_timeouts", "Attempts that timed out.", labels=_HOST_LABELS
        )
        health = GaugeMetricFamily(
            "adaptive_lb_host_health",
            "1 for the host's current health state.",
            labels=[*_HOST_LABELS, "state"],
        )
        penalty = GaugeMetricFamily(
            "adaptive_lb_host_penalty", "The host's health penalty.", labels=_HOST_LABELS
        )
        decisions = CounterMetricFamily(
            "adaptive_lb_decisions",
            "Plans made, by the origin of their first host.",
            labels=["policy", "position"],
        )
        cache_hits = CounterMetricFamily(
            "adaptive_lb_replica_cache_hits", "Replica cache hits.", labels=["policy"]
        )
        cache_misses = CounterMetricFamily(
            "adaptive_lb_replica_cache_misses", "Replica cache misses.", labels=["policy"]
        )
        cache_evictions = CounterMetricFamily(
            "adaptive_lb_replica_cache_evictions", "Replica cache evictions.", labels=["policy"]
        )
        fallbacks = CounterMetricFamily(
            "adaptive_lb_plan_fallbacks",
            "Plans answered with the child's plan after an internal error.",
            labels=["policy"],
        )
        reloads = CounterMetricFamily(
            "adaptive_lb_config_reloads", "Config reloads by result.", labels=["policy", "result"]
        )
        info = InfoMetricFamily("adaptive_lb_config", "The config in force.", labels=["policy"])
        for name, policy in zip(self.names, self.policies, strict=True):
            snapshot = policy.snapshot()
            for host in snapshot.hosts:
                labels = [name, host.address, host.datacenter or "", host.rack or ""]
                in_flight.add_metric(labels, host.in_flight)
                label_map = dict(zip(_HOST_LABELS, labels, strict=True))
                for quantile, value in (
                    ("0.5", host.latency_p50),
                    ("0.95", host.latency_p95),
                    ("0.99", host.latency_p99),
                ):
                    if value is not None:
                        latency.add_sample(
                            "adaptive_lb_host_latency_seconds",
                            {**label_map, "quantile": quantile},
                            value,
                        )
                latency.add_sample(
                    "adaptive_lb_host_latency_seconds_count", label_map, host.requests
                )
                requests.add_metric(labels, host.requests_total)
                errors.add_metric(labels, host.errors_total)
                timeouts.add_metric(labels, host.timeouts_total)
                for state in HealthState:
                    value = 1.0 if state.value == host.health_state else 0.0
                    health.add_metric([*labels, state.value], value)
                penalty.add_metric(labels, host.health_penalty)
            for position, count in policy.decisions_by_position.items():
                decisions.add_metric([name, position], count)
            cache_hits.add_metric([name], snapshot.replica_cache_hits)
            cache_misses.add_metric([name], snapshot.replica_cache_misses)
            cache_evictions.add_metric([name], snapshot.replica_cache_evictions)
            fallbacks.add_metric([name], snapshot.internal_errors)
            for result, count in policy.config_reloads.items():
                reloads.add_metric([name, result], count)
            info.add_metric([name], {"hash": snapshot.config_hash})
        yield from (
            in_flight,
            latency,
            requests,
            errors,
            timeouts,
            health,
            penalty,
            decisions,
            cache_hits,
            cache_misses,
            cache_evictions,
            fallbacks,
            reloads,
            info,
        )


def start_prometheus_server(
    port: int,
    addr: str = "127.0.0.1",
    policies: Iterable[Any] = (),
    registry: CollectorRegistry | None = None,
) -> tuple[Any, Any]:
    """Serve ``/metrics`` for ``policies`` on ``addr:port`` (loopback by default; port 0
    picks a free one). Returns ``(server, thread)``; ``server.server_port`` is the port."""
    registry = registry if registry is not None else REGISTRY
    registry.register(AdaptiveLbCollector(list(policies)))
    return start_http_server(port, addr=addr, registry=registry)
