"""Decision spans over real OTLP/HTTP to a receiver on 127.0.0.1, and never waiting on it."""

from __future__ import annotations

import socket
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from cassandra.policies import DCAwareRoundRobinPolicy, TokenAwarePolicy
from cassandra.query import SimpleStatement
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

from adaptive_lb import AdaptiveLoadBalancingPolicy, Config
from adaptive_lb.config import OtlpConfig, TracingConfig
from adaptive_lb.exporters import setup_tracing
from adaptive_lb.sim.cluster import build_cluster, murmur3_routing_keys


class Receiver(BaseHTTPRequestHandler):
    """An OTLP/HTTP receiver that keeps every decoded request."""

    received: list[ExportTraceServiceRequest] = []

    def do_POST(self):
        body = self.rfile.read(int(self.headers["Content-Length"]))
        request = ExportTraceServiceRequest()
        request.ParseFromString(body)
        type(self).received.append(request)
        self.send_response(200)
        self.send_header("Content-Type", "application/x-protobuf")
        self.end_headers()

    def log_message(self, *args):
        pass


def otlp_spans(requests: list[ExportTraceServiceRequest]) -> list:
    """Every span of the decoded export requests."""
    return [
        span
        for request in requests
        for resource_spans in request.resource_spans
        for scope_spans in resource_spans.scope_spans
        for span in scope_spans.spans
    ]


def policy_for(provider, mode="event"):
    model = build_cluster({"dc1": [2, 2, 2]}, real_cluster=False, seed=6)
    config = Config(tracing=TracingConfig(mode=mode))
    policy = AdaptiveLoadBalancingPolicy(
        TokenAwarePolicy(DCAwareRoundRobinPolicy("dc1")), config, tracer_provider=provider
    )
    policy.populate(model.cluster, model.metadata.all_hosts())
    return policy


def tracing_config(port, timeout=2.0):
    return TracingConfig(
        otlp=OtlpConfig(
            endpoint=f"http://127.0.0.1:{port}",
            protocol="http",
            timeout=timeout,
            service_name="otlp-test",
        )
    )


def test_round_trip_over_otlp_http():
    Receiver.received = []
    server = ThreadingHTTPServer(("127.0.0.1", 0), Receiver)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        provider = setup_tracing(tracing_config(server.server_port))
        policy = policy_for(provider)
        tracer = provider.get_tracer("app")
        keys = murmur3_routing_keys(5, seed=1)
        for key in keys:
            with tracer.start_as_current_span("request"):
                list(
                    policy.make_query_plan(
                        "ks", SimpleStatement("q", routing_key=key, keyspace="ks")
                    )
                )
        assert provider.force_flush(10_000)
        provider.shutdown()
    finally:
        server.shutdown()
        server.server_close()
    spans = otlp_spans(Receiver.received)
    assert len(spans) == 5
    service = {
        a.key: a.value.string_value
        for a in Receiver.received[0].resource_spans[0].resource.attributes
    }
    assert service["service.name"] == "otlp-test"
    for span in spans:
        (event,) = [e for e in span.events if e.name == "adaptive_lb.decision"]
        attributes = {a.key: a.value for a in event.attributes}
        assert attributes["db.namespace"].string_value == "ks"
        assert attributes["adaptive_lb.position"].string_value == "replica"
        assert attributes["server.address"].string_value.startswith("127.1.")
        assert len(attributes["adaptive_lb.candidates.address"].array_value.values) == 6


def closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def test_unreachable_endpoint_never_blocks_and_counts_drops():
    provider = setup_tracing(tracing_config(closed_port(), timeout=0.5), max_queue_size=256)
    policy = policy_for(provider, mode="span")
    tracer = provider.get_tracer("app")
    statement = SimpleStatement("q", routing_key=b"\x00" * 8, keyspace="ks")
    start = time.monotonic()
    with tracer.start_as_current_span("request"):
        for _ in range(10_000):
            list(policy.make_query_plan("ks", statement))
    elapsed = time.monotonic() - start
    processor = provider.adaptive_lb_processor
    assert policy.internal_errors == 0
    assert processor.dropped_spans > 0
    provider.shutdown()
    assert elapsed < 30  # generous: on this machine it is ~1 s; nothing waited on the network


def test_hung_receiver_does_not_hold_requests():
    """A receiver that accepts connections and never answers."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(64)
    accepted = []
    stop = threading.Event()

    def accept():
        listener.settimeout(0.2)
        while not stop.is_set():
            try:
                accepted.append(listener.accept()[0])
            except OSError:
                continue

    threading.Thread(target=accept, daemon=True).start()
    try:
        provider = setup_tracing(
            tracing_config(listener.getsockname()[1], timeout=1.0), max_queue_size=512
        )
        policy = policy_for(provider, mode="span")
        tracer = provider.get_tracer("app")
        statement = SimpleStatement("q", routing_key=b"\x01" * 8, keyspace="ks")
        start = time.monotonic()
        with tracer.start_as_current_span("request"):
            for _ in range(10_000):
                list(policy.make_query_plan("ks", statement))
        elapsed = time.monotonic() - start
        processor = provider.adaptive_lb_processor
        # Everything finished while the receiver was still holding the first export.
        assert processor.exported_spans == 0
        assert processor.queue_full_drops > 0
        assert policy.internal_errors == 0
        assert elapsed < 30
    finally:
        stop.set()
        provider.shutdown()
        for connection in accepted:
            connection.close()
        listener.close()


def test_round_trip_over_otlp_grpc():
    """The same over gRPC, to a grpcio TraceService on 127.0.0.1 (child-span mode)."""
    from concurrent import futures

    import grpc
    from opentelemetry.proto.collector.trace.v1 import trace_service_pb2, trace_service_pb2_grpc

    received: list[ExportTraceServiceRequest] = []

    class Service(trace_service_pb2_grpc.TraceServiceServicer):
        def Export(self, request, context):
            received.append(request)
            return trace_service_pb2.ExportTraceServiceResponse()

    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    trace_service_pb2_grpc.add_TraceServiceServicer_to_server(Service(), server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    try:
        config = TracingConfig(
            otlp=OtlpConfig(
                endpoint=f"http://127.0.0.1:{port}",
                protocol="grpc",
                timeout=2.0,
                service_name="otlp-grpc-test",
            )
        )
        provider = setup_tracing(config)
        policy = policy_for(provider, mode="span")
        tracer = provider.get_tracer("app")
        for key in murmur3_routing_keys(3, seed=2):
            with tracer.start_as_current_span("request"):
                statement = SimpleStatement("q", routing_key=key, keyspace="ks")
                list(policy.make_query_plan("ks", statement))
        assert provider.force_flush(10_000)
        assert provider.adaptive_lb_processor.exported_spans == 6
        provider.shutdown()
    finally:
        server.stop(0)
    spans = otlp_spans(received)
    by_name: dict[str, list] = {}
    for span in spans:
        by_name.setdefault(span.name, []).append(span)
    assert len(by_name["request"]) == 3
    assert len(by_name["adaptive_lb.query_plan"]) == 3
    parents = {span.span_id for span in by_name["request"]}
    for child in by_name["adaptive_lb.query_plan"]:
        assert child.parent_span_id in parents
        attributes = {a.key: a.value for a in child.attributes}
        assert attributes["adaptive_lb.position"].string_value == "replica"
        assert attributes["server.address"].string_value.startswith("127.1.")


def test_unreachable_grpc_endpoint_never_blocks():
    config = TracingConfig(
        otlp=OtlpConfig(endpoint=f"http://127.0.0.1:{closed_port()}", protocol="grpc", timeout=0.5)
    )
    provider = setup_tracing(config, max_queue_size=256)
    policy = policy_for(provider, mode="span")
    tracer = provider.get_tracer("app")
    statement = SimpleStatement("q", routing_key=b"\x02" * 8, keyspace="ks")
    start = time.monotonic()
    with tracer.start_as_current_span("request"):
        for _ in range(10_000):
            list(policy.make_query_plan("ks", statement))
    elapsed = time.monotonic() - start
    processor = provider.adaptive_lb_processor
    shutdown_start = time.monotonic()
    provider.shutdown()
    assert time.monotonic() - shutdown_start < 10
    assert policy.internal_errors == 0
    assert processor.exported_spans == 0
    # Everything ended (10,001 spans) either never fit in the queue or failed to export.
    assert processor.dropped_spans == 10_001
    assert processor.queue_full_drops > 0
    assert elapsed < 30


def test_rejected_exports_are_counted_process_wide():
    """A receiver that answers 400: the batch is not retried, it is counted as failed --
    per processor, in span_export_totals() and in the Prometheus families."""
    from prometheus_client import CollectorRegistry

    from adaptive_lb.exporters import AdaptiveLbCollector, span_export_totals

    class Rejecting(BaseHTTPRequestHandler):
        def do_POST(self):
            self.rfile.read(int(self.headers["Content-Length"]))
            self.send_response(400)
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, *args):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Rejecting)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        provider = setup_tracing(tracing_config(server.server_port))
        before = span_export_totals()
        policy = policy_for(provider)
        with provider.get_tracer("app").start_as_current_span("request"):
            list(policy.make_query_plan("ks", SimpleStatement("q", keyspace="ks")))
        provider.force_flush(5_000)
        processor = provider.adaptive_lb_processor
        assert processor.failed_spans == 1 and processor.exported_spans == 0
        after = span_export_totals()
        assert after.export_failed - before.export_failed == 1
        registry = CollectorRegistry()
        registry.register(AdaptiveLbCollector(policy))
        dropped = registry.get_sample_value(
            "adaptive_lb_trace_spans_dropped_total", {"reason": "export_failed"}
        )
        assert dropped == after.export_failed
        provider.shutdown()
    finally:
        server.shutdown()
        server.server_close()
    # A span ending after shutdown is counted, never queued.
    with provider.get_tracer("late").start_as_current_span("late"):
        pass
    assert processor.shutdown_drops == 1
    assert span_export_totals().shutdown - after.shutdown == 1
