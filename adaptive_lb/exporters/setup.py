"""Start every exporter a config asks for, in one call.

``metrics.prometheus_enabled`` starts the Prometheus endpoint on ``metrics.bind_address`` :
``metrics.port``; ``metrics.otel_enabled`` registers the OpenTelemetry observable
instruments; ``tracing.otlp.endpoint`` (with ``tracing.enabled``) builds an OTLP
``TracerProvider``. The policy itself never starts a server or a thread for these.

May import: attrs, the config, prometheus-client and the other exporters' modules.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from functools import partial
from typing import Any

from attrs import define, field
from prometheus_client import CollectorRegistry

from adaptive_lb.config import Config, MetricsConfig
from adaptive_lb.exporters.members import policy_list
from adaptive_lb.exporters.otel_metrics import register_otel_metrics, unregister_otel_metrics
from adaptive_lb.exporters.otlp import setup_tracing
from adaptive_lb.exporters.prometheus_server import start_prometheus_server

__all__ = ["Exporters", "start_exporters"]


@define(slots=True)
class Exporters:
    """What :func:`start_exporters` started; :meth:`close` stops it."""

    tracer_provider: Any | None = None
    """The OTLP ``TracerProvider`` (pass it to the policy, or make it global)."""
    prometheus_server: Any | None = None
    """The HTTP server of ``/metrics`` (``.server_port`` is its port)."""
    prometheus_problem: str | None = None
    """Why ``/metrics`` is not served although enabled (no free port, ``metrics.required``
    false); None when it is served or not enabled."""
    otel_instruments: list[Any] = field(factory=list)
    """The observable instruments registered on the meter provider."""
    _otel_release: Callable[[], None] | None = field(default=None, init=False, repr=False)

    def close(self) -> None:
        """Stop serving the policies on ``/metrics`` (and the endpoint, unless another
        attachment holds it) and on the OpenTelemetry instruments, and flush and shut
        down the tracer provider. Idempotent."""
        if self.prometheus_server is not None:
            self.prometheus_server.shutdown()
            self.prometheus_server.server_close()
            self.prometheus_server = None
        if self._otel_release is not None:
            self._otel_release()
            self._otel_release = None
        if self.tracer_provider is not None:
            self.tracer_provider.shutdown()
            self.tracer_provider = None


def _ports(metrics: MetricsConfig) -> str:
    """``addr:port`` or ``addr:first-last``, for messages."""
    last = min(metrics.port + metrics.port_count - 1, 65535)
    ports = f"{metrics.port}-{last}" if metrics.port and last > metrics.port else metrics.port
    return f"{metrics.bind_address}:{ports}"


def _serve(
    metrics: MetricsConfig,
    policies: list[Any],
    registry: CollectorRegistry | None,
    names: Sequence[str] | None,
) -> Any:
    """The server of the first port of ``metrics.port`` .. ``+ port_count - 1`` that this
    process may serve on (another process's, or another registry's, is skipped); the last
    ``OSError`` when there is none."""
    count = metrics.port_count if metrics.port else 1
    error: OSError | None = None
    for port in range(metrics.port, min(metrics.port + count, 65536)):
        try:
            server, _thread = start_prometheus_server(
                port, addr=metrics.bind_address, policies=policies, registry=registry, names=names
            )
            return server
        except OSError as exc:
            error = exc
    assert error is not None
    raise error


def start_exporters(
    config: Config,
    policies: Any | Sequence[Any],
    names: Sequence[str] | None = None,
    *,
    registry: CollectorRegistry | None = None,
    meter_provider: Any | None = None,
) -> Exporters:
    """Start what ``config`` enables for ``policies`` (a policy or several, named by
    ``names`` as in :class:`~adaptive_lb.exporters.AdaptiveLbCollector`).

    ``registry`` defaults to prometheus_client's global registry, ``meter_provider`` to the
    global meter provider. Calls may repeat (one per session): the policies of every call
    not yet closed share the registry's collector, an address and port's server, and the
    meter provider's instruments, each policy under a name of its own (``names``, default
    the lowest free ``"0"``, ``"1"``, ...). The tracer provider is returned, not made
    global: the caller decides (``opentelemetry.trace.set_tracer_provider``, or the
    policy's ``tracer_provider=``)."""
    policies = policy_list(policies)
    exporters = Exporters()
    try:
        if config.tracing.enabled and config.tracing.otlp.endpoint:
            exporters.tracer_provider = setup_tracing(config)
        metrics = config.metrics
        if metrics.prometheus_enabled:
            try:
                exporters.prometheus_server = _serve(metrics, policies, registry, names)
            except OSError as exc:
                if metrics.required:
                    raise
                exporters.prometheus_problem = (
                    f"cannot serve /metrics on {_ports(metrics)}: {exc.strerror or exc}"
                )
        if metrics.otel_enabled:
            exporters.otel_instruments = register_otel_metrics(policies, meter_provider, names)
            exporters._otel_release = partial(unregister_otel_metrics, policies, meter_provider)
    except Exception:
        exporters.close()
        raise
    return exporters
