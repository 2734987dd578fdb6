"""Decision traces of a simulated run, sent over OTLP so Jaeger can show them.

``adaptive-lb demo --otlp-endpoint URL`` (and ``simulate``) traces a sample of each run's
measured requests: one span per request (scenario, policy, client, outcome, attempts) on
which adaptive-lb's policy records its decision event, exactly as it does on an
application's span in production. The simulator runs in virtual time, so every timestamp
is mapped to real time: ``epoch_ns`` (the wall clock when the demo started) + the virtual
nanoseconds since the simulation began. Runs of one demo therefore line up side by side in
Jaeger, each lasting as long as it did in virtual time.

No routing-key bytes leave the process: requests carry the partition's index, not its key.

Imports attrs, the OpenTelemetry API, the library's clock and config; the exporters on first
use.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

from attrs import define, field
from opentelemetry import trace

from adaptive_lb.config import OtlpConfig, TracingConfig
from adaptive_lb.core.clock import Clock

__all__ = ["RequestTracer", "TraceSpec", "VirtualTimeSpan", "start_provider"]

SERVICE_NAME = "adaptive-lb-sim"
OUTCOMES = ("succeeded", "failed", "timed_out")
"""Span attribute values of the workload's request statuses (0, 1, 2)."""


@define(frozen=True, slots=True)
class TraceSpec:
    """What to trace in a simulated run, and where to send it."""

    endpoint: str
    """OTLP receiver, e.g. http://127.0.0.1:4318 (OTLP/HTTP) or http://127.0.0.1:4317."""
    epoch_ns: int
    """Wall-clock nanoseconds that virtual time 0 maps to."""
    requests: int = field(default=100)
    """Measured requests traced per (scenario, policy) run, evenly spread."""
    protocol: str = "http"
    """``http`` or ``grpc``."""


def start_provider(spec: TraceSpec) -> Any:
    """A TracerProvider exporting to ``spec.endpoint`` through adaptive-lb's bounded,
    never-blocking processor. Call ``shutdown()`` on it at the end of the run (it flushes)."""
    from adaptive_lb.exporters import setup_tracing

    otlp = OtlpConfig(endpoint=spec.endpoint, protocol=spec.protocol, service_name=SERVICE_NAME)
    return setup_tracing(TracingConfig(otlp=otlp), max_queue_size=max(2048, 4 * spec.requests))


class VirtualTimeSpan(trace.Span):
    """A recording span whose events without a timestamp get the *virtual* time of the
    simulation (mapped to real time), so the decision event adaptive-lb adds lands inside
    the request's span. Everything else is passed to the wrapped SDK span."""

    def __init__(self, span: Any, now_ns: Any) -> None:
        self._span = span
        self._now_ns = now_ns

    def add_event(self, name: str, attributes: Any = None, timestamp: int | None = None) -> None:
        """Add an event at ``timestamp``, by default the current virtual time."""
        self._span.add_event(name, attributes, self._now_ns() if timestamp is None else timestamp)

    def end(self, end_time: int | None = None) -> None:
        """End the wrapped span (at the current virtual time by default)."""
        self._span.end(self._now_ns() if end_time is None else end_time)

    def get_span_context(self) -> Any:
        """The wrapped span's context."""
        return self._span.get_span_context()

    def set_attributes(self, attributes: Any) -> None:
        """Set attributes on the wrapped span."""
        self._span.set_attributes(attributes)

    def set_attribute(self, key: str, value: Any) -> None:
        """Set one attribute on the wrapped span."""
        self._span.set_attribute(key, value)

    def update_name(self, name: str) -> None:
        """Rename the wrapped span."""
        self._span.update_name(name)

    def is_recording(self) -> bool:
        """Whether the wrapped span records."""
        return self._span.is_recording()

    def set_status(self, status: Any, description: str | None = None) -> None:
        """Set the wrapped span's status."""
        self._span.set_status(status, description)

    def record_exception(self, exception: BaseException, *args: Any, **kwargs: Any) -> None:
        """Record an exception on the wrapped span."""
        self._span.record_exception(exception, *args, **kwargs)


class RequestTracer:
    """Traces every ``stride``-th measured request of one (scenario, policy) run."""

    def __init__(
        self,
        provider: Any,
        spec: TraceSpec,
        *,
        scenario: str,
        policy: str,
        clock: Clock,
        expected_requests: int,
    ) -> None:
        self._tracer = provider.get_tracer("adaptive_lb.sim")
        self._epoch_ns = spec.epoch_ns
        self._clock = clock
        self._stride = max(1, expected_requests // max(1, spec.requests))
        self._budget = spec.requests
        self._seen = 0
        self._name = f"{scenario} / {policy}"
        self._attributes = {
            "adaptive_lb.sim.scenario": scenario,
            "adaptive_lb.sim.policy": policy,
        }
        self.traced = 0

    def now_ns(self) -> int:
        """The current virtual time, as real (epoch) nanoseconds."""
        return self._epoch_ns + self._clock.now_ns()

    @contextlib.contextmanager
    def planning(self, request: Any, client: Any) -> Iterator[None]:
        """Around the policy's ``make_query_plan`` for ``request``: a span current if this
        request is sampled (kept on ``request.span`` until :meth:`finish`)."""
        if not request.measured or self.traced >= self._budget:
            yield
            return
        self._seen += 1
        if (self._seen - 1) % self._stride:
            yield
            return
        span = self._tracer.start_span(
            self._name,
            start_time=self.now_ns(),
            attributes={
                **self._attributes,
                "adaptive_lb.sim.client": client.name,
                "adaptive_lb.sim.zone": client.zone,
                "adaptive_lb.sim.partition": request.key,
            },
        )
        request.span = span
        self.traced += 1
        with trace.use_span(VirtualTimeSpan(span, self.now_ns), end_on_exit=False):
            yield

    def finish(self, request: Any, status: int, coordinator: str | None) -> None:
        """End ``request``'s span, if it has one, with its outcome."""
        span = request.span
        if span is None:
            return
        request.span = None
        span.set_attribute("adaptive_lb.sim.outcome", OUTCOMES[status])
        span.set_attribute("adaptive_lb.sim.attempts", request.attempts)
        span.set_attribute("adaptive_lb.sim.cross_zone", request.crossed)
        if coordinator is not None:
            span.set_attribute("server.address", coordinator)
        span.end(end_time=self.now_ns())
