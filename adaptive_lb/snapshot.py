"""Point-in-time views of the policy for exporters, the CLI and traces.

A snapshot is made of numbers already computed (the health model's last window statistics,
plain counters); taking one never computes a percentile.
"""

from __future__ import annotations

from attrs import define

__all__ = ["HostSnapshot", "PolicySnapshot"]


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
