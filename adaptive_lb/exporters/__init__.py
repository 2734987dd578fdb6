"""Where adaptive-lb's numbers go: a Prometheus collector computed at scrape time and its
HTTP endpoint (:mod:`~adaptive_lb.exporters.prometheus`), the same numbers as OpenTelemetry
observable instruments (:mod:`~adaptive_lb.exporters.otel_metrics`), and OTLP span export
that never blocks a request (:mod:`~adaptive_lb.exporters.otlp`); :func:`start_exporters`
starts what a config enables (:mod:`~adaptive_lb.exporters.setup`)."""

from adaptive_lb.exporters.otel_metrics import register_otel_metrics
from adaptive_lb.exporters.otlp import (
    BoundedSpanProcessor,
    SpanExportTotals,
    setup_tracing,
    span_export_totals,
)
from adaptive_lb.exporters.prometheus import AdaptiveLbCollector, start_prometheus_server
from adaptive_lb.exporters.setup import Exporters, start_exporters

__all__ = [
    "AdaptiveLbCollector",
    "BoundedSpanProcessor",
    "Exporters",
    "SpanExportTotals",
    "register_otel_metrics",
    "setup_tracing",
    "span_export_totals",
    "start_exporters",
    "start_prometheus_server",
]
