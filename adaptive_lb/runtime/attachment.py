"""One call after connecting: :func:`attach` starts everything the config enables.

``adaptive_lb.attach(session, "adaptive-lb.yaml")`` on a connected session whose execution
profiles use :class:`~adaptive_lb.runtime.policy.AdaptiveLoadBalancingPolicy`:

1. applies the config to every adaptive policy of the session;
2. tracks every request (:mod:`adaptive_lb.runtime.tracking`) and refreshes health;
3. ``tracing.otlp.endpoint``: builds the OTLP tracer provider (``otlp`` extra) and gives it
   to the policies; ``tracing.request_spans``: one CLIENT span per request
   (:mod:`adaptive_lb.runtime.request_spans`);
4. ``metrics.prometheus_enabled``: serves ``/metrics``; ``metrics.otel_enabled``: the
   OpenTelemetry instruments and ``db.client.operation.duration``;
5. given a file (a path, or the one ``$ADAPTIVE_LB_CONFIG`` names): watches it and applies
   each valid change, unless it says ``reload: {enabled: false}``.

Whatever the config enables either takes effect or the call raises :class:`ConfigError`
naming what is missing, having started nothing -- but for a metrics port: when none of
``metrics.port`` .. ``+ port_count - 1`` is free (another worker of a pre-fork server took
it), a WARNING says so and the session is routed and tracked without ``/metrics``, unless
``metrics.required``. Calling it again returns the same
:class:`Attachment`; :meth:`Attachment.close` or ``session.shutdown()`` stops it all.

Any number of sessions may be attached in one process, at once or one after another: their
policies share the registry's Prometheus collector, the server of a ``metrics.bind_address``
and ``metrics.port`` and the meter provider's instruments, each under a ``policy`` label of
its own (the lowest free ``"0"``, ``"1"``, ...), and a closed attachment's series are gone.

May import: the policy, request tracking and request spans (its own row, the top one), the
exporters and the rows below, the OpenTelemetry API; never a tool.
"""

from __future__ import annotations

import importlib.util
import logging
import os
import threading
import weakref
from typing import Any

from opentelemetry import trace

from adaptive_lb.config import Config, ConfigError, ConfigWatcher, load_config
from adaptive_lb.core import forks
from adaptive_lb.exporters.otlp import INSTALL_HINT
from adaptive_lb.exporters.setup import Exporters, start_exporters
from adaptive_lb.runtime.policy import AdaptiveLoadBalancingPolicy
from adaptive_lb.runtime.request_spans import RequestTelemetry
from adaptive_lb.runtime.tracking import RequestTracker, close_on_shutdown, session_policies

__all__ = ["Attachment", "attach"]

log = logging.getLogger("adaptive_lb.attach")

_ATTRIBUTE = "_adaptive_lb_attachment"
_lock = threading.Lock()
_live: weakref.WeakSet[Attachment] = weakref.WeakSet()


def _after_fork_in_child() -> None:
    """An attachment inherited across fork is the parent's (:mod:`adaptive_lb.core.forks`):
    closed here without stopping what runs there; attach anew after the fork."""
    global _lock
    _lock = threading.Lock()
    for attachment in list(_live):
        attachment.closed = True
        attachment.forked_from_pid = forks.parent_pid()


forks.on_fork_in_child(_after_fork_in_child)


class Attachment:
    """What :func:`attach` started for one session; :meth:`close` stops it."""

    def __init__(
        self,
        session: Any,
        config: Config,
        policies: list[AdaptiveLoadBalancingPolicy],
        path: str | None,
    ) -> None:
        self.session = session
        self.config = config
        """The config applied at attach (or by the last reload)."""
        self.policies = policies
        """The session's adaptive policies."""
        self.path = path
        """The config file, when attach was given one."""
        self.tracker: RequestTracker | None = None
        self.telemetry: RequestTelemetry | None = None
        self.exporters = Exporters()
        """The Prometheus server, OTel instruments and OTLP tracer provider started."""
        self.watcher: ConfigWatcher | None = None
        self.closed = False
        self.forked_from_pid: int | None = None
        """Set in a process forked after attach: the pid it came from (closed here)."""
        _live.add(self)

    @property
    def tracer_provider(self) -> Any | None:
        """The OTLP tracer provider built from the config, if any."""
        return self.exporters.tracer_provider

    @property
    def prometheus_problem(self) -> str | None:
        """Why ``/metrics`` is not served although enabled (no free port in
        ``metrics.port`` .. ``+ port_count - 1``), else None."""
        return self.exporters.prometheus_problem

    @property
    def prometheus_port(self) -> int | None:
        """The port ``/metrics`` is served on, if it is."""
        server = self.exporters.prometheus_server
        return server.server_port if server is not None else None

    def apply(self, config: Config) -> None:
        """Apply a new config to every policy, to the request telemetry and to the watcher
        (the watcher calls it on each valid change). The exporters keep their attach-time
        settings: a change to ``metrics`` or ``tracing.otlp`` is logged as a WARNING."""
        previous = self.config
        for policy in self.policies:
            policy.reload(config)
        if self.telemetry is not None:
            self.telemetry.configure(config)
            self._route_decisions()
        self.config = config
        kept = [
            name
            for name, old, new in (
                ("metrics", previous.metrics, config.metrics),
                ("tracing.otlp", previous.tracing.otlp, config.tracing.otlp),
            )
            if old != new
        ]
        if kept:
            log.warning(
                "adaptive-lb: %s changed in %s: the exporters keep their attach-time "
                "settings until the next attach (a restart); the rest of the change applies",
                " and ".join(kept),
                self.path or "the config",
            )
        watcher = self.watcher
        if watcher is None or watcher.stopped:
            return
        if config.reload.enabled:
            watcher.interval = config.reload.interval
        else:
            # Not joined: this may run on the watcher's own thread, or hold its lock.
            watcher.stop(timeout=0)
            log.info(
                "adaptive-lb: reload.enabled is now false: %s is no longer watched "
                "(attach again to watch it)",
                self.path,
            )

    def _route_decisions(self, attached: bool = True) -> None:
        # Decisions go to the request spans while those are made, else to the current span.
        telemetry = self.telemetry
        for policy in self.policies:
            if telemetry is None or not attached:
                policy.decisions.send_to_requests(False)
            else:
                policy.decisions.send_to_requests(
                    telemetry.spans, without_parent=telemetry.root_spans
                )

    def close(self) -> None:
        """Stop the watcher, tracking, health refresh and exporters (flushing spans).
        Idempotent; ``session.shutdown()`` calls it."""
        with _lock:
            if self.closed:
                return
            self.closed = True
            if getattr(self.session, _ATTRIBUTE, None) is self:
                delattr(self.session, _ATTRIBUTE)
        if self.watcher is not None:
            self.watcher.stop()
        if self.tracker is not None:
            self.tracker.close()
        self._route_decisions(attached=False)
        self.exporters.close()


def _check_enabled(config: Config, meter_provider: Any | None, path: str | None) -> None:
    """Raise ConfigError for each enabled feature that cannot take effect here."""
    problems = []
    tracing = config.tracing
    if tracing.enabled and tracing.otlp.endpoint:
        exporter = f"opentelemetry.exporter.otlp.proto.{tracing.otlp.protocol}.trace_exporter"
        for module in ("opentelemetry.sdk.trace", exporter):
            if not _importable(module):
                problems.append(
                    f"tracing.otlp.endpoint: set, but {module} is not installed: {INSTALL_HINT}"
                )
                break
    if (
        config.metrics.otel_enabled
        and meter_provider is None
        and not _importable("opentelemetry.sdk.metrics")
    ):
        problems.append(
            "metrics.otel_enabled: true, but no OpenTelemetry MeterProvider can record: "
            f"install the SDK ({INSTALL_HINT}) and set one, or pass meter_provider="
        )
    if problems:
        raise ConfigError(problems, source=path)


def _importable(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except ImportError:  # a parent package is missing
        return False


def _recording_global_provider() -> bool:
    provider = trace.get_tracer_provider()
    return type(provider).__name__ not in ("ProxyTracerProvider", "NoOpTracerProvider")


def attach(
    session: Any,
    config: Config | str | os.PathLike[str] | None = None,
    *,
    tracer_provider: Any | None = None,
    meter_provider: Any | None = None,
    registry: Any | None = None,
) -> Attachment:
    """Attach adaptive-lb to a connected ``session``: see the module docstring.

    :param config: a :class:`Config`, the path of a YAML file (watched for changes unless
        it says ``reload: {enabled: false}``), or None: ``$ADAPTIVE_LB_CONFIG`` if set (a
        file, watched likewise), else the config the first policy was built with.
    :param tracer_provider: where request and decision spans go (default: the one built
        from ``tracing.otlp``, else the global one).
    :param meter_provider: for ``metrics.otel_enabled`` (default: the global one).
    :param registry: the Prometheus registry (default: prometheus_client's global one).
    :raises ConfigError: the config is invalid, or enables something that cannot work
        here (e.g. an OTLP endpoint without the ``otlp`` extra).
    :raises ValueError: no execution profile of the session uses an adaptive policy.
    """
    with _lock:
        existing = getattr(session, _ATTRIBUTE, None)
        if existing is not None and not existing.closed:
            return existing
    policies = session_policies(session)
    if not policies:
        raise ValueError(
            "no execution profile of this session uses an AdaptiveLoadBalancingPolicy: "
            "wrap your policy first (see the README)"
        )
    path = None
    if config is None and os.environ.get("ADAPTIVE_LB_CONFIG"):
        config = os.environ["ADAPTIVE_LB_CONFIG"]
    if config is None:
        config = policies[0].config
    elif not isinstance(config, Config):
        path = os.fspath(config)
        config = load_config(path)
        path = os.path.abspath(path)  # watched from wherever the process goes
    _check_enabled(config, meter_provider, path)

    attachment = Attachment(session, config, policies, path)
    try:
        for policy in policies:
            if policy.config != config:
                policy.reload(config)
        try:
            exporters = start_exporters(
                config, policies, registry=registry, meter_provider=meter_provider
            )
        except OSError as exc:
            metrics_config = config.metrics
            raise ConfigError(
                f"metrics.port: cannot serve /metrics on {metrics_config.bind_address}:"
                f"{metrics_config.port} (port_count {metrics_config.port_count}, "
                f"required): {exc.strerror or exc}",
                source=path,
            ) from exc
        attachment.exporters = exporters
        if exporters.prometheus_problem is not None:
            log.warning(
                "adaptive-lb: %s; this process (pid %d) routes and tracks without it "
                "(metrics.required: false)",
                exporters.prometheus_problem,
                os.getpid(),
            )
        provider = tracer_provider or exporters.tracer_provider
        if provider is not None:
            for policy in policies:
                policy.decisions.use_tracer_provider(provider)
        root_spans = provider is not None or _recording_global_provider()
        telemetry = RequestTelemetry(
            config,
            tracer_provider=provider,
            meter_provider=meter_provider,
            root_spans=root_spans,
        )
        attachment.telemetry = telemetry
        attachment._route_decisions()
        tracker = RequestTracker(session)  # closed by attachment.close()
        tracker.telemetry = telemetry
        attachment.tracker = tracker
        if config.reload.enabled and path is not None:
            attachment.watcher = ConfigWatcher(
                path,
                attachment.apply,
                interval=config.reload.interval,
                report_error=policies[0].record_error,
            ).start()
            log.info(
                "adaptive-lb: watching %s for changes every %gs (reload: {enabled: false} "
                "in it reads it once)",
                path,
                config.reload.interval,
            )
    except BaseException:
        attachment.close()
        raise
    with _lock:
        setattr(session, _ATTRIBUTE, attachment)
    close_on_shutdown(session, attachment.close)
    return attachment
