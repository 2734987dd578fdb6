"""One CLIENT span per request, by the OpenTelemetry conventions for database clients, and
the ``db.client.operation.duration`` histogram.

Request tracking (:mod:`adaptive_lb.runtime.tracking`) already sees every attempt of every request:
the first try, retries, speculative executions, and the end (result, error or client-side
timeout). :class:`RequestTelemetry` turns that into:

* a span ``{db.operation.name} {db.collection.name or db.namespace}`` (e.g. ``SELECT
  users``) of kind CLIENT from the query plan (the driver's first step for a request: the
  plan's start comes with its decision) to the final answer, with the conventions'
  attributes (``db.system.name``, ``db.namespace``, ``server.address`` / ``server.port``
  of the coordinator that answered, ``cassandra.consistency.level``,
  ``cassandra.coordinator.id`` / ``.dc``, ``cassandra.speculative_execution.count``,
  ``cassandra.query.idempotent``, ``cassandra.page.size``, ``db.response.status_code``,
  ``error.type``), the plan's decision as its own attributes (``adaptive_lb.position``,
  ``adaptive_lb.candidates``...), and one ``adaptive_lb.attempt`` event per attempt
  (host, kind, outcome, latency) unless the request was answered at its first attempt.
  Every attribute known at the start is given to ``start_span`` in one mapping (the SDK
  validates each one: ~5k instructions); the end adds only what changed (another
  coordinator, a speculative execution, an error);
* one ``db.client.operation.duration`` measurement (seconds) per request, when
  OpenTelemetry metrics are on.

A span is made when a span is recording in the caller's context (the application's, or the
one ``opentelemetry-instrumentation-cassandra`` opens around ``execute_async``: see
:func:`~adaptive_lb.telemetry.span_attributes.adopt_instrumentation_span`), or for every request
when adaptive-lb has a tracer provider of its own (built from YAML, passed to
:func:`adaptive_lb.attach`, or a recording global one set before it). When nothing records
and the histogram is off, the cost is one context lookup per request.

The span's name and attributes, and what privacy allows in them, are
:mod:`adaptive_lb.telemetry.span_attributes`'.

May import: request tracking (:mod:`adaptive_lb.runtime.tracking`, whose attempts it extends), the
span attributes, decision tracing, the config, the OpenTelemetry API, the driver's
exception and message classes.
"""

from __future__ import annotations

from time import time_ns
from typing import Any

from cassandra import OperationTimedOut
from cassandra.protocol import ErrorMessage, ResultMessage
from opentelemetry import metrics, trace
from opentelemetry.trace import SpanKind, Status, StatusCode

from adaptive_lb.config import Config, PrivacyConfig
from adaptive_lb.core.counting import counter_value, new_counter
from adaptive_lb.runtime.attempts import SUCCESS, Attempts, outcome_of
from adaptive_lb.telemetry.span_attributes import (
    INSTRUMENTATION_SCOPE,
    Described,
    StatementAttributes,
    adopt_instrumentation_span,
    coordinator_attributes,
    operation_name,
    qualified_name,
    server_attributes,
)
from adaptive_lb.telemetry.tracing import Pending, current_recording_span

__all__ = [
    "ATTEMPT_EVENT",
    "DURATION_BUCKETS",
    "DURATION_METRIC",
    "INSTRUMENTATION_SCOPE",
    "RequestTelemetry",
    "operation_name",
]

ATTEMPT_EVENT = "adaptive_lb.attempt"
DURATION_METRIC = "db.client.operation.duration"
DURATION_BUCKETS = (0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1.0, 5.0, 10.0)
"""The conventions' advisory bucket boundaries for ``db.client.operation.duration``."""


class _Request:
    """What a recorded request has seen so far."""

    __slots__ = (
        "answered_by",
        "attempts",
        "chosen",
        "duration_attributes",
        "kinds",
        "last_status_code",
        "sends",
        "span",
        "speculative",
        "start_ns",
    )

    def __init__(
        self, span: Any | None, start_ns: int, duration_attributes: dict[str, Any], chosen: Any
    ):
        self.span = span
        self.start_ns = start_ns
        self.duration_attributes = duration_attributes
        self.chosen = chosen
        """The host the span names as its coordinator since its start (None: none)."""
        self.sends = new_counter()
        self.speculative = new_counter()
        self.kinds: dict[int, tuple[int, str, Any]] = {}
        """``id(host) -> (attempt number, kind, host)``."""
        self.attempts: list[tuple[int, Any, str, float | None, str | None]] = []
        """Ended attempts: ``(time_ns, host, outcome, latency, status code)``, added to
        the span as events at its end."""
        self.answered_by: Any | None = None
        self.last_status_code: str | None = None


class _ObservedAttempts(Attempts):
    """The attempts of a request that is recorded: tracking as for any request, plus the
    span's events and attributes and the duration measurement. With :attr:`tracked` false
    (request tracking's sampler left the request out), the attempts are followed for the
    span only: no host statistics."""

    __slots__ = ("request", "telemetry", "tracked")

    request: _Request | None
    telemetry: RequestTelemetry
    tracked: bool

    def __bool__(self) -> bool:
        # The driver's hook calls ended() only on a truthy attempts object: this one must
        # hear the end of its request even with no attempt outstanding.
        return self.request is not None or len(self) > 0

    # Tracking first and always; the span's part is guarded: an exception there is counted
    # (stage "tracing") and never reaches the driver's callback.

    def sent(self, host: Any) -> None:
        request = self.request
        if request is not None:
            try:
                number = next(request.sends)
                if number == 0:
                    kind = "first"
                elif len(self):  # another attempt still outstanding: the driver raced it
                    kind = "speculative"
                    next(request.speculative)
                else:
                    kind = "retry"
                request.kinds[id(host)] = (number + 1, kind, host)
            except Exception:
                self._failed()
        if self.tracked:
            Attempts.sent(self, host)
        else:
            self[id(host)] = (None, self.policy.now_ns())  # type: ignore[assignment]

    def not_sent(self, host: Any) -> None:
        request = self.request
        if request is not None and id(host) in self:
            try:
                self._event(request, host, "not_sent", None, None)
            except Exception:
                self._failed()
        if self.tracked:
            Attempts.not_sent(self, host)
        else:
            self.pop(id(host), None)

    def answered(self, host: Any, response: Any) -> None:
        request = self.request
        entry = self.get(id(host)) if request is not None else None
        if self.tracked:
            Attempts.answered(self, host, response)
        else:
            self.pop(id(host), None)
        if request is None or entry is None:
            return
        try:
            status_code = None
            if type(response) is ResultMessage:  # the common case, without a call
                outcome = SUCCESS
            else:
                outcome = outcome_of(response)
                if isinstance(response, ErrorMessage):
                    code = getattr(response, "error_code", None)
                    status_code = str(code) if code is not None else None
            latency = (self.policy.now_ns() - entry[1]) / 1e9
            request.answered_by = host
            request.last_status_code = None if outcome == SUCCESS else status_code
            self._event(request, host, outcome, latency, status_code)
        except Exception:
            self._failed()

    def ended(self, exception: BaseException | None) -> None:
        request = self.request
        if request is not None:
            try:
                now = self.policy.now_ns()
                lost = (
                    "client_timeout" if isinstance(exception, OperationTimedOut) else "superseded"
                )
                for key, (_stats, sent_ns) in list(self.items()):
                    sent = request.kinds.get(key)
                    if sent is not None:
                        self._event(request, sent[2], lost, (now - sent_ns) / 1e9, None)
            except Exception:
                self._failed()
        if self.tracked:
            Attempts.ended(self, exception)
        else:
            self.clear()
        if request is not None:
            self.request = None  # later pages of a paged result are not part of this span
            try:
                self.telemetry.finish(request, self.policy, exception)
            except Exception:
                self._failed()

    def _failed(self) -> None:
        self.policy.record_error("tracing", "this request's span goes without it")

    def _event(
        self,
        request: _Request,
        host: Any,
        outcome: str,
        latency: float | None,
        status_code: str | None,
    ) -> None:
        if request.span is not None:
            request.attempts.append((time_ns(), host, outcome, latency, status_code))


def _attempt_events(span: Any, request: _Request) -> None:
    # One adaptive_lb.attempt event per ended attempt, at the time it ended; none for a
    # request answered at its first attempt (the span is that attempt).
    attempts = request.attempts
    if len(attempts) == 1 and attempts[0][2] == SUCCESS and len(request.kinds) == 1:
        return
    kinds = request.kinds
    for at_ns, host, outcome, latency, status_code in attempts:
        number, kind, _host = kinds.get(id(host), (0, "unknown", host))
        attributes: dict[str, Any] = {
            **server_attributes(host),
            "adaptive_lb.attempt.number": number,
            "adaptive_lb.attempt.kind": kind,
            "adaptive_lb.attempt.outcome": outcome,
        }
        if latency is not None:
            attributes["adaptive_lb.attempt.duration"] = round(latency, 6)
        if status_code is not None:
            attributes["db.response.status_code"] = status_code
        span.add_event(ATTEMPT_EVENT, attributes, at_ns)


class RequestTelemetry:
    """Makes request spans and records ``db.client.operation.duration`` for the requests
    of one session (:func:`adaptive_lb.attach` sets it on the session's tracker).

    :param config: ``tracing.enabled`` and ``tracing.request_spans`` turn the spans on,
        ``metrics.otel_enabled`` the histogram; ``privacy`` says what may be recorded.
    :param tracer_provider: where spans go (default: the global provider).
    :param meter_provider: where the histogram goes (default: the global provider).
    :param root_spans: make a span for requests made outside any recording span too (true
        when adaptive-lb has a recording tracer provider of its own).
    """

    def __init__(
        self,
        config: Config,
        *,
        tracer_provider: Any | None = None,
        meter_provider: Any | None = None,
        root_spans: bool = False,
    ) -> None:
        self._tracer = trace.get_tracer("adaptive_lb", tracer_provider=tracer_provider)
        meter = metrics.get_meter("adaptive_lb", meter_provider=meter_provider)
        self._histogram = meter.create_histogram(
            DURATION_METRIC,
            unit="s",
            description="Duration of database client operations (each request, retries "
            "and speculative executions included), as measured by adaptive-lb.",
            explicit_bucket_boundaries_advisory=list(DURATION_BUCKETS),
        )
        self._root_spans = root_spans
        self.spans = False
        """Request spans are on (made when a span records, or always with root spans)."""
        self.durations = False
        """``db.client.operation.duration`` is recorded."""
        self.every_request = False
        """Every request is observed (root spans or durations): no per-request check."""
        self.privacy = PrivacyConfig()
        self.configure(config)

    def configure(self, config: Config) -> None:
        """Apply ``config`` (at attach, and on each reload)."""
        self.spans = config.tracing.enabled and config.tracing.request_spans
        self.durations = config.metrics.otel_enabled
        self.every_request = self.durations or (self.spans and self._root_spans)
        self.privacy = config.privacy
        self._statements = StatementAttributes(config.privacy)
        self._hosts: dict[int, tuple[Any, Any, dict[str, Any]]] = {}

    @property
    def root_spans(self) -> bool:
        """Spans are made for requests outside any recording span too."""
        return self._root_spans and self.spans

    def observe(self, future: Any, policy: Any) -> _ObservedAttempts | None:
        """The attempts object recording ``future`` (a request just created, not yet
        sent), or None when there is nothing to record (then plain tracking is used)."""
        parent = None
        if self.spans:
            parent = current_recording_span()
            if parent is None and not self._root_spans and not self.durations:
                return None
        elif not self.durations:
            return None
        query = future.query
        described = self._statements.describe(query, future.session, future.message)
        span = chosen = None
        if self.spans and (parent is not None or self._root_spans):
            plan = policy.decisions.take(query)  # made just before: the span starts there
            span, chosen = self._start_span(described, parent, plan, policy.decisions)
        attempts = _ObservedAttempts()
        attempts.policy = policy
        attempts.telemetry = self
        attempts.tracked = True
        attempts.request = _Request(span, policy.now_ns(), described[1], chosen)
        return attempts

    def _start_span(
        self, described: Described, parent: Any | None, plan: Pending | None, decisions: Any
    ) -> tuple[Any | None, Any | None]:
        # One SDK call with every attribute known at the start: the request's, the
        # decision's, and the chosen host as coordinator until another one answers.
        name, _duration_attributes, attributes = described
        chosen = start_time = decision = None
        if plan is not None:
            start_time = plan[3]
            decision = decisions.request_attributes(plan)
        if decision is not None:
            chosen = plan[1].host  # type: ignore[index,union-attr]
            if chosen is not None:
                attributes = {**attributes, **decision, **self._host(chosen)}
            else:
                attributes = {**attributes, **decision}
        if parent is not None:
            adopt_instrumentation_span(parent)
        span = self._tracer.start_span(
            name, kind=SpanKind.CLIENT, attributes=attributes, start_time=start_time
        )
        if not span.is_recording():
            return None, None
        if plan is not None and plan[2]:
            decisions.record_events(span, plan)
        return span, chosen

    def finish(self, request: _Request, policy: Any, exception: BaseException | None) -> None:
        """End ``request``'s span and record its duration (called once, at its end)."""
        duration = (policy.now_ns() - request.start_ns) / 1e9
        coordinator = request.answered_by
        failure: dict[str, Any] = {}
        if exception is not None:
            failure["error.type"] = request.last_status_code or qualified_name(exception)
            if request.last_status_code is not None:
                failure["db.response.status_code"] = request.last_status_code
        span = request.span
        if span is not None:
            try:
                _attempt_events(span, request)
            except Exception:
                self._failed(policy)
            # Only what the start did not say: usually nothing.
            attributes: dict[str, Any] = {}
            speculative = counter_value(request.speculative)
            if speculative:  # the conventions: "not set or 0" without one
                attributes["cassandra.speculative_execution.count"] = speculative
            if coordinator is not None and coordinator is not request.chosen:
                attributes.update(self._host(coordinator))
            if failure:
                attributes.update(failure)
                span.set_status(Status(StatusCode.ERROR, qualified_name(exception)))
            if attributes:
                span.set_attributes(attributes)
            span.end()
        if self.durations:
            server = server_attributes(coordinator) if coordinator is not None else {}
            self._histogram.record(duration, {**request.duration_attributes, **server, **failure})

    def _host(self, host: Any) -> dict[str, Any]:
        # server.* and cassandra.coordinator.* of a host, built once per host (and host id).
        hosts = self._hosts
        known = hosts.get(id(host))
        host_id = getattr(host, "host_id", None)
        if known is not None and known[0] is host and known[1] is host_id:
            return known[2]
        attributes = {**server_attributes(host), **coordinator_attributes(host)}
        if len(hosts) >= 1024:
            hosts.clear()
        hosts[id(host)] = (host, host_id, attributes)
        return attributes

    @staticmethod
    def _failed(policy: Any) -> None:
        policy.record_error("tracing", "this request's span goes without its attempts")
