"""Point-in-time views of the policy for exporters, the CLI and traces.

A snapshot is made of numbers already computed (the health model's last window statistics,
plain counters); taking one never computes a percentile.
"""

from __future__ import annotations

import logging
from typing import Any

from attrs import define

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
