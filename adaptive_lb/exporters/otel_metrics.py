"""The same numbers as the Prometheus collector, as OpenTelemetry observable instruments,
for users who ship metrics over OTLP. Read at collection time from ``policy.snapshot()``;
nothing is recorded per request.

Instruments (attributes ``policy``, and for hosts ``server.address``, ``dc``, ``rack``):

=========================================  =========================  ==========================
instrument                                 kind                       Prometheus family
=========================================  =========================  ==========================
``adaptive_lb.host.in_flight``             gauge                      ``adaptive_lb_host_in_flight``
``adaptive_lb.host.latency`` (s)           gauge, ``quantile``        ``..._latency_seconds``
``adaptive_lb.host.window_requests``       gauge                      ``..._window_requests``
``adaptive_lb.host.requests``              counter                    ``..._requests_total``
``adaptive_lb.host.errors``                counter                    ``..._errors_total``
``adaptive_lb.host.timeouts``              counter                    ``..._timeouts_total``
``adaptive_lb.host.health``                gauge, ``state`` (1 / 0)   ``adaptive_lb_host_health``
``adaptive_lb.host.penalty``               gauge                      ``adaptive_lb_host_penalty``
``adaptive_lb.host.rack_penalty``          gauge                      ``..._rack_penalty``
``adaptive_lb.decisions``                  counter, ``position``      ``..._decisions_total``
``adaptive_lb.replica_cache.hits`` ...     counters (hits, misses,    ``..._replica_cache_*``
                                           bypassed, evictions,
                                           invalidations)
``adaptive_lb.replica_cache.size``         gauge                      ``..._replica_cache_size``
``adaptive_lb.plan_fallbacks``             counter                    ``..._plan_fallbacks_total``
``adaptive_lb.request_tracking.attached``  gauge (1 / 0)              ``..._tracking_attached``
``adaptive_lb.untracked_plans``            counter                    ``..._untracked_plans_total``
``adaptive_lb.internal_errors``            counter, ``stage``         ``..._internal_errors_total``
``adaptive_lb.config.reloads``             counter, ``result``        ``..._config_reloads_total``
``adaptive_lb.config.info``                gauge = 1, ``hash``        ``adaptive_lb_config_info``
``adaptive_lb.policy.enabled``             gauge (1 / 0)              ``..._policy_enabled``
``adaptive_lb.fleet.size``                 gauge                      ``adaptive_lb_fleet_size``
``adaptive_lb.local_rack.info``            gauge = 1, ``rack``,       ``..._local_rack_info``
                                           ``source``
``adaptive_lb.trace.spans.exported``       counter (process-wide)     ``..._spans_exported_total``
``adaptive_lb.trace.spans.dropped``        counter, ``reason``        ``..._spans_dropped_total``
=========================================  =========================  ==========================

May import: the snapshot (what it reads), the health states, forks, the exporters' members
and span counts, the OpenTelemetry API; never its SDK.
"""

from __future__ import annotations

import threading
import weakref
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any

from opentelemetry import metrics
from opentelemetry.metrics import CallbackOptions, Observation

from adaptive_lb.core import forks
from adaptive_lb.exporters.members import Members, policy_list
from adaptive_lb.exporters.span_counts import DROP_REASONS, span_export_totals
from adaptive_lb.stats.health_state import HealthState
from adaptive_lb.telemetry.snapshot import take_snapshot

__all__ = ["register_otel_metrics", "unregister_otel_metrics"]

_QUANTILES = (
    ("0.5", "window_latency_p50_seconds"),
    ("0.95", "window_latency_p95_seconds"),
    ("0.99", "window_latency_p99_seconds"),
)

Callback = Callable[[CallbackOptions], Iterable[Observation]]


class _Instruments:
    """The observable instruments of one meter provider, reading the policies of every
    registration that has not been removed."""

    def __init__(self, meter_provider: Any | None) -> None:
        self.members = Members()
        self.instruments = _create_instruments(self.members, meter_provider)


_lock = threading.Lock()
# One set of instruments per meter provider (None: the global one), created at the first
# registration: the SDK returns an instrument created again under the same name without
# taking the new callbacks, and has no way to remove one.
_by_provider: weakref.WeakKeyDictionary[Any, _Instruments] = weakref.WeakKeyDictionary()
_GLOBAL = type("GlobalMeterProvider", (), {})()


def _after_fork_in_child() -> None:
    """A forked child's instruments read none of the parent's policies."""
    global _lock
    _lock = threading.Lock()
    for instruments in list(_by_provider.values()):
        instruments.members.clear()


forks.on_fork_in_child(_after_fork_in_child)


def register_otel_metrics(
    policy: Any | Sequence[Any],
    meter_provider: Any | None = None,
    names: Sequence[str] | None = None,
) -> list[Any]:
    """Publish ``policy`` (or a sequence of policies, named by ``names`` as in
    :class:`~adaptive_lb.exporters.AdaptiveLbCollector`) through the observable instruments
    of ``meter_provider`` (default: the global one) and return them.

    The instruments are created once per meter provider; each call adds its policies to
    what they report (``names`` default to the lowest free ``"0"``, ``"1"``, ...; a name
    already another policy's raises ``ValueError``), told apart by the ``policy`` attribute,
    until :func:`unregister_otel_metrics` removes them.
    """
    policies = policy_list(policy)
    with _lock:
        key = _GLOBAL if meter_provider is None else meter_provider
        instruments = _by_provider.get(key)
        if instruments is None:
            instruments = _by_provider[key] = _Instruments(meter_provider)
        instruments.members.add(policies, names)
        return list(instruments.instruments)


def unregister_otel_metrics(policy: Any | Sequence[Any], meter_provider: Any | None = None) -> None:
    """Stop reporting ``policy`` (or several; one :func:`register_otel_metrics` of each) on
    ``meter_provider``'s instruments: its series are no longer observed."""
    with _lock:
        key = _GLOBAL if meter_provider is None else meter_provider
        instruments = _by_provider.get(key)
        if instruments is not None:
            instruments.members.remove(policy_list(policy))


def _create_instruments(members: Members, meter_provider: Any | None) -> list[Any]:
    meter = metrics.get_meter("adaptive_lb", meter_provider=meter_provider)

    def snapshots() -> Iterator[tuple[str, Any, Any]]:
        for name, p in members.named():
            snapshot = take_snapshot(p)
            if snapshot is not None:
                yield name, p, snapshot

    def per_host(value_of: Callable[[Any], Any]) -> Callback:
        def callback(options: CallbackOptions) -> Iterable[Observation]:
            for name, _, snapshot in snapshots():
                for host in snapshot.hosts:
                    value = value_of(host)
                    if value is not None:
                        yield Observation(value, _host_attributes(name, host))

        return callback

    def latency(options: CallbackOptions) -> Iterable[Observation]:
        for name, _, snapshot in snapshots():
            for host in snapshot.hosts:
                for quantile, attribute in _QUANTILES:
                    value = getattr(host, attribute)
                    if value is not None:
                        attributes = {**_host_attributes(name, host), "quantile": quantile}
                        yield Observation(value, attributes)

    def health(options: CallbackOptions) -> Iterable[Observation]:
        for name, _, snapshot in snapshots():
            for host in snapshot.hosts:
                for state in HealthState:
                    value = 1 if state.value == host.health_state else 0
                    yield Observation(value, {**_host_attributes(name, host), "state": state.value})

    def per_policy(value_of: Callable[[Any], Any]) -> Callback:
        def callback(options: CallbackOptions) -> Iterable[Observation]:
            for name, _, snapshot in snapshots():
                yield Observation(value_of(snapshot), {"policy": name})

        return callback

    def by_key(attribute: str, key: str) -> Callback:
        def callback(options: CallbackOptions) -> Iterable[Observation]:
            for name, p in members.named():
                for value, count in getattr(p, attribute, {}).items():
                    yield Observation(count, {"policy": name, key: value})

        return callback

    def config_info(options: CallbackOptions) -> Iterable[Observation]:
        for name, _, snapshot in snapshots():
            yield Observation(1, {"policy": name, "hash": snapshot.config_hash})

    def local_rack(options: CallbackOptions) -> Iterable[Observation]:
        for name, _, snapshot in snapshots():
            attributes = {
                "policy": name,
                "rack": snapshot.local_rack or "",
                "source": snapshot.local_rack_source,
            }
            yield Observation(1, attributes)

    def spans_exported(options: CallbackOptions) -> Iterable[Observation]:
        totals = span_export_totals()
        if totals is not None and len(members):
            yield Observation(totals.exported)

    def spans_dropped(options: CallbackOptions) -> Iterable[Observation]:
        totals = span_export_totals()
        if totals is not None and len(members):
            for reason in DROP_REASONS:
                yield Observation(getattr(totals, reason), {"reason": reason})

    gauge = meter.create_observable_gauge
    counter = meter.create_observable_counter
    return [
        gauge("adaptive_lb.host.in_flight", [per_host(lambda h: h.in_flight)], unit="{request}"),
        gauge("adaptive_lb.host.latency", [latency], unit="s"),
        gauge(
            "adaptive_lb.host.window_requests",
            [per_host(lambda h: h.window_requests)],
            unit="{request}",
        ),
        counter(
            "adaptive_lb.host.requests", [per_host(lambda h: h.requests_total)], unit="{request}"
        ),
        counter("adaptive_lb.host.errors", [per_host(lambda h: h.errors_total)], unit="{request}"),
        counter(
            "adaptive_lb.host.timeouts", [per_host(lambda h: h.timeouts_total)], unit="{request}"
        ),
        gauge("adaptive_lb.host.health", [health]),
        gauge("adaptive_lb.host.penalty", [per_host(lambda h: h.health_penalty)]),
        gauge("adaptive_lb.host.rack_penalty", [per_host(lambda h: h.rack_penalty)]),
        counter("adaptive_lb.decisions", [by_key("decisions_by_position", "position")]),
        counter("adaptive_lb.replica_cache.hits", [per_policy(lambda s: s.replica_cache_hits)]),
        counter("adaptive_lb.replica_cache.misses", [per_policy(lambda s: s.replica_cache_misses)]),
        counter(
            "adaptive_lb.replica_cache.bypassed",
            [per_policy(lambda s: s.replica_cache_bypassed)],
        ),
        counter(
            "adaptive_lb.replica_cache.evictions",
            [per_policy(lambda s: s.replica_cache_evictions)],
        ),
        counter(
            "adaptive_lb.replica_cache.invalidations",
            [per_policy(lambda s: s.replica_cache_invalidations)],
        ),
        gauge("adaptive_lb.replica_cache.size", [per_policy(lambda s: s.replica_cache_size)]),
        counter("adaptive_lb.plan_fallbacks", [per_policy(lambda s: s.plan_fallbacks)]),
        gauge(
            "adaptive_lb.request_tracking.attached",
            [per_policy(lambda s: int(s.request_tracking))],
        ),
        counter(
            "adaptive_lb.untracked_plans",
            [per_policy(lambda s: s.untracked_plans)],
            unit="{plan}",
        ),
        counter("adaptive_lb.internal_errors", [by_key("internal_errors_by_stage", "stage")]),
        counter("adaptive_lb.config.reloads", [by_key("config_reloads", "result")]),
        gauge("adaptive_lb.config.info", [config_info]),
        gauge("adaptive_lb.policy.enabled", [per_policy(lambda s: int(s.enabled))]),
        gauge("adaptive_lb.fleet.size", [per_policy(lambda s: s.fleet_size)], unit="{client}"),
        gauge("adaptive_lb.local_rack.info", [local_rack]),
        counter("adaptive_lb.trace.spans.exported", [spans_exported], unit="{span}"),
        counter("adaptive_lb.trace.spans.dropped", [spans_dropped], unit="{span}"),
    ]


def _host_attributes(policy_name: str, host: Any) -> dict[str, str]:
    return {
        "policy": policy_name,
        "server.address": host.address,
        "dc": host.datacenter or "",
        "rack": host.rack or "",
    }
