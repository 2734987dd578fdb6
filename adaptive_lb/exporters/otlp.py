"""Sending decision spans to Jaeger (or any OTLP receiver), without ever making a request
wait on the network.

:func:`setup_tracing` builds an OpenTelemetry SDK ``TracerProvider`` whose spans go through
a :class:`BoundedSpanProcessor` -- a fixed-size queue drained by one background thread --
to an OTLP exporter (gRPC or HTTP/protobuf) aimed at the configured endpoint. Ending a span
is an append to that queue; when the queue is full (the receiver is down, slow or hung),
the span is dropped and counted, never waited for.

Why not the SDK's ``BatchSpanProcessor``: it also never blocks, but it drops silently (a log
line, no count). Here every span that never reached the receiver is counted, per processor
and process-wide (:func:`span_export_totals`), and the Prometheus collector and the
OpenTelemetry instruments publish the process-wide numbers as
``adaptive_lb_trace_spans_dropped_total{reason="queue_full"|"export_failed"|"shutdown"}``
and ``adaptive_lb_trace_spans_exported_total``.
"""

from __future__ import annotations

import collections
import logging
import threading
import time
from collections.abc import Sequence
from typing import Any

from attrs import define
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan, SpanProcessor, TracerProvider
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult

from adaptive_lb.config import Config, TracingConfig

__all__ = [
    "BoundedSpanProcessor",
    "SpanExportTotals",
    "make_otlp_exporter",
    "setup_tracing",
    "span_export_totals",
]

log = logging.getLogger("adaptive_lb.exporters")


@define(frozen=True, slots=True)
class SpanExportTotals:
    """Spans handled by every :class:`BoundedSpanProcessor` of the process, since start."""

    exported: int
    queue_full: int
    """Dropped on arrival: the queue was full (receiver down, slow or hung)."""
    export_failed: int
    """Dropped after the exporter failed (refused, timed out, raised)."""
    shutdown: int
    """Still queued when the processor shut down, or ended after it did."""

    @property
    def dropped(self) -> int:
        """Every span that never reached a receiver."""
        return self.queue_full + self.export_failed + self.shutdown


class _Totals:
    """Process-wide counters (they survive processors, so they never go down)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.processors = 0
        self.counts = {"exported": 0, "queue_full": 0, "export_failed": 0, "shutdown": 0}

    def add(self, kind: str, count: int = 1) -> None:
        with self.lock:
            self.counts[kind] += count


_TOTALS = _Totals()


def span_export_totals() -> SpanExportTotals | None:
    """The process-wide span counts, or None while no :class:`BoundedSpanProcessor` exists
    (tracing goes elsewhere, or nowhere: there is nothing to report)."""
    with _TOTALS.lock:
        if not _TOTALS.processors:
            return None
        return SpanExportTotals(**_TOTALS.counts)


class BoundedSpanProcessor(SpanProcessor):
    """Batches ended spans to ``exporter`` from a background thread.

    ``on_end`` (called on the thread that ended the span, possibly a request's) only appends
    to a bounded queue. Counters: ``exported_spans``, ``queue_full_drops``,
    ``failed_spans`` (the exporter said no or raised), ``shutdown_drops`` (still queued after
    the flush at shutdown), ``dropped_spans`` (their sum: everything that never reached the
    receiver). They are also added to the process-wide :func:`span_export_totals`.
    """

    def __init__(
        self,
        exporter: SpanExporter,
        max_queue_size: int = 2048,
        max_batch_size: int = 512,
        schedule_delay: float = 1.0,
    ) -> None:
        self.exporter = exporter
        self.max_queue_size = max_queue_size
        self.max_batch_size = max_batch_size
        self.schedule_delay = schedule_delay
        self._queue: collections.deque[ReadableSpan] = collections.deque()
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._stopped = threading.Event()
        self._idle = threading.Event()
        self._idle.set()
        self.exported_spans = 0
        self.failed_spans = 0
        self.queue_full_drops = 0
        self.shutdown_drops = 0
        with _TOTALS.lock:
            _TOTALS.processors += 1
        self._thread = threading.Thread(target=self._run, name="adaptive-lb-otlp", daemon=True)
        self._thread.start()

    @property
    def dropped_spans(self) -> int:
        """Spans that never reached the receiver (queue full or export failed)."""
        return self.queue_full_drops + self.failed_spans + self.shutdown_drops

    def on_start(self, span: Any, parent_context: Any = None) -> None:
        """Nothing to do when a span starts."""

    def on_end(self, span: ReadableSpan) -> None:
        """Queue the span, or drop and count it when the queue is full."""
        if self._stopped.is_set():
            self.shutdown_drops += 1
            _TOTALS.add("shutdown")
            return
        with self._lock:
            if len(self._queue) >= self.max_queue_size:
                self.queue_full_drops += 1
                _TOTALS.add("queue_full")
                return
            self._queue.append(span)
            full_batch = len(self._queue) >= self.max_batch_size
        if full_batch:
            self._wake.set()

    def _take_batch(self) -> list[ReadableSpan]:
        with self._lock:
            count = min(len(self._queue), self.max_batch_size)
            return [self._queue.popleft() for _ in range(count)]

    def _export(self, batch: Sequence[ReadableSpan]) -> None:
        try:
            result = self.exporter.export(batch)
        except Exception:
            log.debug("adaptive-lb: span export raised", exc_info=True)
            result = SpanExportResult.FAILURE
        if result is SpanExportResult.SUCCESS:
            self.exported_spans += len(batch)
            _TOTALS.add("exported", len(batch))
        else:
            self.failed_spans += len(batch)
            _TOTALS.add("export_failed", len(batch))

    def _run(self) -> None:
        while True:
            self._wake.wait(self.schedule_delay)
            self._wake.clear()
            self._idle.clear()
            while not self._stopped.is_set():
                batch = self._take_batch()
                if not batch:
                    break
                self._export(batch)
            self._idle.set()
            if self._stopped.is_set():
                self._drop_queued()
                return

    def _drop_queued(self) -> None:
        with self._lock:
            count = len(self._queue)
            self._queue.clear()
        if count:
            self.shutdown_drops += count
            _TOTALS.add("shutdown", count)

    def force_flush(self, timeout_millis: int = 30_000) -> bool:
        """Export what is queued now; True if the queue emptied within the timeout."""
        deadline = time.monotonic() + timeout_millis / 1000
        while time.monotonic() < deadline:
            self._wake.set()
            if not self._queue and self._idle.is_set():
                return True
            time.sleep(0.005)
        return not self._queue and self._idle.is_set()

    def shutdown(self, timeout_millis: int = 2000) -> None:
        """Flush for at most ``timeout_millis``, then stop: what is still queued is dropped
        (and counted); an export in progress gets a few more seconds to end."""
        if self._stopped.is_set():
            return
        self.force_flush(timeout_millis)
        self._stopped.set()
        self._wake.set()
        self._thread.join(timeout=5)
        self.exporter.shutdown()


def make_otlp_exporter(config: TracingConfig) -> SpanExporter:
    """The OTLP span exporter for ``config.otlp`` (protocol ``grpc`` or ``http``)."""
    otlp = config.otlp
    if not otlp.endpoint:
        raise ValueError("tracing.otlp.endpoint is not set")
    headers = dict(otlp.headers) or None
    if otlp.protocol == "http":
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

        endpoint = otlp.endpoint
        if not endpoint.rstrip("/").endswith("/v1/traces"):
            endpoint = endpoint.rstrip("/") + "/v1/traces"
        return OTLPSpanExporter(endpoint=endpoint, headers=headers, timeout=otlp.timeout)
    from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import (
        OTLPSpanExporter as GrpcExporter,
    )

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
    a :class:`BoundedSpanProcessor`, available as ``provider.adaptive_lb_processor``. Pass
    it to ``AdaptiveLoadBalancingPolicy(..., tracer_provider=provider)`` or make it global
    with ``opentelemetry.trace.set_tracer_provider``."""
    tracing = config.tracing if isinstance(config, Config) else config
    resource = Resource.create({"service.name": tracing.otlp.service_name})
    provider = TracerProvider(resource=resource)
    processor = BoundedSpanProcessor(
        exporter if exporter is not None else make_otlp_exporter(tracing),
        max_queue_size=max_queue_size,
    )
    provider.add_span_processor(processor)
    provider.adaptive_lb_processor = processor  # type: ignore[attr-defined]
    return provider
