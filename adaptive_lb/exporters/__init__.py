"""Where adaptive-lb's numbers go: a Prometheus collector computed at scrape time and its
HTTP endpoint (:mod:`~adaptive_lb.exporters.prometheus`), and OTLP span export that never
blocks a request (:mod:`~adaptive_lb.exporters.otlp`)."""

from adaptive_lb.exporters.otel_metrics import register_otel_metrics
from adaptive_lb.exporters.otlp import BoundedSpanProcessor, setup_tracing
from adaptive_lb.exporters.prometheus import AdaptiveLbCollector, start_prometheus_server

__all__ = [
    "AdaptiveLbCollector",
    "BoundedSpanProcessor",
    "register_otel_metrics",
    "setup_tracing",
    "start_prometheus_server",
]
