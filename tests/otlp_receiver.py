"""A real OTLP/HTTP trace receiver on 127.0.0.1 for tests: it decodes every export request
(protobuf, as Jaeger or the Collector would) and keeps the spans."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest


class OtlpHttpReceiver:
    """Spans received so far (:attr:`spans`), with their resource and scope."""

    def __init__(self) -> None:
        self.requests: list[ExportTraceServiceRequest] = []
        self._lock = threading.Lock()
        self.server: ThreadingHTTPServer | None = None

    @property
    def endpoint(self) -> str:
        """``http://127.0.0.1:<port>`` (the exporter appends ``/v1/traces``)."""
        assert self.server is not None
        return f"http://127.0.0.1:{self.server.server_port}"

    @property
    def spans(self) -> list[Any]:
        """Every span received, in arrival order."""
        with self._lock:
            return otlp_spans(self.requests)

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers["Content-Length"]))
                request = ExportTraceServiceRequest()
                request.ParseFromString(body)
                with receiver._lock:
                    receiver.requests.append(request)
                self.send_response(200)
                self.send_header("Content-Type", "application/x-protobuf")
                self.end_headers()

            def log_message(self, *args: Any) -> None:
                pass

        return Handler


def otlp_spans(requests: list[ExportTraceServiceRequest]) -> list[Any]:
    """Every span of the decoded export requests (HTTP or gRPC), in order."""
    return [
        span
        for request in requests
        for resource_spans in request.resource_spans
        for scope_spans in resource_spans.scope_spans
        for span in scope_spans.spans
    ]


@contextmanager
def otlp_http_receiver() -> Iterator[OtlpHttpReceiver]:
    """Run a receiver on a free loopback port for the duration of the block."""
    receiver = OtlpHttpReceiver()
    server = ThreadingHTTPServer(("127.0.0.1", 0), receiver._handler())
    receiver.server = server
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield receiver
    finally:
        server.shutdown()
        server.server_close()
        thread.join(5)


def attribute_values(span: Any) -> dict[str, Any]:
    """A received span's (or event's) attributes as a plain dict."""
    values: dict[str, Any] = {}
    for item in span.attributes:
        value = item.value
        kind = value.WhichOneof("value")
        values[item.key] = getattr(value, kind) if kind else None
    return values
