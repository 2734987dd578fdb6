"""Start every exporter a config asks for, in one call.

``metrics.prometheus_enabled`` starts the Prometheus endpoint on ``metrics.bind_address`` :
``metrics.port``; ``metrics.otel_enabled`` registers the OpenTelemetry observable
instruments; ``tracing.otlp.endpoint`` (with ``tracing.enabled``) builds an OTLP
``TracerProvider``. The policy itself never starts a server or a thread for these.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from functools import partial
from typing import Any

from attrs import define, field
from prometheus_client import CollectorRegistry

from adaptive_lb.config import Config
from adaptive_lb.exporters.otel_metrics import register_otel_metrics, unregister_otel_metrics
from adaptive_lb.exporters.otlp import setup_tracing
from adaptive_lb.exporters.prometheus import _policies, start_prometheus_server

__all__ = ["Exporters", "start_exporters"]


@define(slots=True)
class Exporters:
    """What :func:`start_exporters` started; :meth:`close` stops it."""

    tracer_provider: Any | None = None
    """The OTLP ``TracerProvider`` (pass it to the policy, or make it global)."""
    prometheus_server: Any | None = None
    """The HTTP server of ``/metrics`` (``.server_port`` is its port)."""
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
    policies = _policies(policies)
    exporters = Exporters()
    try:
        if config.tracing.enabled and config.tracing.otlp.endpoint:
            exporters.tracer_provider = setup_tracing(config)
        metrics = config.metrics
        if metrics.prometheus_enabled:
            exporters.prometheus_server, _thread = start_prometheus_server(
                metrics.port,
                addr=metrics.bind_address,
                policies=policies,
                registry=registry,
                names=names,
            )
        if metrics.otel_enabled:
            exporters.otel_instruments = register_otel_metrics(policies, meter_provider, names)
            exporters._otel_release = partial(unregister_otel_metrics, policies, meter_provider)
    except Exception:
        exporters.close()
        raise
    return exporters
