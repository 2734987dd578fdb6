"""Prometheus metrics, computed at scrape time from ``policy.snapshot()`` (served over HTTP
by :mod:`adaptive_lb.exporters.prometheus_server`).

No Prometheus call is made per request: the policy keeps plain counters and the health
model's last window statistics; :class:`AdaptiveLbCollector` turns them into metric
families when Prometheus scrapes.

Labels: host families carry ``address``, ``dc``, ``rack``. Every family that belongs to a
policy also carries ``policy``: with several policies (one per execution profile) the
series stay apart (sum them in PromQL to get the client's totals; a host shared by two
profiles appears once per profile, with each profile's own counts). Policies are named by
``names`` (default ``"0"``, ``"1"``, ... in the order given).

Families (``_total`` is added by the exposition format to counters):

- ``adaptive_lb_host_in_flight`` (gauge), ``adaptive_lb_host_latency_seconds`` (summary:
  quantiles 0.5 / 0.95 / 0.99 over the statistics window, as of the last health refresh),
  ``adaptive_lb_host_window_requests`` (gauge: the window's completed requests, behind those
  quantiles), ``adaptive_lb_host_requests_total`` / ``_errors_total`` / ``_timeouts_total``
  (counters), ``adaptive_lb_host_health{state=...}`` (gauge, 1 for the current state and 0
  for the others), ``adaptive_lb_host_penalty`` (gauge);
  ``adaptive_lb_host_probes_total{outcome="answered"|"failed"|"timeout"|"unsent"}``
  (adaptive-lb's own probes, counted apart from the user's attempts) and
  ``adaptive_lb_host_probe_latency_seconds`` (gauge: the last answered probe);
  ``adaptive_lb_host_server_load`` (the score factor from the node's thread pools),
  ``adaptive_lb_host_server_pressure_ratio`` and ``adaptive_lb_host_server_load_reads_total``
  / ``..._read_failures_total`` (reads of ``system_views.thread_pools``, not user requests);
  ``adaptive_lb_host_latency_factor`` (the score factor from the latency the host shows);
- ``adaptive_lb_decisions_total{position=...}``, ``adaptive_lb_replica_cache_hits_total`` /
  ``_misses_total`` / ``_bypassed_total`` / ``_evictions_total`` / ``_invalidations_total``,
  ``adaptive_lb_replica_cache_size`` (gauge), ``adaptive_lb_plan_fallbacks_total`` (internal
  errors answered with the child's plan), ``adaptive_lb_internal_errors_total{stage=...}``
  (every internal error, see :data:`adaptive_lb.core.errors.ERROR_STAGES`),
  ``adaptive_lb_config_reloads_total{result=...}``,
  ``adaptive_lb_config_info{hash=...}``, ``adaptive_lb_policy_enabled`` (gauge: 1 while
  the policy orders plans, 0 while ``policy.enabled`` is false and every plan is the child
  policy's own), ``adaptive_lb_request_tracking_attached`` (gauge:
  1 when request tracking is attached, 0 when every host looks idle for want of it),
  ``adaptive_lb_untracked_plans_total`` (plans made meanwhile),
  ``adaptive_lb_local_rack_info{rack=...,source=...}`` (the client's rack and whether it is
  configured, the child's, learned or unknown);
- process-wide, once :func:`~adaptive_lb.exporters.setup_tracing` made a span processor
  (read from :mod:`~adaptive_lb.exporters.span_counts`: no OpenTelemetry SDK needed):
  ``adaptive_lb_trace_spans_exported_total`` and
  ``adaptive_lb_trace_spans_dropped_total{reason="queue_full"|"export_failed"|"backoff"|"shutdown"}``.

May import: the snapshot (what it reads), the health states, the exporters' members and span
counts, prometheus-client; never the OpenTelemetry SDK.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator, Sequence
from typing import Any

from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    InfoMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector

from adaptive_lb.exporters.members import Members, policy_list
from adaptive_lb.exporters.span_counts import DROP_REASONS, span_export_totals
from adaptive_lb.stats.health_state import HealthState
from adaptive_lb.telemetry.snapshot import take_snapshot

__all__ = ["AdaptiveLbCollector"]

log = logging.getLogger("adaptive_lb.exporters")

_HOST_LABELS = ["policy", "address", "dc", "rack"]
_QUANTILES = (
    ("0.5", "window_latency_p50_seconds"),
    ("0.95", "window_latency_p95_seconds"),
    ("0.99", "window_latency_p99_seconds"),
)

# (family class, name, help, HostSnapshot attribute): one sample per host.
_HOST_FAMILIES: tuple[tuple[type, str, str, str], ...] = (
    (
        GaugeMetricFamily,
        "adaptive_lb_host_in_flight",
        "Attempts in flight on the host.",
        "in_flight",
    ),
    (
        GaugeMetricFamily,
        "adaptive_lb_host_window_requests",
        "Requests completed in the statistics window, as of the last health refresh.",
        "window_requests",
    ),
    (
        CounterMetricFamily,
        "adaptive_lb_host_requests",
        "Attempts completed with an outcome.",
        "requests_total",
    ),
    (CounterMetricFamily, "adaptive_lb_host_errors", "Attempts that failed.", "errors_total"),
    (
        CounterMetricFamily,
        "adaptive_lb_host_timeouts",
        "Attempts that timed out.",
        "timeouts_total",
    ),
    (
        GaugeMetricFamily,
        "adaptive_lb_host_penalty",
        "The host's health penalty (multiplier of its load score; 1 = none).",
        "health_penalty",
    ),
    (
        GaugeMetricFamily,
        "adaptive_lb_host_rack_penalty",
        "The host's rack penalty (multiplier of its load score; 1 = the client's rack, "
        "more for a rack farther away).",
        "rack_penalty",
    ),
    (
        GaugeMetricFamily,
        "adaptive_lb_host_server_load",
        "The host's server-load factor (multiplier of its load score from the queues the "
        "node reports in system_views.thread_pools, damped; 1 = none).",
        "server_load",
    ),
    (
        GaugeMetricFamily,
        "adaptive_lb_host_latency_factor",
        "The host's latency factor (multiplier of its load score from how surely slower "
        "than its peers it answers, beyond a dead band, decaying with time; 1 = none).",
        "latency_factor",
    ),
    (
        CounterMetricFamily,
        "adaptive_lb_host_server_load_reads",
        "Reads of the host's system_views.thread_pools sent (not user requests).",
        "server_load_reads_total",
    ),
    (
        CounterMetricFamily,
        "adaptive_lb_host_server_load_read_failures",
        "Reads of the host's thread pools that timed out, failed or were not sent.",
        "server_load_read_failures_total",
    ),
)

# (family class, name, help, PolicySnapshot attribute): one sample per policy.
_POLICY_FAMILIES: tuple[tuple[type, str, str, str], ...] = (
    (
        GaugeMetricFamily,
        "adaptive_lb_fleet_size",
        "How many clients share the cluster as this one knows it (health.fleet): its reads "
        "and probes of each node are spaced so that the fleet's stay within the budget.",
        "fleet_size",
    ),
    (
        GaugeMetricFamily,
        "adaptive_lb_policy_enabled",
        "1 when the policy orders plans by load and health (policy.enabled), 0 when every "
        "plan is the child policy's own, unchanged.",
        "enabled",
    ),
    (
        CounterMetricFamily,
        "adaptive_lb_replica_cache_hits",
        "Replica cache hits.",
        "replica_cache_hits",
    ),
    (
        CounterMetricFamily,
        "adaptive_lb_replica_cache_misses",
        "Replica cache misses.",
        "replica_cache_misses",
    ),
    (
        CounterMetricFamily,
        "adaptive_lb_replica_cache_bypassed",
        "Replica lookups resolved without the cache (it stepped aside for want of hits, "
        "its size is 0, or the key was too long).",
        "replica_cache_bypassed",
    ),
    (
        CounterMetricFamily,
        "adaptive_lb_replica_cache_evictions",
        "Replica cache evictions.",
        "replica_cache_evictions",
    ),
    (
        CounterMetricFamily,
        "adaptive_lb_replica_cache_invalidations",
        "Replica cache invalidations (topology or schema changes).",
        "replica_cache_invalidations",
    ),
    (
        GaugeMetricFamily,
        "adaptive_lb_replica_cache_size",
        "Replica cache entries.",
        "replica_cache_size",
    ),
    (
        CounterMetricFamily,
        "adaptive_lb_plan_fallbacks",
        "Plans answered with the child's plan after an internal error.",
        "plan_fallbacks",
    ),
    (
        GaugeMetricFamily,
        "adaptive_lb_request_tracking_attached",
        "1 when request tracking is attached to the policy (adaptive_lb.attach), else 0: "
        "without it every host looks idle.",
        "request_tracking",
    ),
    (
        CounterMetricFamily,
        "adaptive_lb_untracked_plans",
        "Plans made while no request tracking was attached.",
        "untracked_plans",
    ),
    (
        CounterMetricFamily,
        "adaptive_lb_tracking_requests",
        "Requests request tracking saw, tracked or not (the host counters count the "
        "tracked ones' attempts).",
        "tracking_requests",
    ),
    (
        GaugeMetricFamily,
        "adaptive_lb_tracked_one_in",
        "One request in this many is tracked (1 while traffic is within "
        "tracking.samples_per_host per local host per second).",
        "tracked_one_in",
    ),
)


class AdaptiveLbCollector(Collector):
    """A ``prometheus_client`` collector for one AdaptiveLoadBalancingPolicy or several.

    :param policies: a policy, or a sequence of them (e.g. one per execution profile).
    :param names: the ``policy`` label of each (default ``"0"``, ``"1"``, ...).

    Counts the policy may not keep are read with defaults (``decisions_by_position``,
    ``config_reloads``: empty), so any object with ``snapshot()`` works. :meth:`add` and
    :meth:`remove` change the policies served while it is registered (thread-safe).
    """

    def __init__(
        self, policies: Any | Sequence[Any] = (), names: Sequence[str] | None = None
    ) -> None:
        self.members = Members()
        self.members.add(policy_list(policies), names)

    @property
    def policies(self) -> list[Any]:
        """The policies served, in order."""
        return [policy for _, policy in self.members.named()]

    @property
    def names(self) -> list[str]:
        """Their ``policy`` labels."""
        return [name for name, _ in self.members.named()]

    def add(self, policies: Any | Sequence[Any], names: Sequence[str] | None = None) -> list[str]:
        """Serve ``policies`` too, under ``names`` (default: the lowest free ``"0"``,
        ``"1"``, ...); return their names. A policy already served keeps its name and is
        served until removed as many times as it was added. ``ValueError`` (nothing added)
        for a name already another policy's."""
        return self.members.add(policy_list(policies), names)

    def remove(self, policies: Any | Sequence[Any]) -> None:
        """Stop serving ``policies`` (one :meth:`add` of each): their series disappear."""
        self.members.remove(policy_list(policies))

    def collect(self) -> Iterator[Metric]:
        """Build every family from the policies' snapshots (called at each scrape)."""
        host_families = [
            (kind(name, help_text, labels=_HOST_LABELS), attribute)
            for kind, name, help_text, attribute in _HOST_FAMILIES
        ]
        policy_families = [
            (kind(name, help_text, labels=["policy"]), attribute)
            for kind, name, help_text, attribute in _POLICY_FAMILIES
        ]
        # Summary-style: quantiles over the sliding statistics window, as of the last health
        # refresh. No _count/_sum: a window's count goes down, which rate() would take for a
        # counter reset (the window's count is adaptive_lb_host_window_requests).
        latency = Metric(
            "adaptive_lb_host_latency_seconds",
            "Latency quantiles over the statistics window, as of the last health refresh.",
            "summary",
        )
        health = GaugeMetricFamily(
            "adaptive_lb_host_health",
            "1 for the host's current health state, 0 for the others.",
            labels=[*_HOST_LABELS, "state"],
        )
        probes = CounterMetricFamily(
            "adaptive_lb_host_probes",
            "adaptive-lb's own probes of the host, by outcome (not user requests: in no "
            "other host family).",
            labels=[*_HOST_LABELS, "outcome"],
        )
        probe_latency = GaugeMetricFamily(
            "adaptive_lb_host_probe_latency_seconds",
            "How long the host's last answered probe took.",
            labels=_HOST_LABELS,
        )
        pressure = GaugeMetricFamily(
            "adaptive_lb_host_server_pressure_ratio",
            "The host's smoothed pressure at its busiest watched thread pool: (active + "
            "pending + blocked tasks) / the pool's thread limit (absent without a reading).",
            labels=_HOST_LABELS,
        )
        decisions = CounterMetricFamily(
            "adaptive_lb_decisions",
            "Plans made, by the origin of their first host.",
            labels=["policy", "position"],
        )
        errors = CounterMetricFamily(
            "adaptive_lb_internal_errors",
            "Exceptions caught inside adaptive-lb, by stage (none reaches the driver).",
            labels=["policy", "stage"],
        )
        reloads = CounterMetricFamily(
            "adaptive_lb_config_reloads", "Config reloads by result.", labels=["policy", "result"]
        )
        info = InfoMetricFamily("adaptive_lb_config", "The config in force.", labels=["policy"])
        rack = InfoMetricFamily(
            "adaptive_lb_local_rack",
            "The client's rack in force and where it comes from (configured, child, "
            "learned, unknown).",
            labels=["policy"],
        )
        for name, policy in self.members.named():
            # Read before the snapshot: a policy whose snapshot fails still shows that.
            for stage, count in getattr(policy, "internal_errors_by_stage", {}).items():
                errors.add_metric([name, stage], count)
            snapshot = take_snapshot(policy)
            if snapshot is None:  # counted by the policy; must not hide the others
                continue
            for host in snapshot.hosts:
                labels = [name, host.address, host.datacenter or "", host.rack or ""]
                for family, attribute in host_families:
                    family.add_metric(labels, getattr(host, attribute))
                label_map = dict(zip(_HOST_LABELS, labels, strict=True))
                for quantile, attribute in _QUANTILES:
                    value = getattr(host, attribute)
                    if value is not None:
                        latency.add_sample(
                            "adaptive_lb_host_latency_seconds",
                            {**label_map, "quantile": quantile},
                            value,
                        )
                for state in HealthState:
                    value = 1.0 if state.value == host.health_state else 0.0
                    health.add_metric([*labels, state.value], value)
                probes.add_metric([*labels, "answered"], host.probes_answered_total)
                probes.add_metric([*labels, "failed"], host.probes_failed_total)
                probes.add_metric([*labels, "timeout"], host.probes_timeouts_total)
                probes.add_metric([*labels, "unsent"], host.probes_unsent_total)
                if host.probe_latency_seconds is not None:
                    probe_latency.add_metric(labels, host.probe_latency_seconds)
                if host.server_pressure is not None:
                    pressure.add_metric(labels, host.server_pressure)
            for family, attribute in policy_families:
                family.add_metric([name], float(getattr(snapshot, attribute)))
            for position, count in getattr(policy, "decisions_by_position", {}).items():
                decisions.add_metric([name, position], count)
            for result, count in getattr(policy, "config_reloads", {}).items():
                reloads.add_metric([name, result], count)
            info.add_metric([name], {"hash": snapshot.config_hash})
            rack.add_metric(
                [name],
                {
                    "rack": getattr(snapshot, "local_rack", None) or "",
                    "source": getattr(snapshot, "local_rack_source", "unknown"),
                },
            )
        yield from (family for family, _ in host_families)
        yield from (latency, health, probes, probe_latency, pressure, decisions)
        yield from (family for family, _ in policy_families)
        yield from (errors, reloads, info, rack)
        yield from _span_families()


def _span_families() -> Iterator[Metric]:
    totals = span_export_totals()
    if totals is None:
        return
    exported = CounterMetricFamily(
        "adaptive_lb_trace_spans_exported",
        "Spans the OTLP exporter delivered (every setup_tracing provider of the process).",
    )
    exported.add_metric([], totals.exported)
    dropped = CounterMetricFamily(
        "adaptive_lb_trace_spans_dropped",
        "Spans that never reached the OTLP receiver, by reason.",
        labels=["reason"],
    )
    for reason in DROP_REASONS:
        dropped.add_metric([reason], getattr(totals, reason))
    yield exported
    yield dropped
