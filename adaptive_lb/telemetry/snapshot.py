"""Point-in-time views of the policy for people and programs: exporters, the CLI, traces,
``json.dumps``.

A snapshot is made of numbers already computed (the health model's last window statistics,
plain counters); taking one never computes a percentile.

Naming: every duration and time is in seconds and its field name ends in ``_seconds``;
``window_*`` fields cover the sliding statistics window as of the last health refresh;
``*_total`` fields count since the host was first seen (or the policy was made). Each
field's ``metadata["as_of"]`` says which (``now``, ``refresh``, ``lifetime`` or
``config``; see :data:`AS_OF`). :meth:`PolicySnapshot.to_dict` gives plain JSON-able data,
:meth:`PolicySnapshot.to_json` a JSON text. ``docs/observability.md`` ("The snapshot")
documents every field; its tables are generated from the docstrings of
:class:`PolicySnapshot` (here) and :class:`HostSnapshot`
(:mod:`adaptive_lb.telemetry.host_snapshot`).

May import: :mod:`adaptive_lb.telemetry.host_snapshot`, attrs; the policy's parts for their types
only (under ``TYPE_CHECKING``): it reads a policy through :class:`SnapshotSource`, never
the policy module, which returns a snapshot. No driver import.
"""

from __future__ import annotations

import json
import logging
from typing import TYPE_CHECKING, Any, Protocol

from attrs import define, field

from adaptive_lb.telemetry.host_snapshot import (
    AS_OF,
    CONFIG,
    LIFETIME,
    NOW,
    REFRESH,
    HostSnapshot,
    converter,
)

if TYPE_CHECKING:
    from adaptive_lb.config import Config
    from adaptive_lb.core.clock import Clock
    from adaptive_lb.health.model import HealthModel
    from adaptive_lb.plan.replicas import ReplicaCache
    from adaptive_lb.plan.topology import Topology
    from adaptive_lb.stats.registry import StatsRegistry
    from adaptive_lb.stats.sampling import Sampler

__all__ = ["AS_OF", "HostSnapshot", "PolicySnapshot", "SnapshotSource", "take_snapshot"]

log = logging.getLogger("adaptive_lb.exporters")

_NS = 1_000_000_000


class SnapshotSource(Protocol):
    """What a snapshot reads of a policy (:class:`adaptive_lb.AdaptiveLoadBalancingPolicy`
    is one): its public attributes, nothing else. Named here so that the snapshot depends
    on the numbers it reads, not on the policy that returns it."""

    @property
    def clock(self) -> Clock: ...
    @property
    def health(self) -> HealthModel: ...
    @property
    def topology(self) -> Topology: ...
    @property
    def replica_cache(self) -> ReplicaCache | None: ...
    @property
    def internal_errors_by_stage(self) -> dict[str, int]: ...
    @property
    def config(self) -> Config: ...
    @property
    def config_hash(self) -> str: ...
    @property
    def request_tracking(self) -> bool: ...
    @property
    def untracked_plans(self) -> int: ...
    @property
    def local_rack(self) -> str | None: ...
    @property
    def local_rack_source(self) -> str: ...
    @property
    def fleet_size(self) -> int: ...
    @property
    def fleet_size_source(self) -> str: ...
    @property
    def untracked_attempts(self) -> int: ...
    @property
    def unknown_host_events(self) -> int: ...
    @property
    def decisions_by_position(self) -> dict[str, int]: ...

    sampler: Sampler
    stats: StatsRegistry
    forked_from_pid: int | None
    config_reloads: dict[str, int]


@define(frozen=True, slots=True)
class PolicySnapshot:
    """The whole policy: its counters, the config in force and every known host. See
    ``docs/observability.md``, "The snapshot"."""

    taken_seconds: float = field(metadata=NOW)
    """When the snapshot was taken, on the policy's monotonic clock: only differences
    between two snapshots mean something (a rate is the difference of a ``*_total`` over
    the difference of ``taken_seconds``)."""
    config_hash: str = field(metadata=NOW)
    """Short content hash of the config in force."""
    enabled: bool = field(metadata=CONFIG)
    """The policy orders plans by load and health (``policy.enabled``). False: every plan
    is exactly the child policy's own, while tracking, health and every other number here
    keep running, to compare with."""
    window_seconds: float = field(metadata=CONFIG)
    """Length of the statistics window (``tracking.window``) behind the ``window_*``
    fields."""
    health_refresh_interval_seconds: float = field(metadata=CONFIG)
    """Time between health refreshes (``health.refresh_interval``): how stale the
    ``window_*`` and ``health_*`` fields can be while refreshes run."""
    health_refreshes: int = field(metadata=LIFETIME)
    """Health refreshes done; 0 means every ``window_*`` field is still empty."""
    request_tracking: bool = field(metadata=NOW)
    """Request tracking is attached (``adaptive_lb.attach`` or ``instrument``): while
    False every host looks idle and unmeasured."""
    untracked_plans: int = field(metadata=LIFETIME)
    """Plans made while no request tracking was attached."""
    tracking_requests: int = field(metadata=LIFETIME)
    """Requests request tracking saw for this policy, tracked or not
    (:mod:`adaptive_lb.stats.sampling`)."""
    tracked_one_in: int = field(metadata=NOW)
    """One request in this many is tracked (its attempts timed, their outcomes recorded
    in the ``window_*`` fields and ``*_total`` counters): 1 while traffic is within
    ``tracking.samples_per_host`` per local host per second."""
    in_flight_from_pools: bool = field(metadata=NOW)
    """``in_flight`` is the driver's count of each host's connection pool (False: the
    tracked attempts, counted by adaptive-lb)."""
    forked_from_pid: int | None = field(metadata=LIFETIME)
    """Set in a process forked after the policy was made: the pid of the process it came
    from, whose connections and tracking stayed there (docs/deployment.md); None: not."""
    local_rack: str | None = field(metadata=REFRESH)
    """The client's rack in force (hosts elsewhere get the rack penalty); None: none known
    yet, no rack penalty."""
    local_rack_source: str = field(metadata=REFRESH)
    """Where ``local_rack`` comes from: ``configured`` (``policy.local_rack``), ``child``
    (the child policy's), ``learned`` (``local_rack: auto``, from measured latency) or
    ``unknown``."""
    fleet_size: int = field(metadata=REFRESH)
    """How many clients share the cluster, as this one knows it: its reads and probes of
    each node are spaced so that the fleet's stay within ``health.fleet.budget``."""
    fleet_size_source: str = field(metadata=REFRESH)
    """Where ``fleet_size`` comes from: ``configured`` (``health.fleet.size``),
    ``system_views.clients`` or ``system.clients`` (counted in the server's clients table,
    read every ``health.fleet.clients_interval``) or ``default``
    (``health.fleet.default_size``)."""
    untracked_attempts: int = field(metadata=LIFETIME)
    """Attempts sent to a host the policy does not know (removed, or never seen): not
    counted in any host."""
    unknown_host_events: int = field(metadata=LIFETIME)
    """Up / down events for hosts the policy does not know: ignored."""
    decisions_by_position: dict[str, int] = field(metadata=LIFETIME, hash=False)
    """Plans made, by the origin of their first host: ``replica``, ``non_replica``,
    ``local``, ``child``, ``fallback``."""
    replica_cache_size: int = field(metadata=NOW)
    """Entries in the replica cache."""
    replica_cache_hits: int = field(metadata=LIFETIME)
    """Replica lookups answered by the cache."""
    replica_cache_misses: int = field(metadata=LIFETIME)
    """Replica lookups the cache could not answer."""
    replica_cache_bypassed: int = field(metadata=LIFETIME)
    """Replica lookups resolved without the cache: it had stepped aside because it hit too
    rarely to pay, its size is 0, or the key was too long to keep."""
    replica_cache_evictions: int = field(metadata=LIFETIME)
    """Entries evicted from the full replica cache."""
    replica_cache_invalidations: int = field(metadata=LIFETIME)
    """Times the replica cache was emptied (topology or schema changes)."""
    internal_errors: int = field(metadata=LIFETIME)
    """Exceptions caught inside adaptive-lb, every stage together."""
    internal_errors_by_stage: dict[str, int] = field(metadata=LIFETIME, hash=False)
    """``internal_errors`` by stage (every stage listed, zeros included)."""
    plan_fallbacks: int = field(metadata=LIFETIME)
    """Plans answered with the child's plan after an internal error (stage ``plan``)."""
    config_reloads: dict[str, int] = field(metadata=LIFETIME, hash=False)
    """Config reloads by result: ``success``, ``failure``."""
    hosts: tuple[HostSnapshot, ...] = field(metadata=NOW)
    """Every host the policy knows, by datacenter, rack and address."""

    @property
    def replica_cache_hit_ratio(self) -> float:
        """The share of replica lookups the cache answered: hits / (hits + misses +
        bypassed), 0 before any lookup."""
        total = self.replica_cache_hits + self.replica_cache_misses + self.replica_cache_bypassed
        return self.replica_cache_hits / total if total else 0.0

    @classmethod
    def of(cls, policy: SnapshotSource) -> PolicySnapshot:
        """``policy``'s numbers now: in-flight as of now, window counts, percentiles and
        health as of the last health refresh, lifetime counters. Reads only the policy's
        public attributes; computes no percentile."""
        now_ns = policy.clock.now_ns()
        health = policy.health
        hosts = [HostSnapshot.of(view, health, now_ns) for view in policy.topology.by_id.values()]
        hosts.sort(key=lambda h: (h.datacenter or "", h.rack or "", h.address))
        cache = policy.replica_cache
        errors = policy.internal_errors_by_stage
        config = policy.config
        return cls(
            taken_seconds=now_ns / _NS,
            config_hash=policy.config_hash,
            enabled=config.policy.enabled,
            window_seconds=config.tracking.window,
            health_refresh_interval_seconds=config.health.refresh_interval,
            health_refreshes=health.refreshes,
            request_tracking=policy.request_tracking,
            untracked_plans=policy.untracked_plans,
            tracking_requests=policy.sampler.requests,
            tracked_one_in=policy.sampler.every,
            in_flight_from_pools=policy.stats.in_flight_sources > 0,
            forked_from_pid=policy.forked_from_pid,
            local_rack=policy.local_rack,
            local_rack_source=policy.local_rack_source,
            fleet_size=policy.fleet_size,
            fleet_size_source=policy.fleet_size_source,
            untracked_attempts=policy.untracked_attempts,
            unknown_host_events=policy.unknown_host_events,
            decisions_by_position=dict(policy.decisions_by_position),
            replica_cache_size=len(cache) if cache is not None else 0,
            replica_cache_hits=cache.hits if cache is not None else 0,
            replica_cache_misses=cache.misses if cache is not None else 0,
            replica_cache_bypassed=cache.bypassed if cache is not None else 0,
            replica_cache_evictions=cache.evictions if cache is not None else 0,
            replica_cache_invalidations=cache.invalidations if cache is not None else 0,
            internal_errors=sum(errors.values()),
            internal_errors_by_stage=errors,
            plan_fallbacks=errors["plan"],
            config_reloads=dict(policy.config_reloads),
            hosts=tuple(hosts),
        )

    def host(self, address: str) -> HostSnapshot | None:
        """The host with ``address``, if known."""
        for host in self.hosts:
            if host.address == address:
                return host
        return None

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON-able data: ``{field name: value}``, ``hosts`` a list of
        :meth:`HostSnapshot.to_dict`. ``json.dumps(snapshot.to_dict())`` works."""
        result: dict[str, Any] = converter().unstructure(self)
        return result

    def to_json(self, indent: int | None = None) -> str:
        """``json.dumps(self.to_dict(), indent=indent)``."""
        return json.dumps(self.to_dict(), indent=indent)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> PolicySnapshot:
        """The snapshot :meth:`to_dict` gave ``data`` for (e.g. after ``json.loads``)."""
        return converter().structure(data, cls)


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
