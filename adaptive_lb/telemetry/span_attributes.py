"""What a request span says about its request, by the OpenTelemetry semantic conventions for
database clients: the span's name and attributes, read from the statement, the message the
driver sends and the host that answered.

:mod:`adaptive_lb.runtime.request_spans` makes the spans and decides when; this module only names
things. Privacy: the operation name is the statement's first keyword only (``SELECT``...);
the statement text (``db.query.text``) and bound values (``db.query.parameter.<n>``, hex of
the serialized value) only when :class:`~adaptive_lb.config.PrivacyConfig` allows them.

May import: the driver's public constants (``ConsistencyLevel``) and the config model;
nothing else of adaptive-lb.
"""

from __future__ import annotations

from typing import Any

from cassandra import ConsistencyLevel

from adaptive_lb.config import PrivacyConfig

__all__ = [
    "INSTRUMENTATION_SCOPE",
    "StatementAttributes",
    "adopt_instrumentation_span",
    "coordinator_attributes",
    "describe_request",
    "operation_name",
    "qualified_name",
    "request_attributes",
    "server_attributes",
]

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


def request_attributes(query: Any, session: Any) -> dict[str, Any]:
    """The attributes every request has, on its span and on its duration measurement:
    ``db.system.name``, ``db.namespace`` (the statement's keyspace, else ``session``'s)
    and ``db.operation.name`` (:func:`operation_name`), when known."""
    attributes: dict[str, Any] = {"db.system.name": "cassandra"}
    keyspace = getattr(query, "keyspace", None) or session.keyspace
    if keyspace:
        attributes["db.namespace"] = keyspace
    operation = operation_name(query)
    if operation is not None:
        attributes["db.operation.name"] = operation
    return attributes


def describe_request(
    query: Any, message: Any, attributes: dict[str, Any], privacy: PrivacyConfig
) -> str:
    """Add the span-only attributes of a request to ``attributes`` (its
    :func:`request_attributes`): table, consistency, idempotence, page size, and the text
    and bound values as ``privacy`` allows; return the span's name,
    ``{db.operation.name} {db.collection.name or db.namespace}`` (e.g. ``SELECT users``)."""
    operation = attributes.get("db.operation.name")
    table = _table_of(query)
    if table is not None:
        attributes["db.collection.name"] = table
    level = _consistency_name(getattr(message, "consistency_level", None))
    if level is not None:
        attributes["cassandra.consistency.level"] = level
    idempotent = getattr(query, "is_idempotent", None)
    if idempotent is not None:
        attributes["cassandra.query.idempotent"] = bool(idempotent)
    fetch_size = getattr(message, "fetch_size", None)
    if isinstance(fetch_size, int) and fetch_size > 0:
        attributes["cassandra.page.size"] = fetch_size
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
    return name


Described = tuple[str, dict[str, Any], dict[str, Any]]
"""A request described: ``(span name, its duration attributes, its span attributes)``."""


class StatementAttributes:
    """The name and attributes of requests, built once per prepared statement (and
    consistency, page size, idempotence and keyspace) and reused: a bound statement's
    request reads them from here. Simple statements, and every statement when
    ``privacy.bound_values`` puts its values on the span, are described afresh. Callers
    never modify the dicts returned."""

    LIMIT = 512
    """Prepared statements remembered; the memo is emptied when it holds more."""

    def __init__(self, privacy: PrivacyConfig) -> None:
        self.privacy = privacy
        self._memo: dict[int, tuple[Any, tuple[Any, ...], Described]] = {}

    def describe(self, query: Any, session: Any, message: Any) -> Described:
        """``(name, duration attributes, span attributes)`` of a request of ``query``."""
        prepared = getattr(query, "prepared_statement", None)
        if prepared is None or self.privacy.bound_values:
            return self._build(query, session, message)
        signature = (
            getattr(message, "consistency_level", None),
            getattr(message, "fetch_size", None),
            getattr(query, "is_idempotent", None),
            getattr(query, "keyspace", None) or session.keyspace,
        )
        memo = self._memo
        known = memo.get(id(prepared))
        # The statement itself is kept in the entry: its id is not reused while it lives.
        if known is not None and known[0] is prepared and known[1] == signature:
            return known[2]
        described = self._build(query, session, message)
        if len(memo) >= self.LIMIT:
            memo.clear()
        memo[id(prepared)] = (prepared, signature, described)
        return described

    def _build(self, query: Any, session: Any, message: Any) -> Described:
        duration_attributes = request_attributes(query, session)
        span_attributes = dict(duration_attributes)
        name = describe_request(query, message, span_attributes, self.privacy)
        return name, duration_attributes, span_attributes


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


def server_attributes(host: Any) -> dict[str, Any]:
    """``server.address`` and ``server.port`` of ``host``."""
    attributes: dict[str, Any] = {"server.address": str(host.address)}
    port = getattr(host.endpoint, "port", None)
    if port is not None:
        attributes["server.port"] = port
    return attributes


def coordinator_attributes(host: Any) -> dict[str, Any]:
    """``cassandra.coordinator.id`` and ``.dc`` of ``host``, when known."""
    attributes: dict[str, Any] = {}
    host_id = getattr(host, "host_id", None)
    if host_id is not None:
        attributes["cassandra.coordinator.id"] = str(host_id)
    if host.datacenter is not None:
        attributes["cassandra.coordinator.dc"] = host.datacenter
    return attributes


def qualified_name(exception: BaseException | None) -> str:
    """``error.type`` of ``exception``: its class's qualified name, with its module unless
    it is a builtin."""
    kind = type(exception)
    module = kind.__module__
    return kind.__qualname__ if module == "builtins" else f"{module}.{kind.__qualname__}"


def adopt_instrumentation_span(parent: Any) -> None:
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
