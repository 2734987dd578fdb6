"""Security by default: nothing the application would not want shown leaves the process.

* The Prometheus endpoint listens on loopback unless told otherwise.
* Sentinels -- a distinctive routing key, statement text, a bound value and an OTLP header
  value -- are pushed through everything adaptive-lb does (traced plans in both tracing
  modes, request tracking with errors and timeouts, a health refresh, a forced internal
  error, a snapshot, a Prometheus scrape, OTel metrics, reprs, a rejected config and a
  failed reload); none may appear in any span, metric, log record (message, arguments,
  formatted traceback) or exception message.
* With ``privacy.routing_keys: true`` the routing key *does* appear on the decision: the
  sentinel search can fail, and it is shown to.

The sentinels are spelled out only here, at module level, so that no source line quoted in
a traceback carries one.
"""

from __future__ import annotations

import base64
import socket
import traceback
import urllib.request
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from cassandra import ConsistencyLevel, OperationTimedOut
from cassandra.cqltypes import Int32Type, UTF8Type
from cassandra.policies import DCAwareRoundRobinPolicy, TokenAwarePolicy
from cassandra.protocol import (
    ColumnMetadata,
    OverloadedErrorMessage,
    ReadTimeoutErrorMessage,
    ResultMessage,
    SyntaxException,
)
from cassandra.query import PreparedStatement, SimpleStatement
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from prometheus_client import CollectorRegistry, generate_latest

from adaptive_lb import AdaptiveLoadBalancingPolicy, Config
from adaptive_lb.config import (
    ConfigError,
    ConfigWatcher,
    MetricsConfig,
    OtlpConfig,
    PrivacyConfig,
    TracingConfig,
    parse_config,
)
from adaptive_lb.core.clock import ManualClock
from adaptive_lb.exporters import (
    AdaptiveLbCollector,
    register_otel_metrics,
    start_exporters,
    start_prometheus_server,
)
from adaptive_lb.runtime.attempts import Attempts
from adaptive_lb.telemetry.tracing import EVENT_NAME, Decision
from adaptive_lb.tools.sim.driver_topology import ClusterModel, build_cluster

SENTINEL_RK = b"SENTINEL-RK-7f3a"
SENTINEL_CQL = "SENTINEL-CQL-91c2"
SENTINEL_VAL = "SENTINEL-VAL-5d0e"
SENTINEL_HDR = "SENTINEL-HDR-2b8c"

STATEMENT_TEXT = f"SELECT {SENTINEL_CQL} FROM ks.t WHERE k = '{SENTINEL_VAL}'"
PREPARED_TEXT = f"SELECT {SENTINEL_CQL} FROM ks.t WHERE k = ? AND v = ?"

OTLP_YAML = f"""\
tracing:
  mode: {{mode}}
  otlp:
    headers:
      Authorization: "Bearer {SENTINEL_HDR}"
    {{extra}}
"""
"""A config carrying the header sentinel; ``mode`` is the tracing mode, ``extra`` one more
line under ``otlp`` (a bad value next to the header, or nothing)."""

# Documents where the header value itself sits in a rejected value (the validators quote
# the value they reject).
BAD_HEADER_DOCUMENTS = {
    "non-string value beside it": (
        "tracing:\n  otlp:\n    headers:\n"
        f'      Authorization: "Bearer {SENTINEL_HDR}"\n'
        "      X-Retries: 3\n"
    ),
    "headers as a list": (
        f'tracing:\n  otlp:\n    headers: ["Authorization: Bearer {SENTINEL_HDR}"]\n'
    ),
    "nested value": (
        "tracing:\n  otlp:\n    headers:\n"
        f'      Authorization: {{token: "Bearer {SENTINEL_HDR}"}}\n'
    ),
    "non-string key": f'tracing:\n  otlp:\n    headers:\n      3: "Bearer {SENTINEL_HDR}"\n',
}


def forms(sentinel: str | bytes) -> list[str]:
    """Every spelling under which ``sentinel`` could leak, lower-cased: as text, hex,
    base64, and the repr of its bytes."""
    raw = sentinel if isinstance(sentinel, bytes) else sentinel.encode()
    spellings = [raw.decode(), raw.hex(), base64.b64encode(raw).decode(), repr(raw)]
    return [s.lower() for s in spellings]


ALL_SENTINELS = (SENTINEL_RK, SENTINEL_CQL, SENTINEL_VAL, SENTINEL_HDR)


def assert_no_sentinel(texts: dict[str, list[str]], sentinels=ALL_SENTINELS) -> None:
    """No form of any sentinel in any of ``texts`` (``{channel: [text, ...]}``)."""
    leaks = []
    for channel, items in texts.items():
        for text in items:
            lowered = text.lower()
            for sentinel in sentinels:
                for form in forms(sentinel):
                    if form in lowered:
                        leaks.append(f"{channel}: {form!r} in {text[:300]!r}")
    assert not leaks, "\n".join(leaks[:10])


def exception_texts(exc: BaseException) -> list[str]:
    """What an exception shows: its message, its repr, its formatted traceback (chained
    causes included) and, for a ConfigError, each listed error."""
    texts = [str(exc), repr(exc), "".join(traceback.format_exception(exc))]
    texts += list(getattr(exc, "errors", []))
    return texts


def log_texts(records: list[Any]) -> list[str]:
    """Each record's message, arguments and formatted text with its traceback."""
    import logging

    formatter = logging.Formatter("%(name)s %(levelname)s %(message)s")
    texts = []
    for record in records:
        texts += [record.getMessage(), repr(record.args), formatter.format(record)]
        if record.exc_info and record.exc_info[1] is not None:
            texts += exception_texts(record.exc_info[1])
    return texts


def span_texts(exporter: InMemorySpanExporter) -> list[str]:
    """Every finished span as JSON (name, attributes, events, links, status, resource)
    and its attributes' and events' reprs."""
    texts = []
    for span in exporter.get_finished_spans():
        texts.append(span.to_json())
        texts.append(span.name + repr(dict(span.attributes or {})))
        for event in span.events:
            texts.append(event.name + repr(dict(event.attributes or {})))
    return texts


def tracing() -> tuple[TracerProvider, InMemorySpanExporter]:
    """The real OTel SDK with an in-memory exporter."""
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    return provider, exporter


def capture_decisions(policy: AdaptiveLoadBalancingPolicy) -> list[Decision]:
    """Every Decision the policy's tracer records from now on (until the tracer is
    rebuilt by a reload that changes tracing or privacy)."""
    decisions: list[Decision] = []
    tracer = policy.decisions.tracer
    record = tracer.record

    def recording(span: Any, decision: Decision, events: Any = (), made_ns: Any = None) -> None:
        decisions.append(decision)
        record(span, decision, events, made_ns)

    tracer.record = recording
    return decisions


def bound_statement() -> Any:
    """A BoundStatement of a prepared statement (built offline) whose text carries the
    CQL sentinel and whose partition key -- hence routing key -- is the value sentinel."""
    prepared = PreparedStatement(
        column_metadata=[
            ColumnMetadata("ks", "t", "k", UTF8Type),
            ColumnMetadata("ks", "t", "v", Int32Type),
        ],
        query_id=b"\x01\x02\x03",
        routing_key_indexes=[0],
        query=PREPARED_TEXT,
        keyspace="ks",
        protocol_version=4,
        result_metadata=[],
        result_metadata_id=None,
    )
    bound = prepared.bind([SENTINEL_VAL, 7])
    assert bound.routing_key == SENTINEL_VAL.encode()
    return bound


class UnhashableKey(bytes):
    """A routing key the driver hashes but that cannot be a cache key: forces an internal
    error in the plan (the child's plan is used) while carrying the routing-key sentinel."""

    __hash__ = None  # type: ignore[assignment]


def statements() -> list[Any]:
    """Every kind of statement the sentinel run plans for."""
    lwt = SimpleStatement(
        STATEMENT_TEXT,
        routing_key=SENTINEL_RK,
        keyspace="ks",
        consistency_level=ConsistencyLevel.SERIAL,
    )
    return [
        SimpleStatement(STATEMENT_TEXT, routing_key=SENTINEL_RK, keyspace="ks"),
        SimpleStatement(STATEMENT_TEXT, keyspace="ks"),  # no routing key
        bound_statement(),
        lwt,
        SimpleStatement(STATEMENT_TEXT, routing_key=UnhashableKey(SENTINEL_RK), keyspace="ks"),
    ]


def server_responses() -> list[Callable[[], Any]]:
    """Answers a server could give, quoting the statement back (as real servers do)."""
    return [
        lambda: ResultMessage(2),
        lambda: OverloadedErrorMessage(0x1001, f"overloaded running {STATEMENT_TEXT}", None),
        lambda: ReadTimeoutErrorMessage(0x1200, f"timeout: {STATEMENT_TEXT}", {}),
        lambda: SyntaxException(0x2000, f"line 1:7 no viable alternative at {SENTINEL_CQL}", None),
    ]


@pytest.fixture
def model() -> Iterator[ClusterModel]:
    """A real never-connected Cluster: 6 local hosts in 3 racks, 2 remote."""
    built = build_cluster({"dc1": [2, 2, 2], "dc2": [2]}, seed=13)
    yield built
    built.shutdown()


# ---------------------------------------------------------------- the endpoint


def non_loopback_address() -> str | None:
    """An IPv4 address of this machine other than loopback, if it has one (no packet is
    sent: connecting a UDP socket only picks the route)."""
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
            probe.connect(("192.0.2.1", 9))  # TEST-NET-1, never routed anywhere real
            address = probe.getsockname()[0]
    except OSError:
        return None
    return None if address.startswith("127.") or address == "0.0.0.0" else address


def test_prometheus_endpoint_binds_loopback_by_default(model):
    """Guarantee: unless configured otherwise the Prometheus endpoint listens on
    127.0.0.1 only -- ``start_prometheus_server``'s default and ``Config().metrics
    .bind_address`` (which ``start_exporters`` uses) -- and is not reachable on the
    machine's other addresses."""
    assert Config().metrics.bind_address == "127.0.0.1"
    assert parse_config("").metrics.bind_address == "127.0.0.1"
    policy = AdaptiveLoadBalancingPolicy(TokenAwarePolicy(DCAwareRoundRobinPolicy("dc1")))
    policy.populate(model.cluster, model.metadata.all_hosts())
    server, _thread = start_prometheus_server(0, policies=policy, registry=CollectorRegistry())
    exporters = start_exporters(
        Config(metrics=MetricsConfig(prometheus_enabled=True, port=0)),
        policy,
        registry=CollectorRegistry(),
    )
    try:
        for listening in (server, exporters.prometheus_server):
            host, port = listening.server_address[:2]
            assert host == "127.0.0.1"
            url = f"http://127.0.0.1:{port}/metrics"
            with urllib.request.urlopen(url, timeout=5) as response:
                assert b"adaptive_lb_host_in_flight" in response.read()
            other = non_loopback_address()
            if other is not None:
                with pytest.raises(OSError):
                    socket.create_connection((other, port), timeout=2).close()
    finally:
        server.shutdown()
        server.server_close()
        exporters.close()


# ---------------------------------------------------------------- the sentinel run


def run_everything(
    model: ClusterModel, tmp_path: Any, config: Config
) -> tuple[AdaptiveLoadBalancingPolicy, dict[str, list[str]], list[Decision]]:
    """Push the sentinels through everything adaptive-lb does with ``config`` (event
    mode), then again after a reload from a file to span mode; return the policy, what
    left it by channel (spans, metrics, reprs, exceptions) and the recorded decisions."""
    clock = ManualClock(10**12)
    provider, exporter = tracing()
    policy = AdaptiveLoadBalancingPolicy(
        TokenAwarePolicy(DCAwareRoundRobinPolicy("dc1")),
        config,
        clock=clock,
        tracer_provider=provider,
    )
    policy.populate(model.cluster, model.metadata.all_hosts())
    tracer = provider.get_tracer("app")
    exceptions: list[BaseException] = []
    decisions = capture_decisions(policy)
    responses = server_responses()

    def traffic(rounds: int) -> None:
        for i in range(rounds):
            for stmt in statements():
                with tracer.start_as_current_span("request"):
                    plan = list(policy.make_query_plan("ks", stmt))
                list(policy.make_query_plan(None, stmt))  # untraced
                attempts = Attempts.of(policy)
                attempts.sent(plan[0])
                attempts.sent(plan[1])  # a speculative execution
                clock.advance((i % 7 + 1) * 1_000_000)
                attempts.answered(plan[0], responses[i % len(responses)]())
                if i % 5 == 0:
                    attempts.ended(OperationTimedOut({plan[1]: STATEMENT_TEXT}, plan[1]))
                else:
                    attempts.ended(None)

    traffic(60)
    policy.refresh_health()
    span_config = tmp_path / "span.yaml"
    span_config.write_text(OTLP_YAML.format(mode="span", extra=""))
    policy.reload(span_config)
    decisions_after_reload = capture_decisions(policy)
    traffic(20)
    clock.advance(10**9)
    policy.refresh_health()

    # A rejected config with a bad value beside the header, parsed and reloaded.
    bad = OTLP_YAML.format(mode="event", extra="timeout: -1")
    bad_path = tmp_path / "bad.yaml"
    bad_path.write_text(bad)
    for attempt in (lambda: parse_config(bad), lambda: policy.reload(bad_path)):
        try:
            attempt()
        except ConfigError as exc:
            exceptions.append(exc)
    assert len(exceptions) == 2 and policy.config_reloads["failure"] == 1

    snapshot = policy.snapshot()
    registry = CollectorRegistry()
    registry.register(AdaptiveLbCollector(policy))
    prometheus = generate_latest(registry).decode()
    reader = InMemoryMetricReader()
    register_otel_metrics(policy, MeterProvider(metric_readers=[reader]))
    otel = reader.get_metrics_data().to_json()
    all_decisions = decisions + decisions_after_reload
    texts = {
        "spans": span_texts(exporter),
        "metrics": [prometheus, otel],
        "reprs": [repr(policy), str(policy), repr(snapshot), str(snapshot)]
        + [repr(d) + str(d) for d in all_decisions],
        "exceptions": [t for exc in exceptions for t in exception_texts(exc)],
    }
    # The run did what it says: not a vacuous pass.
    assert len(all_decisions) == 80 * len(statements())
    assert {s.name for s in exporter.get_finished_spans()} >= {"request", "adaptive_lb.query_plan"}
    assert any(e.name == EVENT_NAME for s in exporter.get_finished_spans() for e in s.events)
    assert "adaptive_lb_host_requests_total" in prometheus and "adaptive_lb.host.requests" in otel
    assert sum(h.requests_total for h in snapshot.hosts) > 0
    assert sum(h.timeouts_total for h in snapshot.hosts) > 0
    assert policy.internal_errors_by_stage["plan"] == 80 * 2  # the unhashable key, 2 plans
    return policy, texts, all_decisions


def sentinel_config() -> Config:
    """A config (parsed from YAML) whose OTLP Authorization header carries the sentinel."""
    config = parse_config(OTLP_YAML.format(mode="event", extra=""))
    assert config.tracing.otlp.headers["Authorization"].endswith(SENTINEL_HDR)
    assert not config.privacy.routing_keys
    return config


def test_no_sentinel_leaves_the_process(model, tmp_path, captured_logs):
    """Guarantee (privacy by default): no routing key, statement text, bound value or
    OTLP header value appears -- as text, hex, base64 or bytes repr -- in any span name,
    attribute or event, any metric name, label or value (Prometheus and OTel), any log
    record of the adaptive_lb and cassandra loggers (message, arguments, formatted
    traceback), any repr of the policy, its snapshot or its decisions, or any exception
    adaptive-lb raised, after plans (traced in both modes, untraced, LWT, bound, forced
    internal errors), tracking with errors and timeouts, health refreshes, a good and a
    failed reload, a rejected config, a snapshot and both metric exports."""
    _policy, texts, _decisions = run_everything(model, tmp_path, sentinel_config())
    assert captured_logs.matching("internal error in plan"), "the forced error was logged"
    assert captured_logs.matching("config reload from")
    texts["logs"] = log_texts(captured_logs.records)
    assert_no_sentinel(texts)


def test_routing_key_opt_in_shows_the_routing_key(model, tmp_path):
    """Guarantee (the opt-in works, so the sentinel search can fail): with
    ``privacy.routing_keys: true`` the decision carries the routing key and its hex is on
    the span -- including a prepared statement's, which is its partition key's bound
    value. Statement text and header values still never appear."""
    config = sentinel_config()
    config = Config(
        tracing=TracingConfig(otlp=OtlpConfig(headers=dict(config.tracing.otlp.headers))),
        privacy=PrivacyConfig(routing_keys=True),
    )
    provider, exporter = tracing()
    policy = AdaptiveLoadBalancingPolicy(
        TokenAwarePolicy(DCAwareRoundRobinPolicy("dc1")), config, tracer_provider=provider
    )
    policy.populate(model.cluster, model.metadata.all_hosts())
    decisions = capture_decisions(policy)
    simple = SimpleStatement(STATEMENT_TEXT, routing_key=SENTINEL_RK, keyspace="ks")
    with provider.get_tracer("app").start_as_current_span("request"):
        list(policy.make_query_plan("ks", simple))
        list(policy.make_query_plan("ks", bound_statement()))
    assert [d.routing_key for d in decisions] == [SENTINEL_RK, SENTINEL_VAL.encode()]
    (span,) = exporter.get_finished_spans()
    keys = [e.attributes["adaptive_lb.routing_key"] for e in span.events if e.name == EVENT_NAME]
    assert keys == [SENTINEL_RK.hex(), SENTINEL_VAL.encode().hex()]
    texts = {"spans": span_texts(exporter)}
    with pytest.raises(AssertionError, match="spans"):
        assert_no_sentinel(texts, (SENTINEL_RK,))
    with pytest.raises(AssertionError, match="spans"):
        assert_no_sentinel(texts, (SENTINEL_VAL,))
    assert_no_sentinel(texts, (SENTINEL_CQL, SENTINEL_HDR))
    assert policy.internal_errors == 0


# ---------------------------------------------------------------- config errors


def test_rejected_headers_are_never_echoed(model, tmp_path, captured_logs):
    """Guarantee: when the ``headers`` value itself is rejected (a non-string value
    beside the secret one, a list, a nested mapping, a non-string key), neither the
    ConfigError raised by ``parse_config`` / ``OtlpConfig(...)``, nor a failed
    ``policy.reload(path)``, nor a ConfigWatcher rejecting the file, shows the header
    value -- in the message, the listed errors, the traceback or the log."""
    policy = AdaptiveLoadBalancingPolicy(TokenAwarePolicy(DCAwareRoundRobinPolicy("dc1")))
    policy.populate(model.cluster, model.metadata.all_hosts())
    exceptions: list[BaseException] = []
    for index, document in enumerate(BAD_HEADER_DOCUMENTS.values()):
        path = tmp_path / f"bad{index}.yaml"
        path.write_text(document)
        watcher = ConfigWatcher(path, on_change=lambda config: None, on_error=exceptions.append)
        assert watcher.check()
        for attempt in (lambda d=document: parse_config(d), lambda p=path: policy.reload(p)):
            try:
                attempt()
            except ConfigError as exc:
                exceptions.append(exc)
    try:
        OtlpConfig(headers={"Authorization": f"Bearer {SENTINEL_HDR}", "X-Retries": 3})
    except (TypeError, ValueError) as exc:
        exceptions.append(exc)
    assert len(exceptions) == 3 * len(BAD_HEADER_DOCUMENTS) + 1
    assert policy.config_reloads["failure"] == len(BAD_HEADER_DOCUMENTS)
    assert_no_sentinel(
        {
            "exceptions": [t for exc in exceptions for t in exception_texts(exc)],
            "logs": log_texts(captured_logs.records),
        },
        (SENTINEL_HDR,),
    )


def test_request_spans_and_durations_carry_no_sentinel(model, captured_logs):
    """Request spans (every attribute and attempt event, errors quoting the statement
    included) and ``db.client.operation.duration`` with privacy at its defaults: no
    sentinel. The span still says what happened (operation, keyspace, outcomes)."""
    import types

    from cassandra.protocol import QueryMessage

    from adaptive_lb.runtime.request_spans import RequestTelemetry

    clock = ManualClock(10**12)
    provider, exporter = tracing()
    reader = InMemoryMetricReader()
    config = Config(metrics=MetricsConfig(otel_enabled=True))
    policy = AdaptiveLoadBalancingPolicy(
        TokenAwarePolicy(DCAwareRoundRobinPolicy("dc1")),
        config,
        clock=clock,
        tracer_provider=provider,
    )
    policy.populate(model.cluster, model.metadata.all_hosts())
    telemetry = RequestTelemetry(
        config,
        tracer_provider=provider,
        meter_provider=MeterProvider(metric_readers=[reader]),
        root_spans=True,
    )
    policy.decisions.send_to_requests(True, without_parent=True)
    responses = server_responses()
    for i in range(20):
        for stmt in statements():
            plan = list(policy.make_query_plan("ks", stmt))
            future = types.SimpleNamespace(
                query=stmt,
                session=types.SimpleNamespace(keyspace="ks"),
                message=QueryMessage(STATEMENT_TEXT, ConsistencyLevel.ONE),
            )
            attempts = telemetry.observe(future, policy)
            attempts.sent(plan[0])
            attempts.sent(plan[1])
            clock.advance(1_000_000)
            attempts.answered(plan[0], responses[i % len(responses)]())
            failure = OperationTimedOut({plan[1]: STATEMENT_TEXT}, plan[1]) if i % 3 else None
            attempts.ended(failure)
    spans = exporter.get_finished_spans()
    assert len([s for s in spans if s.kind.name == "CLIENT"]) == 20 * len(statements())
    assert {s.attributes.get("db.operation.name") for s in spans} == {"SELECT"}
    texts = {
        "spans": span_texts(exporter),
        "metrics": [reader.get_metrics_data().to_json()],
        "logs": log_texts(captured_logs.records),
    }
    assert_no_sentinel(texts)
