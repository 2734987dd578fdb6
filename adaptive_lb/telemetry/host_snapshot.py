"""One host in a snapshot of the policy (:class:`HostSnapshot`), and the vocabulary every
snapshot field shares: when its number was made (:data:`AS_OF`) and how a snapshot becomes
plain JSON-able data.

:mod:`adaptive_lb.telemetry.snapshot` assembles the whole policy's snapshot from these; the naming
rules of its fields are stated there. Taking a host's snapshot reads numbers already
computed (the health model's last window statistics, plain counters), never a percentile.

May import: attrs and cattrs; the statistics, health and scoring modules for their types
only (under ``TYPE_CHECKING``). No driver import: a host is read through its attributes.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from attrs import define, field

if TYPE_CHECKING:
    import cattrs

    from adaptive_lb.health.model import HealthModel
    from adaptive_lb.plan.scoring import HostView
    from adaptive_lb.stats.host import HostStats

__all__ = ["AS_OF", "CONFIG", "LIFETIME", "NOW", "REFRESH", "HostSnapshot", "converter"]

AS_OF = {
    "now": "read when the snapshot is taken",
    "refresh": "as of the last health refresh (every health.refresh_interval)",
    "lifetime": "counted since the host was first seen, or the policy was made; never goes down",
    "config": "from the config in force",
}
"""The values of each snapshot field's ``metadata["as_of"]``: when its number was made."""

# The metadata of a snapshot field, by AS_OF key.
NOW = {"as_of": "now"}
REFRESH = {"as_of": "refresh"}
LIFETIME = {"as_of": "lifetime"}
CONFIG = {"as_of": "config"}

_NS = 1_000_000_000


@functools.cache
def converter() -> cattrs.Converter:
    """The converter between snapshots and plain data. Made (and cattrs imported) on first
    use: importing the policy stays cheap. Tuples become lists, so that
    ``to_dict() == json.loads(json.dumps(to_dict()))``."""
    import cattrs

    return cattrs.Converter(unstruct_collection_overrides={Sequence: list})


@define(frozen=True, slots=True)
class HostSnapshot:
    """One host as the policy sees it. See ``docs/observability.md``, "The snapshot"."""

    address: str = field(metadata=NOW)
    """The host's address (``str(host.address)``)."""
    port: int | None = field(metadata=NOW)
    """The host's port, when its endpoint has one."""
    datacenter: str | None = field(metadata=NOW)
    """The host's datacenter, as the driver's metadata says."""
    rack: str | None = field(metadata=NOW)
    """The host's rack, as the driver's metadata says."""
    is_local: bool = field(metadata=NOW)
    """The child policy's distance is LOCAL or LOCAL_RACK: the host can be a candidate."""
    live: bool = field(metadata=NOW)
    """The driver reports the host up."""
    in_flight: int = field(metadata=NOW)
    """Requests in flight on the host: the driver's count of its connection pool (every
    request, its retries and speculative executions, and streams orphaned by a client
    timeout until the server answers), or the tracked attempts not yet ended when
    ``in_flight_from_pools`` is false."""
    window_requests: int = field(metadata=REFRESH)
    """Attempts that ended with an outcome (success, error or timeout) in the statistics
    window; 0 before the first health refresh that saw the host."""
    window_errors: int = field(metadata=REFRESH)
    """Attempts that failed in the statistics window (timeouts not included)."""
    window_timeouts: int = field(metadata=REFRESH)
    """Attempts that timed out in the statistics window."""
    window_error_rate: float = field(metadata=REFRESH)
    """(window_errors + window_timeouts) / window_requests, 0 without requests: the rate
    the ERRORING rule compares with ``health.error_rate``."""
    window_samples: int = field(metadata=REFRESH)
    """Latency samples in the statistics window, behind the percentiles: successes,
    timeouts and slow errors (a fast error has no latency sample)."""
    window_latency_p50_seconds: float | None = field(metadata=REFRESH)
    """Median latency over the statistics window; None without a sample."""
    window_latency_p95_seconds: float | None = field(metadata=REFRESH)
    """95th percentile latency over the statistics window; None without a sample."""
    window_latency_p99_seconds: float | None = field(metadata=REFRESH)
    """99th percentile latency over the statistics window; None without a sample."""
    health_state: str = field(metadata=REFRESH)
    """``healthy``, ``warming``, ``slow`` or ``erroring``."""
    health_penalty: float = field(metadata=REFRESH)
    """Multiplier of the host's load score from its health: 1 when healthy, more when not
    (a warming host's decreases refresh by refresh)."""
    health_reason: str = field(metadata=REFRESH)
    """Why the host is in its health state, with the numbers (latencies in seconds); empty
    before the first verdict."""
    health_state_age_seconds: float | None = field(metadata=NOW)
    """How long the host has been in ``health_state``, at ``taken_seconds``; None before
    the first verdict."""
    rack_penalty: float = field(metadata=REFRESH)
    """Multiplier of the host's load score from its rack: 1 in the client's rack (or when
    none is known), else ``non_local_rack_penalty`` x the rack's measured proximity."""
    requests_total: int = field(metadata=LIFETIME)
    """Attempts that ended with an outcome (success, error or timeout)."""
    errors_total: int = field(metadata=LIFETIME)
    """Attempts that failed (timeouts not included)."""
    timeouts_total: int = field(metadata=LIFETIME)
    """Attempts that timed out."""
    abandons_total: int = field(metadata=LIFETIME)
    """Attempts released without an outcome (another attempt won, or shutdown)."""
    unsent_total: int = field(metadata=LIFETIME)
    """Attempts counted in flight that the driver then could not write to the host."""
    probes_sent_total: int = field(metadata=LIFETIME)
    """adaptive-lb's own probes sent to the host (``health.probe_interval``), counted apart
    from the user's attempts above: none of them is in any other count of this host."""
    probes_answered_total: int = field(metadata=LIFETIME)
    """Probes the host answered."""
    probes_failed_total: int = field(metadata=LIFETIME)
    """Probes that failed (an error answer, or the connection broke)."""
    probes_timeouts_total: int = field(metadata=LIFETIME)
    """Probes not answered within ``health.probe_timeout``."""
    probes_unsent_total: int = field(metadata=LIFETIME)
    """Probes the driver had no connection to send on."""
    probe_latency_seconds: float | None = field(metadata=NOW)
    """How long the last answered probe took; None before one answered."""
    probe_reason: str = field(metadata=NOW)
    """Why the last probe was sent; empty before the first."""
    server_load: float = field(metadata=REFRESH)
    """Multiplier of the host's load score from the server's own view of its load
    (``health.server_load``): 1 without a fresh reading, up to ``health.server_load.cap``."""
    server_pressure: float | None = field(metadata=NOW)
    """The host's smoothed pressure: at its busiest watched thread pool, (active + pending +
    blocked tasks) / the pool's thread limit; None without a reading (ScyllaDB, Cassandra
    3.x, no read yet)."""
    server_pressure_pool: str = field(metadata=NOW)
    """The pool under the most pressure at the last reading; empty before one."""
    server_load_excess: float = field(metadata=REFRESH)
    """The smoothed pressure minus the median of the other local hosts': what the factor is
    made from (0 without a fresh reading or a peer with one)."""
    server_load_source: str = field(metadata=NOW)
    """``thread_pools`` (read), ``unknown`` (not read yet), or ``none: why`` (the host has
    no such table, or it may not be read: the probe's round trip and the user's requests
    are the signal)."""
    server_load_reads_total: int = field(metadata=LIFETIME)
    """Thread-pool reads sent to the host (counted apart from the user's attempts)."""
    server_load_read_failures_total: int = field(metadata=LIFETIME)
    """Thread-pool reads that timed out, failed or could not be sent."""
    latency_factor: float = field(metadata=REFRESH)
    """Multiplier of the host's load score from the latency it shows
    (``health.latency_factor``): how surely slower than its peers it answers, beyond the
    dead band, decaying with time; 1 = none, up to ``health.latency_factor.cap``."""
    latency_ratio: float | None = field(metadata=REFRESH)
    """The host's median latency over its peers' median at the last refresh; None without
    an answer in the window or a peer with a few."""
    latency_ratio_low: float | None = field(metadata=REFRESH)
    """The lower confidence bound of that ratio (``health.latency_factor.certainty``
    standard errors): what the factor is made from while the window holds the evidence."""

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON-able data: ``{field name: value}``."""
        result: dict[str, Any] = converter().unstructure(self)
        return result

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> HostSnapshot:
        """The snapshot :meth:`to_dict` gave ``data`` for (e.g. after ``json.loads``)."""
        return converter().structure(data, cls)

    @classmethod
    def of(cls, view: HostView[HostStats], health: HealthModel, now_ns: int) -> HostSnapshot:
        """The host of ``view`` now: in-flight as of ``now_ns``, window counts, percentiles
        and health as of ``health``'s last refresh, lifetime counters. Computes no
        percentile."""
        host = view.host
        stats = view.stats
        probes = stats.probes
        load = stats.load
        latency_record = stats.latency
        window = health.windows.get(host)
        verdict = health.health(host)
        latency = window.latency if window is not None else {}
        return cls(
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


def _load_source(supported: bool | None, reason: str) -> str:
    """``server_load_source`` of a host (see :class:`HostSnapshot`)."""
    if supported is None:
        return "unknown"
    return "thread_pools" if supported else f"none: {reason}"
