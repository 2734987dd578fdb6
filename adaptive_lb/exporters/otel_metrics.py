"""The same numbers as the Prometheus collector, as OpenTelemetry observable instruments,
for users who ship metrics over OTLP. Read at collection time from ``policy.snapshot()``;
nothing is recorded per request."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from opentelemetry import metrics
from opentelemetry.metrics import CallbackOptions, Observation

__all__ = ["register_otel_metrics"]


def register_otel_metrics(policy: Any, meter_provider: Any | None = None) -> list[Any]:
    """Create the observable instruments for ``policy`` on ``meter_provider`` (default: the
    global one) and return them."""
    meter = metrics.get_meter("adaptive_lb", meter_provider=meter_provider)

    def host_attributes(host: Any) -> dict[str, str]:
        return {
            "server.address": host.address,
            "dc": host.datacenter or "",
            "rack": host.rack or "",
        }

    def per_host(value_of):
        def callback(options: CallbackOptions) -> Iterable[Observation]:
            for host in policy.snapshot().hosts:
                value = value_of(host)
                if value is not None:
                    yield Observation(value, host_attributes(host))

        return callback

    def p99(options: CallbackOptions) -> Iterable[Observation]:
        for host in policy.snapshot().hosts:
            for quantile, value in (
                ("0.5", host.latency_p50),
                ("0.95", host.latency_p95),
                ("0.99", host.latency_p99),
            ):
                if value is not None:
                    yield Observation(value, {**host_attributes(host), "quantile": quantile})

    def decisions(options: CallbackOptions) -> Iterable[Observation]:
        for position, count in policy.decisions_by_position.items():
            yield Observation(count, {"position": position})

    def cache(kind: str):
        def callback(options: CallbackOptions) -> Iterable[Observation]:
            yield Observation(getattr(policy.snapshot(), f"replica_cache_{kind}"))

        return callback

    return [
        meter.create_observable_gauge(
            "adaptive_lb.host.in_flight", [per_host(lambda h: h.in_flight)], unit="{request}"
        ),
        meter.create_observable_gauge("adaptive_lb.host.latency", [p99], unit="s"),
        meter.create_observable_counter(
            "adaptive_lb.host.requests", [per_host(lambda h: h.requests_total)], unit="{request}"
        ),
        meter.create_observable_counter(
            "adaptive_lb.host.errors", [per_host(lambda h: h.errors_total)], unit="{request}"
        ),
        meter.create_observable_counter(
            "adaptive_lb.host.timeouts", [per_host(lambda h: h.timeouts_total)], unit="{request}"
        ),
        meter.create_observable_gauge(
            "adaptive_lb.host.penalty", [per_host(lambda h: h.health_penalty)]
        ),
        meter.create_observable_counter("adaptive_lb.decisions", [decisions]),
        meter.create_observable_counter("adaptive_lb.replica_cache.hits", [cache("hits")]),
        meter.create_observable_counter("adaptive_lb.replica_cache.misses", [cache("misses")]),
        meter.create_observable_counter(
            "adaptive_lb.replica_cache.evictions", [cache("evictions")]
        ),
        meter.create_observable_counter(
            "adaptive_lb.plan_fallbacks",
            [lambda options: [Observation(policy.internal_errors)]],
        ),
    ]
