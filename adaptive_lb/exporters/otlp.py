"""Sending decision spans to Jaeger (or any OTLP receiver), without ever making a request
wait on the network -- or pay for a receiver that is down.

:func:`setup_tracing` builds an OpenTelemetry SDK ``TracerProvider`` whose spans go through
the SDK's ``BatchSpanProcessor`` -- a bounded queue drained by one background thread --
(:class:`~adaptive_lb.exporters.span_processor.CountingBatchSpanProcessor`, which counts
what it drops) to an OTLP exporter (gRPC or HTTP/protobuf) aimed at the configured
endpoint, wrapped in a :class:`~adaptive_lb.exporters.backoff.BackoffSpanExporter` (after a
failure, batches are dropped unsent for 1 s doubling to 60 s). Ending a span is an append
to that queue; when the queue is full (the receiver is down, slow or hung), the span is
dropped and counted, never waited for. Every span that never reached the receiver is
counted, per processor and process-wide (:func:`span_export_totals`), and published as
``adaptive_lb_trace_spans_dropped_total{reason="queue_full"|"export_failed"|"backoff"|"shutdown"}``
and ``adaptive_lb_trace_spans_exported_total``.

The SDK and the OTLP exporters are optional (``pip install "adaptive-lb[otlp]"``): this
module imports them only when :func:`setup_tracing` or :func:`make_otlp_exporter` is
called, and raises an ``ImportError`` naming the extra when they are missing. Everything
else -- decision events on the application's own spans, the Prometheus endpoint, the
OpenTelemetry metrics -- needs only ``opentelemetry-api``.

Imports the config and the span counts; the SDK,
:mod:`~adaptive_lb.exporters.span_processor` and :mod:`~adaptive_lb.exporters.backoff` only
when called.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, NoReturn

from adaptive_lb.config import Config, TracingConfig
from adaptive_lb.exporters.span_counts import ExportCounts, SpanExportTotals, span_export_totals

if TYPE_CHECKING:
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SpanExporter

__all__ = [
    "INSTALL_HINT",
    "ExportCounts",
    "SpanExportTotals",
    "make_otlp_exporter",
    "setup_tracing",
    "span_export_totals",
]

INSTALL_HINT = (
    "pip install opentelemetry-sdk opentelemetry-exporter-otlp-proto-http "
    "opentelemetry-exporter-otlp-proto-grpc (the otlp extra)"
)
"""What to install for OTLP span export (the OpenTelemetry SDK and both OTLP exporters)."""

_OPTIONAL = ("opentelemetry", "grpc", "google", "requests", "urllib3", "certifi")
"""Top-level packages of the ``otlp`` extra: an ImportError for one of them means the extra
is missing; any other ImportError is a bug and propagates as it is."""


def _raise_missing(what: str, exc: ImportError) -> NoReturn:
    """Raise an ImportError naming the ``otlp`` extra when ``exc`` says one of its packages
    is missing; re-raise ``exc`` as it is otherwise (a bug, not a missing extra)."""
    name = exc.name or ""
    if name.partition(".")[0] not in _OPTIONAL:
        raise exc
    raise ImportError(
        f"{what} needs the OpenTelemetry SDK and OTLP exporters, which adaptive-lb does not "
        f"install by default: {INSTALL_HINT} (missing module: {name})",
        name=name,
    ) from exc


def __getattr__(name: str) -> Any:
    """``BackoffSpanExporter`` and ``CountingBatchSpanProcessor``, imported on first use
    (they need the SDK): they live in :mod:`~adaptive_lb.exporters.backoff` and
    :mod:`~adaptive_lb.exporters.span_processor`."""
    if name == "BackoffSpanExporter":
        try:
            from adaptive_lb.exporters.backoff import BackoffSpanExporter
        except ImportError as exc:
            _raise_missing("BackoffSpanExporter", exc)
        return BackoffSpanExporter
    if name == "CountingBatchSpanProcessor":
        try:
            from adaptive_lb.exporters.span_processor import CountingBatchSpanProcessor
        except ImportError as exc:
            _raise_missing("CountingBatchSpanProcessor", exc)
        return CountingBatchSpanProcessor
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def make_otlp_exporter(config: TracingConfig) -> SpanExporter:
    """The OTLP span exporter for ``config.otlp`` (protocol ``grpc`` or ``http``), without
    backoff (:func:`setup_tracing` wraps it in a
    :class:`~adaptive_lb.exporters.backoff.BackoffSpanExporter`).

    ``config.otlp.timeout`` bounds one ``export`` call: both exporters retry retryable
    errors themselves (connection refused or reset, HTTP 429/502/503/504, gRPC UNAVAILABLE,
    DEADLINE_EXCEEDED...) with an exponential delay of their own (1, 2, 4 s +-20 %, sleeping
    in the calling thread: no CPU) only while the next attempt still fits in the timeout,
    and each attempt's socket wait gets what is left of it; a receiver that accepts and
    never answers holds one call for the timeout, waiting on the socket. The HTTP exporter
    before 1.40 backs off only on HTTP statuses: a refused or timed-out connection raises out
    of ``export`` (requests' ``ConnectionError``, ``ReadTimeout``), which the
    ``BackoffSpanExporter`` counts as a failure like ``FAILURE``.

    Only the chosen protocol's exporter is imported (``opentelemetry-exporter-otlp-proto-
    http`` or ``-grpc``); ``ImportError`` naming the ``otlp`` extra if it is missing."""
    otlp = config.otlp
    if not otlp.endpoint:
        raise ValueError("tracing.otlp.endpoint is not set")
    headers = dict(otlp.headers) or None
    if otlp.protocol == "http":
        try:
            from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
        except ImportError as exc:
            _raise_missing("OTLP/HTTP span export", exc)

        endpoint = otlp.endpoint
        if not endpoint.rstrip("/").endswith("/v1/traces"):
            endpoint = endpoint.rstrip("/") + "/v1/traces"
        return OTLPSpanExporter(endpoint=endpoint, headers=headers, timeout=otlp.timeout)
    try:
        from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import (
            OTLPSpanExporter as GrpcExporter,
        )
    except ImportError as exc:
        _raise_missing("OTLP/gRPC span export", exc)

    # http:// is plaintext, https:// is TLS; no scheme: the exporter decides (TLS unless
    # OTEL_EXPORTER_OTLP_INSECURE=true).
    insecure = True if otlp.endpoint.startswith("http://") else None
    return GrpcExporter(
        endpoint=otlp.endpoint, headers=headers, timeout=otlp.timeout, insecure=insecure
    )


def setup_tracing(
    config: Config | TracingConfig,
    exporter: SpanExporter | None = None,
    max_queue_size: int = 2048,
) -> TracerProvider:
    """A TracerProvider exporting to ``config``'s OTLP endpoint (or to ``exporter``) through
    a :class:`~adaptive_lb.exporters.span_processor.CountingBatchSpanProcessor` (the SDK's
    ``BatchSpanProcessor``, queue of ``max_queue_size`` spans), available as
    ``provider.adaptive_lb_processor``. The exporter is always wrapped in a
    :class:`~adaptive_lb.exporters.backoff.BackoffSpanExporter` (unless it is one already),
    available as ``provider.adaptive_lb_exporter``. Pass the provider to
    ``AdaptiveLoadBalancingPolicy(..., tracer_provider=provider)`` or make it global with
    ``opentelemetry.trace.set_tracer_provider``.

    Needs the OpenTelemetry SDK and, unless ``exporter`` is given, the OTLP exporter of
    ``config.otlp.protocol``: raises ``ImportError`` saying ``pip install
    "adaptive-lb[otlp]"`` when they are not installed."""
    try:
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import TracerProvider

        from adaptive_lb.exporters.backoff import BackoffSpanExporter
        from adaptive_lb.exporters.span_processor import CountingBatchSpanProcessor
    except ImportError as exc:
        _raise_missing("OTLP span export (setup_tracing)", exc)

    tracing = config.tracing if isinstance(config, Config) else config
    if exporter is None:
        exporter = BackoffSpanExporter(
            make_otlp_exporter(tracing),
            endpoint=tracing.otlp.endpoint,
            secrets=list(tracing.otlp.headers.values()),
        )
    elif not isinstance(exporter, BackoffSpanExporter):
        exporter = BackoffSpanExporter(exporter)
    resource = Resource.create({"service.name": tracing.otlp.service_name})
    provider = TracerProvider(resource=resource)
    processor = CountingBatchSpanProcessor(exporter, max_queue_size=max_queue_size)
    provider.add_span_processor(processor)
    # Handles for the caller, set on the SDK's own class (deliberately, see the docstring).
    provider.adaptive_lb_processor = processor  # type: ignore[attr-defined]
    provider.adaptive_lb_exporter = exporter  # type: ignore[attr-defined]
    return provider
