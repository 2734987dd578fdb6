"""One CLIENT span per request, by the OpenTelemetry conventions for database clients, and
the ``db.client.operation.duration`` histogram.

Request tracking (:mod:`adaptive_lb.tracking`) already sees every attempt of every request:
the first try, retries, speculative executions, and the end (result, error or client-side
timeout). :class:`RequestTelemetry` turns that into:

* a span ``{db.operation.name} {db.collection.name or db.namespace}`` (e.g. ``SELECT
  users``) of kind CLIENT from the query plan (the driver's first step for a request: the
  plan's start comes with its decision) to the final answer, with the conventions'
  attributes (``db.system.name``, ``db.namespace``, ``server.address`` / ``server.port``
  of the coordinator that answered, ``cassandra.consistency.level``,
  ``cassandra.coordinator.id`` / ``.dc``, ``cassandra.speculative_execution.count``,
  ``cassandra.query.idempotent``, ``cassandra.page.size``, ``db.response.status_code``,
  ``error.type``), one ``adaptive_lb.attempt`` event per attempt (host, kind, outcome,
  latency) and the ``adaptive_lb.decision`` event of the plan;
* one ``db.client.operation.duration`` measurement (seconds) per request, when
  OpenTelemetry metrics are on.

A span is made when a span is recording in the caller's context (the application's, or the
one ``opentelemetry-instrumentation-cassandra`` opens around ``execute_async``: see
:func:`_adopt_instrumentation_span`), or for every request when adaptive-lb has a tracer
provider of its own (built from YAML, passed to :func:`adaptive_lb.attach`, or a recording
global one set before it). When nothing records and the histogram is off, the cost is one
context lookup per request.

Privacy: the operation name is the statement's first keyword only (``SELECT``...); the
statement text (``db.query.text``) and bound values (``db.query.parameter.<n>``, hex of the
serialized value) only when :class:`~adaptive_lb.config.PrivacyConfig` allows them.
"""

from __future__ import annotations

from typing import Any

from cassandra import ConsistencyLevel, OperationTimedOut
from cassandra.protocol import ErrorMessage
from opentelemetry import metrics, trace
from opentelemetry.trace import SpanKind, Status, StatusCode

from adaptive_lb.config import Config, PrivacyConfig
from adaptive_lb.counting import counter_value, new_counter
from adaptive_lb.tracing import current_recording_span
from adaptive_lb.tracking import SUCCESS, _Attempts, outcome_of

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
INSTRUMENTATION_SCOPE = "opentelemetry.instrumentation.cassandra"
"""The tracer name of ``opentelemetry-instrumentation-cassandra``."""

_OPERATIONS = frozenset(
    {
        "SELECT",
        "INSERT",
        "UPDATE",
        "DELETE",
        "BATCH",
        "TRUNCATE",
        "CREATE",
        "ALTER",
        "DROP",
        "USE",
        "GRANT",
        "REVOKE",
        "LIST",
    }
)


def operation_name(statement: Any) -> str | None:
    """The CQL operation of ``statement``: its first keyword when it is one of the known
    ones (``BEGIN ... BATCH`` and ``BatchStatement`` are ``BATCH``), else None. Nothing
    else of the text is read."""
    if type(statement).__name__ == "BatchStatement":
        return "BATCH"
    text = getattr(statement, "query_string", None)
    if text is None:
        prepared = getattr(statement, "prepared_statement", None)
        text = getattr(prepared, "query_string", None)
    if not isinstance(text, str):
        return None
    words = text[:64].split(None, 1)
    if not words:
        return None
    word = words[0].upper()
    if word == "BEGIN":
        return "BATCH"
    return word if word in _OPERATIONS else None


def _table_of(statement: Any) -> str | None:
    prepared = getattr(statement, "prepared_statement", None)
    if prepared is None:
        return None
    for columns in (prepared.column_metadata, getattr(prepared, "result_metadata", None)):
        if columns:
            tables = {column.table_name for column in columns}
            return tables.pop() if len(tables) == 1 else None
    return None


def _consistency_name(level: Any) -> str | None:
    name = ConsistencyLevel.value_to_name.get(level) if level is not None else None
    return name.lower() if name else None


class _Request:
    """What a recorded request has seen so far."""

    __slots__ = (
        "answered_by",
        "decision_recorded",
        "duration_attributes",
        "kinds",
        "last_status_code",
        "sends",
        "span",
        "speculative",
        "start_ns",
    )

    def __init__(self, span: Any | None, start_ns: int, duration_attributes: dict[str, Any]):
        self.span = span
        self.start_ns = start_ns
        self.duration_attributes = duration_attributes
        self.sends = new_counter()
        self.speculative = new_counter()
        self.kinds: dict[int, tuple[int, str, Any]] = {}
        """``id(host) -> (attempt number, kind, host)``."""
        self.answered_by: Any | None = None
        self.last_status_code: str | None = None
        self.decision_recorded = False


class _ObservedAttempts(_Attempts):
    """The attempts of a request that is recorded: tracking as for any request, plus the
    span's events and attributes and the duration measurement."""

    __slots__ = ("request", "telemetry")

    request: _Request | None
    telemetry: RequestTelemetry

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
        _Attempts.sent(self, host)

    def not_sent(self, host: Any) -> None:
        request = self.request
        if request is not None and id(host) in self:
            try:
                self._event(request, host, "not_sent", None, None)
            except Exception:
                self._failed()
        _Attempts.not_sent(self, host)

    def answered(self, host: Any, response: Any) -> None:
        request = self.request
        entry = self.get(id(host)) if request is not None else None
        _Attempts.answered(self, host, response)
        if request is None or entry is None:
            return
        try:
            outcome = outcome_of(response)
            code = (
                getattr(response, "error_code", None)
                if isinstance(response, ErrorMessage)
                else None
            )
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
        _Attempts.ended(self, exception)
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
        span = request.span
        if span is None:
            return
        number, kind, _host = request.kinds.get(id(host), (0, "unknown", host))
        attributes: dict[str, Any] = {
            **_server_attributes(host),
            "adaptive_lb.attempt.number": number,
            "adaptive_lb.attempt.kind": kind,
            "adaptive_lb.attempt.outcome": outcome,
        }
        if latency is not None:
            attributes["adaptive_lb.attempt.duration"] = round(latency, 6)
        if status_code is not None:
            attributes["db.response.status_code"] = status_code
        span.add_event(ATTEMPT_EVENT, attributes)


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
        attributes: dict[str, Any] = {"db.system.name": "cassandra"}
        keyspace = getattr(query, "keyspace", None) or future.session.keyspace
        if keyspace:
            attributes["db.namespace"] = keyspace
        operation = operation_name(query)
        if operation is not None:
            attributes["db.operation.name"] = operation
        span = plan = None
        if self.spans and (parent is not None or self._root_spans):
            plan = policy.decisions.take(query)  # made just before: the span starts there
            span = self._start_span(future, parent, dict(attributes), plan[3] if plan else None)
        attempts = _ObservedAttempts()
        attempts.policy = policy
        attempts.telemetry = self
        attempts.request = _Request(span, policy.now_ns(), attributes)
        if span is not None and plan is not None:
            policy.decisions.record_taken(span, plan)
        return attempts

    def _start_span(
        self,
        future: Any,
        parent: Any | None,
        attributes: dict[str, Any],
        start_time: int | None,
    ) -> Any | None:
        query = future.query
        operation = attributes.get("db.operation.name")
        table = _table_of(query)
        if table is not None:
            attributes["db.collection.name"] = table
        message = future.message
        level = _consistency_name(getattr(message, "consistency_level", None))
        if level is not None:
            attributes["cassandra.consistency.level"] = level
        idempotent = getattr(query, "is_idempotent", None)
        if idempotent is not None:
            attributes["cassandra.query.idempotent"] = bool(idempotent)
        fetch_size = getattr(message, "fetch_size", None)
        if isinstance(fetch_size, int) and fetch_size > 0:
            attributes["cassandra.page.size"] = fetch_size
        privacy = self.privacy
        if privacy.statement_text:
            text = getattr(query, "query_string", None)
            if text is None:
                text = getattr(getattr(query, "prepared_statement", None), "query_string", None)
            if isinstance(text, str):
                attributes["db.query.text"] = text
        if privacy.bound_values:
            for index, value in enumerate(getattr(query, "values", None) or ()):
                attributes[f"db.query.parameter.{index}"] = (
                    value.hex() if isinstance(value, (bytes, bytearray)) else repr(value)
                )
        name = operation or "cassandra"
        target = table or attributes.get("db.namespace")
        if operation is not None and target:
            name = f"{operation} {target}"
        if parent is not None:
            _adopt_instrumentation_span(parent)
        span = self._tracer.start_span(
            name, kind=SpanKind.CLIENT, attributes=attributes, start_time=start_time
        )
        return span if span.is_recording() else None

    def finish(self, request: _Request, policy: Any, exception: BaseException | None) -> None:
        """End ``request``'s span and record its duration (called once, at its end)."""
        duration = (policy.now_ns() - request.start_ns) / 1e9
        coordinator = request.answered_by
        server = _server_attributes(coordinator) if coordinator is not None else {}
        failure: dict[str, Any] = {}
        if exception is not None:
            failure["error.type"] = request.last_status_code or _qualified_name(exception)
            if request.last_status_code is not None:
                failure["db.response.status_code"] = request.last_status_code
        span = request.span
        if span is not None:
            attributes: dict[str, Any] = {
                "cassandra.speculative_execution.count": counter_value(request.speculative),
                **server,
                **failure,
            }
            if coordinator is not None:
                host_id = getattr(coordinator, "host_id", None)
                if host_id is not None:
                    attributes["cassandra.coordinator.id"] = str(host_id)
                if coordinator.datacenter is not None:
                    attributes["cassandra.coordinator.dc"] = coordinator.datacenter
            if failure:
                span.set_status(Status(StatusCode.ERROR, _qualified_name(exception)))
            span.set_attributes(attributes)
            span.end()
        if self.durations:
            self._histogram.record(duration, {**request.duration_attributes, **server, **failure})


def _server_attributes(host: Any) -> dict[str, Any]:
    """``server.address`` and ``server.port`` of ``host``."""
    attributes: dict[str, Any] = {"server.address": str(host.address)}
    port = getattr(host.endpoint, "port", None)
    if port is not None:
        attributes["server.port"] = port
    return attributes


def _qualified_name(exception: BaseException | None) -> str:
    kind = type(exception)
    module = kind.__module__
    return kind.__qualname__ if module == "builtins" else f"{module}.{kind.__qualname__}"


def _adopt_instrumentation_span(parent: Any) -> None:
    """When the parent is the span of ``opentelemetry-instrumentation-cassandra``, which
    ends when ``execute_async`` returns (the request merely submitted), rename it
    ``<name> submit`` and mark it, so that the request span, its child, is the one span
    that claims to be the request."""
    scope = getattr(parent, "instrumentation_scope", None)
    if scope is None or scope.name != INSTRUMENTATION_SCOPE:
        return
    name = getattr(parent, "name", "")
    if not name.endswith(" submit"):
        parent.update_name(f"{name} submit")
        parent.set_attribute("adaptive_lb.role", "submit")
