"""Point-in-time views of the policy for exporters, the CLI and traces.

A snapshot is made of numbers already computed (the health model's last window statistics,
plain counters); taking one never computes a percentile.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from attrs import define

if TYPE_CHECKING:
    from adaptive_lb.policy import AdaptiveLoadBalancingPolicy

__all__ = ["HostSnapshot", "PolicySnapshot", "take_snapshot"]

log = logging.getLogger("adaptive_lb.exporters")


@define(frozen=True, slots=True)
class HostSnapshot:
    """One host as the policy sees it."""

    address: str
    port: int | None
    datacenter: str | None
    rack: str | None
    is_local: bool
    """The child policy's distance is LOCAL or LOCAL_RACK."""
    live: bool
    in_flight: int
    requests: int
    """Requests completed in the current statistics window (as of the last health refresh)."""
    errors: int
    timeouts: int
    latency_p50: float | None
    """Seconds; None when the window holds no latency sample."""
    latency_p95: float | None
    latency_p99: float | None
    health_state: str
    health_penalty: float
    rack_penalty: float
    """Score multiplier for the host's rack: 1 in the client's rack, else
    ``non_local_rack_penalty`` x the rack's measured proximity factor."""
    health_since_ns: int
    health_reason: str
    requests_total: int
    """Since the host was first seen (monotonic counters, for Prometheus ``_total``)."""
    errors_total: int
    timeouts_total: int


@define(frozen=True, slots=True)
class PolicySnapshot:
    """The whole policy: hosts, replica cache and error counters, and the config in force."""

    taken_ns: int
    config_hash: str
    hosts: tuple[HostSnapshot, ...]
    replica_cache_size: int
    replica_cache_hits: int
    replica_cache_misses: int
    replica_cache_evictions: int
    replica_cache_invalidations: int
    internal_errors: int
    """Exceptions caught inside adaptive-lb, every stage together."""
    plan_fallbacks: int = 0
    """Plans answered with the child's plan after an internal error (stage ``plan``)."""

    @property
    def replica_cache_hit_ratio(self) -> float:
        """hits / (hits + misses), 0 before any lookup."""
        total = self.replica_cache_hits + self.replica_cache_misses
        return self.replica_cache_hits / total if total else 0.0

    @classmethod
    def of(cls, policy: AdaptiveLoadBalancingPolicy) -> PolicySnapshot:
        """``policy``'s numbers now: in-flight as of now, window counts, percentiles and
        health as of the last health refresh, cache and error counters. Reads only the
        policy's public attributes; computes no percentile."""
        health = policy.health
        hosts = []
        for view in policy.topology.by_id.values():
            host = view.host
            stats = view.stats
            window = health.window_stats(host)
            verdict = health.health(host)
            latency = window.latency if window is not None else {}
            hosts.append(
                HostSnapshot(
                    address=str(host.address),
                    port=getattr(host.endpoint, "port", None),
                    datacenter=view.datacenter,
                    rack=view.rack,
                    is_local=view.is_local,
                    live=view.live,
                    in_flight=stats.in_flight,
                    requests=window.requests if window is not None else 0,
                    errors=window.errors if window is not None else 0,
                    timeouts=window.timeouts if window is not None else 0,
                    latency_p50=latency.get(50.0),
                    latency_p95=latency.get(95.0),
                    latency_p99=latency.get(99.0),
                    health_state=stats.health_state.value,
                    health_penalty=stats.health_penalty,
                    rack_penalty=stats.rack_penalty,
                    health_since_ns=verdict.since_ns if verdict is not None else 0,
                    health_reason=verdict.reason if verdict is not None else "",
                    requests_total=stats.requests_total,
                    errors_total=stats.errors_total,
                    timeouts_total=stats.timeouts_total,
                )
            )
        hosts.sort(key=lambda h: (h.datacenter or "", h.rack or "", h.address))
        cache = policy.replica_cache
        errors = policy.internal_errors_by_stage
        return cls(
            taken_ns=policy.clock.now_ns(),
            config_hash=policy.config_hash,
            hosts=tuple(hosts),
            replica_cache_size=len(cache) if cache is not None else 0,
            replica_cache_hits=cache.hits if cache is not None else 0,
            replica_cache_misses=cache.misses if cache is not None else 0,
            replica_cache_evictions=cache.evictions if cache is not None else 0,
            replica_cache_invalidations=cache.invalidations if cache is not None else 0,
            internal_errors=sum(errors.values()),
            plan_fallbacks=errors["plan"],
        )

    def host(self, address: str) -> HostSnapshot | None:
        """The host with ``address``, if known."""
        for host in self.hosts:
            if host.address == address:
                return host
        return None


def take_snapshot(policy: Any) -> PolicySnapshot | None:
    """``policy.snapshot()``, or None when it raises: the failure is counted and logged
    through the policy's error path (stage ``snapshot``, at most once a minute), so that a
    broken snapshot neither fails a scrape nor writes a traceback per scrape. Objects
    without that path (any object with ``snapshot()`` may be exported) log a warning."""
    try:
        return policy.snapshot()
    except Exception:
        record_error = getattr(policy, "record_error", None)
        if record_error is None:
            log.warning("adaptive-lb: snapshot of %r failed", policy, exc_info=True)
        else:
            record_error("snapshot", "this collection goes without the policy's numbers")
        return None
