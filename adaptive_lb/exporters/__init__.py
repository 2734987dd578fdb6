"""Where adaptive-lb's numbers go: a Prometheus collector computed at scrape time and its
HTTP endpoint (:mod:`~adaptive_lb.exporters.prometheus`), the same numbers as OpenTelemetry
observable instruments (:mod:`~adaptive_lb.exporters.otel_metrics`), and OTLP span export
that never blocks a request (:mod:`~adaptive_lb.exporters.otlp`); :func:`start_exporters`
starts what a config enables (:mod:`~adaptive_lb.exporters.setup`).

Importing this package needs only the core install (``opentelemetry-api`` and
``prometheus-client``): the OpenTelemetry SDK and the OTLP exporters (``pip install
"adaptive-lb[otlp]"``) are imported when :func:`setup_tracing` is called, and only then.
The SDK-based pieces live in :mod:`~adaptive_lb.exporters.span_processor`
(``CountingBatchSpanProcessor``) and :mod:`~adaptive_lb.exporters.backoff`
(``BackoffSpanExporter``).

Imports its own modules only (the SDK-free ones; see above).
"""

from adaptive_lb.exporters.otel_metrics import register_otel_metrics, unregister_otel_metrics
from adaptive_lb.exporters.otlp import setup_tracing
from adaptive_lb.exporters.prometheus import AdaptiveLbCollector
from adaptive_lb.exporters.prometheus_server import PrometheusServer, start_prometheus_server
from adaptive_lb.exporters.setup import Exporters, start_exporters
from adaptive_lb.exporters.span_counts import SpanExportTotals, span_export_totals

__all__ = [
    "AdaptiveLbCollector",
    "Exporters",
    "PrometheusServer",
    "SpanExportTotals",
    "register_otel_metrics",
    "setup_tracing",
    "span_export_totals",
    "start_exporters",
    "start_prometheus_server",
    "unregister_otel_metrics",
]
