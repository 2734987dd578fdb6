"""Helpers of ``benchmarks/e2e_overhead.py`` and ``e2e_instructions.py`` for the variants
that trace every request: an SDK tracer provider exporting in batches to an exporter that
drops (and counts) the spans, the stock instrumentation (opentelemetry-instrumentation-
cassandra) bound to one session, and the configs of adaptive-lb's traced variants. Not a
public module; nothing here changes the library.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

TRACED = {
    "stock-instr": "stock + opentelemetry-instrumentation-cassandra: its span around every "
    "execute_async (SDK TracerProvider, BatchSpanProcessor to a dropping exporter)",
    "adaptive-traced": "adaptive-lb attach(session, tracer_provider=tp), defaults: a request "
    "span per request with its decision (same provider as stock-instr)",
    "adaptive-traced-brief": "adaptive-traced with tracing.candidates_ratio 0: every span "
    "names the chosen host and why, no candidate list",
    "adaptive-traced-nodecision": "adaptive-traced with tracing.ratio 0: the request span, no "
    "decision on it",
}
"""The traced variants (every request traced), by name."""

CONFIGS = {
    "adaptive-traced": {},
    "adaptive-traced-brief": {"candidates_ratio": 0.0},
    "adaptive-traced-nodecision": {"ratio": 0.0},
}


def batch_provider() -> tuple[Any, Any]:
    """An SDK TracerProvider (sampling everything) with a BatchSpanProcessor whose exporter
    counts and drops the spans (and, while ``inspect`` is on, counts those with a decision).
    Returns (provider, exporter)."""
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter, SpanExportResult

    from adaptive_lb.telemetry.tracing import EVENT_NAME

    def decision_shown(span: Any) -> bool:  # as an event, or as the request span's own
        attributes = span.attributes or {}
        return "adaptive_lb.position" in attributes or any(
            e.name == EVENT_NAME for e in span.events
        )

    class CountingExporter(SpanExporter):
        def __init__(self) -> None:
            self.spans = 0
            self.inspect = False
            self.inspected = 0
            self.with_decision = 0

        def export(self, spans: Sequence[Any]) -> SpanExportResult:
            self.spans += len(spans)
            if self.inspect:
                for span in spans:
                    self.inspected += 1
                    self.with_decision += decision_shown(span)
            return SpanExportResult.SUCCESS

        def shutdown(self) -> None:
            pass

    exporter = CountingExporter()
    provider = TracerProvider()
    provider.add_span_processor(BatchSpanProcessor(exporter, max_queue_size=1 << 16))
    return provider, exporter


def instrument_session(session: Any, provider: Any) -> None:
    """Give ``session`` (only) the span opentelemetry-instrumentation-cassandra puts around
    ``execute_async``, on ``provider``: instrument the class, bind its wrapper to this
    session, uninstrument the class (the other variants of the run stay untouched)."""
    import cassandra.cluster
    from opentelemetry.instrumentation.cassandra import CassandraInstrumentor

    instrumentor = CassandraInstrumentor()
    instrumentor.instrument(tracer_provider=provider)
    try:
        wrapper = cassandra.cluster.Session.__dict__["execute_async"]
        session.execute_async = wrapper.__get__(session, type(session))
    finally:
        instrumentor.uninstrument()


def config_of(name: str) -> Any:
    """The config of an adaptive traced variant."""
    import attrs

    from adaptive_lb.config import Config

    config = Config()
    return attrs.evolve(config, tracing=attrs.evolve(config.tracing, **CONFIGS[name]))
