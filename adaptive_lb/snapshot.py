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
documents every field; its tables are generated from the docstrings below.
"""

from __future__ import annotations

import functools
import json
import logging
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Protocol

from attrs import define, field

if TYPE_CHECKING:
    import cattrs

    from adaptive_lb.clock import Clock
    from adaptive_lb.config import Config
    from adaptive_lb.health import HealthModel
    from adaptive_lb.replicas import ReplicaCache
    from adaptive_lb.sampling import Sampler
    from adaptive_lb.stats_registry import StatsRegistry
    from adaptive_lb.topology import Topology

__all__ = ["AS_OF", "HostSnapshot", "PolicySnapshot", "SnapshotSource", "take_snapshot"]

log = logging.getLogger("adaptive_lb.exporters")

AS_OF = {
    "now": "read when the snapshot is taken",
    "refresh": "as of the last health refresh (every health.refresh_interval)",
    "lifetime": "counted since the host was first seen, or the policy was made; never goes down",
    "config": "from the config in force",
}
"""The values of each snapshot field's ``metadata["as_of"]``: when its number was made."""

_NS = 1_000_000_000
_NOW = {"as_of": "now"}
_REFRESH = {"as_of": "refresh"}
_LIFETIME = {"as_of": "lifetime"}
_CONFIG = {"as_of": "config"}


@functools.cache
def _converter() -> cattrs.Converter:
    # Made (and cattrs imported) on first use: importing the policy stays cheap. Tuples
    # become lists, so that to_dict() == json.loads(json.dumps(to_dict())).
    import cattrs

    return cattrs.Converter(unstruct_collection_overrides={Sequence: list})


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
class HostSnapshot:
    """One host as the policy sees it. See ``docs/observability.md``, "The snapshot"."""

    address: str = field(metadata=_NOW)
    """The host's address (``str(host.address)``)."""
    port: int | None = field(metadata=_NOW)
    """The host's port, when its endpoint has one."""
    datacenter: str | None = field(metadata=_NOW)
    """The host's datacenter, as the driver's metadata says."""
    rack: str | None = field(metadata=_NOW)
    """The host's rack, as the driver's metadata says."""
    is_local: bool = field(metadata=_NOW)
    """The child policy's distance is LOCAL or LOCAL_RACK: the host can be a candidate."""
    live: bool = field(metadata=_NOW)
    """The driver reports the host up."""
    in_flight: int = field(metadata=_NOW)
    """Requests in flight on the host: the driver's count of its connection pool (every
    request, its retries and speculative executions, and streams orphaned by a client
    timeout until the server answers), or the tracked attempts not yet ended when
    ``in_flight_from_pools`` is false."""
    window_requests: int = field(metadata=_REFRESH)
    """Attempts that ended with an outcome (success, error or timeout) in the statistics
    window; 0 before the first health refresh that saw the host."""
    window_errors: int = field(metadata=_REFRESH)
    """Attempts that failed in the statistics window (timeouts not included)."""
    window_timeouts: int = field(metadata=_REFRESH)
    """Attempts that timed out in the statistics window."""
    window_error_rate: float = field(metadata=_REFRESH)
    """(window_errors + window_timeouts) / window_requests, 0 without requests: the rate
    the ERRORING rule compares with ``health.error_rate``."""
    window_samples: int = field(metadata=_REFRESH)
    """Latency samples in the statistics window, behind the percentiles: successes,
    timeouts and slow errors (a fast error has no latency sample)."""
    window_latency_p50_seconds: float | None = field(metadata=_REFRESH)
    """Median latency over the statistics window; None without a sample."""
    window_latency_p95_seconds: float | None = field(metadata=_REFRESH)
    """95th percentile latency over the statistics window; None without a sample."""
    window_latency_p99_seconds: float | None = field(metadata=_REFRESH)
    """99th percentile latency over the statistics window; None without a sample."""
    health_state: str = field(metadata=_REFRESH)
    """``healthy``, ``warming``, ``slow`` or ``erroring``."""
    health_penalty: float = field(metadata=_REFRESH)
    """Multiplier of the host's load score from its health: 1 when healthy, more when not
    (a warming host's decreases refresh by refresh)."""
    health_reason: str = field(metadata=_REFRESH)
    """Why the host is in its health state, with the numbers (latencies in seconds); empty
    before the first verdict."""
    health_state_age_seconds: float | None = field(metadata=_NOW)
    """How long the host has been in ``health_state``, at ``taken_seconds``; None before
    the first verdict."""
    rack_penalty: float = field(metadata=_REFRESH)
    """Multiplier of the host's load score from its rack: 1 in the client's rack (or when
    none is known), else ``non_local_rack_penalty`` x the rack's measured proximity."""
    requests_total: int = field(metadata=_LIFETIME)
    """Attempts that ended with an outcome (success, error or timeout)."""
    errors_total: int = field(metadata=_LIFETIME)
    """Attempts that failed (timeouts not included)."""
    timeouts_total: int = field(metadata=_LIFETIME)
    """Attempts that timed out."""
    abandons_total: int = field(metadata=_LIFETIME)
    """Attempts released without an outcome (another attempt won, or shutdown)."""
    unsent_total: int = field(metadata=_LIFETIME)
    """Attempts counted in flight that the driver then could not write to the host."""
    probes_sent_total: int = field(metadata=_LIFETIME)
    """adaptive-lb's own probes sent to the host (``health.probe_interval``), counted apart
    from the user's attempts above: none of them is in any other count of this host."""
    probes_answered_total: int = field(metadata=_LIFETIME)
    """Probes the host answered."""
    probes_failed_total: int = field(metadata=_LIFETIME)
    """Probes that failed (an error answer, or the connection broke)."""
    probes_timeouts_total: int = field(metadata=_LIFETIME)
    """Probes not answered within ``health.probe_timeout``."""
    probes_unsent_total: int = field(metadata=_LIFETIME)
    """Probes the driver had no connection to send on."""
    probe_latency_seconds: float | None = field(metadata=_NOW)
    """How long the last answered probe took; None before one answered."""
    probe_reason: str = field(metadata=_NOW)
    """Why the last probe was sent; empty before the first."""
    server_load: float = field(metadata=_REFRESH)
    """Multiplier of the host's load score from the server's own view of its load
    (``health.server_load``): 1 without a fresh reading, up to ``health.server_load.cap``."""
    server_pressure: float | None = field(metadata=_NOW)
    """The host's smoothed pressure: at its busiest watched thread pool, (active + pending +
    blocked tasks) / the pool's thread limit; None without a reading (ScyllaDB, Cassandra
    3.x, no read yet)."""
    server_pressure_pool: str = field(metadata=_NOW)
    """The pool under the most pressure at the last reading; empty before one."""
    server_load_excess: float = field(metadata=_REFRESH)
    """The smoothed pressure minus the median of the other local hosts': what the factor is
    made from (0 without a fresh reading or a peer with one)."""
    server_load_source: str = field(metadata=_NOW)
    """``thread_pools`` (read), ``unknown`` (not read yet), or ``none: why`` (the host has
    no such table, or it may not be read: the probe's round trip and the user's requests
    are the signal)."""
    server_load_reads_total: int = field(metadata=_LIFETIME)
    """Thread-pool reads sent to the host (counted apart from the user's attempts)."""
    server_load_read_failures_total: int = field(metadata=_LIFETIME)
    """Thread-pool reads that timed out, failed or could not be sent."""
    latency_factor: float = field(metadata=_REFRESH)
    """Multiplier of the host's load score from the latency it shows
    (``health.latency_factor``): how surely slower than its peers it answers, beyond the
    dead band, decaying with time; 1 = none, up to ``health.latency_factor.cap``."""
    latency_ratio: float | None = field(metadata=_REFRESH)
    """The host's median latency over its peers' median at the last refresh; None without
    an answer in the window or a peer with a few."""
    latency_ratio_low: float | None = field(metadata=_REFRESH)
    """The lower confidence bound of that ratio (``health.latency_factor.certainty``
    standard errors): what the factor is made from while the window holds the evidence."""

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON-able data: ``{field name: value}``."""
        result: dict[str, Any] = _converter().unstructure(self)
        return result

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> HostSnapshot:
        """The snapshot :meth:`to_dict` gave ``data`` for (e.g. after ``json.loads``)."""
        return _converter().structure(data, cls)


@define(frozen=True, slots=True)
class PolicySnapshot:
    """The whole policy: its counters, the config in force and every known host. See
    ``docs/observability.md``, "The snapshot"."""

    taken_seconds: float = field(metadata=_NOW)
    """When the snapshot was taken, on the policy's monotonic clock: only differences
    between two snapshots mean something (a rate is the difference of a ``*_total`` over
    the difference of ``taken_seconds``)."""
    config_hash: str = field(metadata=_NOW)
    """Short content hash of the config in force."""
    enabled: bool = field(metadata=_CONFIG)
    """The policy orders plans by load and health (``policy.enabled``). False: every plan
    is exactly the child policy's own, while tracking, health and every other number here
    keep running, to compare with."""
    window_seconds: float = field(metadata=_CONFIG)
    """Length of the statistics window (``tracking.window``) behind the ``window_*``
    fields."""
    health_refresh_interval_seconds: float = field(metadata=_CONFIG)
    """Time between health refreshes (``health.refresh_interval``): how stale the
    ``window_*`` and ``health_*`` fields can be while refreshes run."""
    health_refreshes: int = field(metadata=_LIFETIME)
    """Health refreshes done; 0 means every ``window_*`` field is still empty."""
    request_tracking: bool = field(metadata=_NOW)
    """Request tracking is attached (``adaptive_lb.attach`` or ``instrument``): while
    False every host looks idle and unmeasured."""
    untracked_plans: int = field(metadata=_LIFETIME)
    """Plans made while no request tracking was attached."""
    tracking_requests: int = field(metadata=_LIFETIME)
    """Requests request tracking saw for this policy, tracked or not
    (:mod:`adaptive_lb.sampling`)."""
    tracked_one_in: int = field(metadata=_NOW)
    """One request in this many is tracked (its attempts timed, their outcomes recorded
    in the ``window_*`` fields and ``*_total`` counters): 1 while traffic is within
    ``tracking.samples_per_host`` per local host per second."""
    in_flight_from_pools: bool = field(metadata=_NOW)
    """``in_flight`` is the driver's count of each host's connection pool (False: the
    tracked attempts, counted by adaptive-lb)."""
    forked_from_pid: int | None = field(metadata=_LIFETIME)
    """Set in a process forked after the policy was made: the pid of the process it came
    from, whose connections and tracking stayed there (docs/deployment.md); None: not."""
    local_rack: str | None = field(metadata=_REFRESH)
    """The client's rack in force (hosts elsewhere get the rack penalty); None: none known
    yet, no rack penalty."""
    local_rack_source: str = field(metadata=_REFRESH)
    """Where ``local_rack`` comes from: ``configured`` (``policy.local_rack``), ``child``
    (the child policy's), ``learned`` (``local_rack: auto``, from measured latency) or
    ``unknown``."""
    untracked_attempts: int = field(metadata=_LIFETIME)
    """Attempts sent to a host the policy does not know (removed, or never seen): not
    counted in any host."""
    unknown_host_events: int = field(metadata=_LIFETIME)
    """Up / down events for hosts the policy does not know: ignored."""
    decisions_by_position: dict[str, int] = field(metadata=_LIFETIME, hash=False)
    """Plans made, by the origin of their first host: ``replica``, ``non_replica``,
    ``local``, ``child``, ``fallback``."""
    replica_cache_size: int = field(metadata=_NOW)
    """Entries in the replica cache."""
    replica_cache_hits: int = field(metadata=_LIFETIME)
    """Replica lookups answered by the cache."""
    replica_cache_misses: int = field(metadata=_LIFETIME)
    """Replica lookups the cache could not answer."""
    replica_cache_bypassed: int = field(metadata=_LIFETIME)
    """Replica lookups resolved without the cache: it had stepped aside because it hit too
    rarely to pay, its size is 0, or the key was too long to keep."""
    replica_cache_evictions: int = field(metadata=_LIFETIME)
    """Entries evicted from the full replica cache."""
    replica_cache_invalidations: int = field(metadata=_LIFETIME)
    """Times the replica cache was emptied (topology or schema changes)."""
    internal_errors: int = field(metadata=_LIFETIME)
    """Exceptions caught inside adaptive-lb, every stage together."""
    internal_errors_by_stage: dict[str, int] = field(metadata=_LIFETIME, hash=False)
    """``internal_errors`` by stage (every stage listed, zeros included)."""
    plan_fallbacks: int = field(metadata=_LIFETIME)
    """Plans answered with the child's plan after an internal error (stage ``plan``)."""
    config_reloads: dict[str, int] = field(metadata=_LIFETIME, hash=False)
    """Config reloads by result: ``success``, ``failure``."""
    hosts: tuple[HostSnapshot, ...] = field(metadata=_NOW)
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
        hosts = []
        for view in policy.topology.by_id.values():
            host = view.host
            stats = view.stats
            probes = stats.probes
            load = stats.load
            latency_record = stats.latency
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
                    window_requests=window.requests if window is not None else 0,
                    window_errors=window.errors if window is not None else 0,
                    window_timeouts=window.timeouts if window is not None else 0,
                    window_error_rate=window.error_rate if window is not None else 0.0,
                    window_samples=window.samples if window is not None else 0,
                    window_latency_p50_seconds=latency.get(50.0),
                    window_latency_p95_seconds=latency.get(95.0),
                    window_latency_p99_seconds=latency.get(99.0),
                    health_state=stats.health_state.value,
                    health_penalty=stats.health_penalty,
                    health_reason=verdict.reason if verdict is not None else "",
                    health_state_age_seconds=(
                        max(0, now_ns - verdict.since_ns) / _NS if verdict is not None else None
                    ),
                    rack_penalty=stats.rack_penalty,
                    requests_total=stats.requests_total,
                    errors_total=stats.errors_total,
                    timeouts_total=stats.timeouts_total,
                    abandons_total=stats.abandons_total,
                    unsent_total=stats.unsent_total,
                    probes_sent_total=probes.sent,
                    probes_answered_total=probes.answered,
                    probes_failed_total=probes.failed,
                    probes_timeouts_total=probes.timed_out,
                    probes_unsent_total=probes.unsent,
                    probe_latency_seconds=probes.last_latency_s,
                    probe_reason=probes.reason,
                    server_load=stats.server_load,
                    server_pressure=load.pressure,
                    server_pressure_pool=load.pool,
                    server_load_excess=load.excess,
                    server_load_source=_load_source(load.supported, load.unsupported_reason),
                    server_load_reads_total=load.sent,
                    server_load_read_failures_total=load.failed,
                    latency_factor=stats.latency_factor,
                    latency_ratio=latency_record.ratio,
                    latency_ratio_low=latency_record.low,
                )
            )
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
        result: dict[str, Any] = _converter().unstructure(self)
        return result

    def to_json(self, indent: int | None = None) -> str:
        """``json.dumps(self.to_dict(), indent=indent)``."""
        return json.dumps(self.to_dict(), indent=indent)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> PolicySnapshot:
        """The snapshot :meth:`to_dict` gave ``data`` for (e.g. after ``json.loads``)."""
        return _converter().structure(data, cls)


def _load_source(supported: bool | None, reason: str) -> str:
    """``server_load_source`` of a host (see :class:`HostSnapshot`)."""
    if supported is None:
        return "unknown"
    return "thread_pools" if supported else f"none: {reason}"


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
