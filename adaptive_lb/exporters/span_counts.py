"""Process-wide counts of the spans sent over OTLP, or dropped on the way.

Written by the OTLP span processor and the backoff exporter (which need the OpenTelemetry
SDK), read by the Prometheus collector and the OpenTelemetry instruments (which must not):
this module imports neither the SDK nor anything that does, so the metrics endpoints work
on the core install alone. Until :func:`~adaptive_lb.exporters.setup_tracing` made a
processor or exporter there is nothing to report (:func:`span_export_totals` is None).

Imports attrs only.
"""

from __future__ import annotations

import threading

from attrs import define

__all__ = ["DROP_REASONS", "ExportCounts", "SpanExportTotals", "span_export_totals"]

DROP_REASONS = ("queue_full", "export_failed", "backoff", "shutdown")
"""The ``reason`` label values of ``adaptive_lb_trace_spans_dropped_total``."""


@define(frozen=True, slots=True)
class SpanExportTotals:
    """Spans handled by every span processor and backoff exporter that
    :func:`~adaptive_lb.exporters.setup_tracing` made in this process, since start."""

    exported: int
    queue_full: int
    """Dropped on arrival: the queue was full (receiver down, slow or hung)."""
    export_failed: int
    """Dropped after the exporter failed (refused, timed out, raised)."""
    shutdown: int
    """Still queued when the processor shut down, or ended after it did."""
    backoff: int = 0
    """Dropped without an export attempt (never encoded, never sent): the exporter was
    backing off after a failure."""

    @property
    def dropped(self) -> int:
        """Every span that never reached a receiver."""
        return self.queue_full + self.export_failed + self.shutdown + self.backoff


@define(frozen=True, slots=True)
class ExportCounts:
    """What became of the spans of one batch handed to an exporter (names as in
    :class:`SpanExportTotals`)."""

    exported: int = 0
    export_failed: int = 0
    backoff: int = 0
    shutdown: int = 0


class _Totals:
    """Process-wide counters (they outlive processors, so they never go down)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.sources = 0
        """Processors and backoff exporters created so far (0: nothing to report)."""
        self.counts = dict.fromkeys(("exported", *DROP_REASONS), 0)

    def register(self) -> None:
        """A processor or exporter that will count here was created."""
        with self.lock:
            self.sources += 1

    def add(self, kind: str, count: int = 1) -> None:
        """Count ``count`` spans as ``kind`` (``exported`` or a drop reason)."""
        if count:
            with self.lock:
                self.counts[kind] += count

    def add_counts(self, counts: ExportCounts) -> None:
        """Count one batch's outcome."""
        with self.lock:
            self.counts["exported"] += counts.exported
            self.counts["export_failed"] += counts.export_failed
            self.counts["backoff"] += counts.backoff
            self.counts["shutdown"] += counts.shutdown


TOTALS = _Totals()
"""The process's counters (internal: written by the OTLP modules)."""


def span_export_totals() -> SpanExportTotals | None:
    """The process-wide span counts, or None while no span processor or backoff exporter
    was ever created (tracing goes elsewhere, or nowhere: there is nothing to report)."""
    with TOTALS.lock:
        if not TOTALS.sources:
            return None
        return SpanExportTotals(**TOTALS.counts)
