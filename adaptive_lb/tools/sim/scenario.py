"""Scenario files: what cluster, network, workload and faults a simulation runs.

A scenario is YAML (``adaptive_lb/tools/sim/scenarios/*.yaml``) mapped onto the frozen attrs
classes below and read with the main config's toolkit (:mod:`adaptive_lb.config`): the same
hardened YAML loader and limits, the same validators, every problem reported at once, each
as ``path.to.key: reason (line N)`` with the closest valid key for an unknown one, in one
:class:`adaptive_lb.config.ConfigError`::

    name: slow-coordinator
    requests: 30000
    topology: {datacenters: {dc1: {A: 4, B: 4, C: 4}}, replication: 3}
    network: {jitter: 0.15}            # latency_us: the default zone matrix below
    nodes: {workers: 8, service_median_us: 300, service_sigma: 0.5}
    workload: {consistency: LOCAL_ONE, mode: open, rate: 3000}
    faults:
      - {kind: slow, node: A/0, extra_ms: 10}
    adaptive_lb: {health: {min_samples: 50}}     # overrides of adaptive-lb's config

Zones are the driver's racks (a host's ``rack`` is its zone name). Nodes are named
``ZONE/INDEX`` (``A/0`` is the first node of zone A). Times are virtual seconds from the
start of the run, latencies microseconds (``_us``) or milliseconds (``_ms``).

Imports attrs, the config's toolkit and the simulator's scenario checks and fleet only.
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from attrs import define, field

from adaptive_lb.config import Config
from adaptive_lb.config import validation as check
from adaptive_lb.config.errors import show
from adaptive_lb.config.loader import load_document
from adaptive_lb.config.safe_yaml import read_text
from adaptive_lb.config.structure import structure
from adaptive_lb.tools.sim import scenario_checks
from adaptive_lb.tools.sim.fleet import FleetSpec

__all__ = [
    "CONSISTENCY_LEVELS",
    "DEFAULT_LATENCY_US",
    "DEFAULT_POLICIES",
    "FAULT_KINDS",
    "POLICY_NAMES",
    "ClientPausesSpec",
    "FaultSpec",
    "KeysSpec",
    "NetworkSpec",
    "NodesSpec",
    "Scenario",
    "TopologySpec",
    "WorkloadSpec",
    "cross_checks",
    "load_scenario",
    "parse_scenario",
    "scenario_dir",
]

DEFAULT_LATENCY_US: dict[str, dict[str, float]] = {
    "A": {"A": 150.0, "B": 800.0, "C": 250.0},
    "B": {"A": 800.0, "B": 220.0, "C": 850.0},
    "C": {"A": 380.0, "B": 700.0, "C": 160.0},
}
"""One-way latency between zones (from -> to), microseconds: an asymmetric 3-zone region."""

CONSISTENCY_LEVELS = ("ONE", "LOCAL_ONE", "LOCAL_QUORUM")
FAULT_KINDS = ("slow", "pause", "down", "errors", "timeouts", "busy", "load")
DEFAULT_POLICIES = (
    "token-aware",
    "round-robin",
    "adaptive",
    "latency-aware",
    "slow-replica",
    "p2c",
)
"""Policies a scenario compares unless it lists its own."""
POLICY_NAMES = (*DEFAULT_POLICIES, "adaptive-unset")
"""Policies the simulator knows (see :mod:`adaptive_lb.tools.sim.policies`)."""


@define(frozen=True, slots=True)
class TopologySpec:
    """Datacenters -> zones (racks) -> node counts, and the keyspace's replication."""

    datacenters: dict[str, dict[str, int]] = field(
        factory=lambda: {"dc1": {"A": 4, "B": 4, "C": 4}}, validator=scenario_checks.datacenters
    )
    """``{dc: {zone: nodes}}``; zone names are unique across datacenters."""
    replication: int | dict[str, int] = field(default=3, validator=scenario_checks.replication)
    """RF in every datacenter, or ``{dc: RF}`` (NetworkTopologyStrategy)."""
    vnodes: int = field(default=16, validator=[check.integer, check.ge(1), check.le(256)])
    """Tokens per node."""
    tokens: str = field(default="balanced", validator=check.one_of("balanced", "random"))
    """``balanced``: evenly spaced tokens, racks interleaved, so every node owns the same
    share of each rack's ranges (as Cassandra 4's token allocator and Scylla's many vnodes
    come close to); ``random``: random tokens (uneven ownership)."""

    def rf(self, datacenter: str) -> int:
        """The replication factor in ``datacenter`` (capped at its node count)."""
        nodes = sum(self.datacenters[datacenter].values())
        if isinstance(self.replication, int):
            return min(self.replication, nodes)
        return min(self.replication.get(datacenter, 0), nodes)


@define(frozen=True, slots=True)
class NetworkSpec:
    """One-way latency between zones, with jitter."""

    latency_us: dict[str, dict[str, float]] | None = field(
        default=None, validator=scenario_checks.latency_matrix
    )
    """``{from_zone: {to_zone: us}}``; default :data:`DEFAULT_LATENCY_US` (zones A, B, C)."""
    jitter: float = field(default=0.15, validator=[check.number, check.ge(0.0), check.le(2.0)])
    """Sigma of the lognormal factor each message's latency is multiplied by (0: exact)."""
    inter_dc_us: float = field(default=20_000.0, validator=[check.number, check.ge(0.0)])
    """One-way latency between zones of different datacenters (when not in the matrix)."""

    def matrix(self) -> dict[str, dict[str, float]]:
        """The latency matrix in force."""
        return self.latency_us if self.latency_us is not None else DEFAULT_LATENCY_US


@define(frozen=True, slots=True)
class NodesSpec:
    """Every node's capacity and speed (faults change one node's)."""

    workers: int = field(default=8, validator=[check.integer, check.ge(1), check.le(1024)])
    """Concurrency limit: tasks served at once; more wait in a FIFO queue."""
    service_median_us: float = field(default=300.0, validator=[check.number, check.gt(0.0)])
    """Median service time of a replica read (lognormal)."""
    service_sigma: float = field(
        default=0.5, validator=[check.number, check.ge(0.0), check.le(3.0)]
    )
    """Sigma of the lognormal service time."""
    coordinator_us: float = field(default=40.0, validator=[check.number, check.ge(0.0)])
    """Work of coordinating one request (parse, route, reply), on the same workers."""
    max_queue: int | None = field(
        default=None, validator=check.optional(check.integer, check.ge(0))
    )
    """Queued tasks beyond which a coordinator sheds new requests (Overloaded, a fast
    error); None: unbounded."""
    thread_pools: bool | None = field(default=None, validator=check.optional(check.boolean))
    """What adaptive-lb's server-load read (``system_views.thread_pools``) finds:
    ``true`` (Cassandra 4.0+), each node's worker pool and queue as they are when the read
    is served; ``false`` (ScyllaDB, Cassandra 3.x), no such table (the read fails, the
    host is not read again); unset, no read is simulated (factor 1, as before)."""


@define(frozen=True, slots=True)
class KeysSpec:
    """Which partitions the requests read."""

    count: int = field(default=10_000, validator=[check.integer, check.ge(1), check.le(10_000_000)])
    distribution: str = field(default="uniform", validator=check.one_of("uniform", "zipf"))
    zipf_exponent: float = field(
        default=1.1, validator=[check.number, check.gt(0.0), check.le(5.0)]
    )


@define(frozen=True, slots=True)
class WorkloadSpec:
    """The clients: where they run, how they send, at what consistency."""

    consistency: str = field(default="LOCAL_ONE", validator=check.one_of(*CONSISTENCY_LEVELS))
    mode: str = field(default="closed", validator=check.one_of("closed", "open"))
    """``closed``: each client keeps ``concurrency`` requests outstanding; ``open``: Poisson
    arrivals at ``rate`` (total), whatever the latency."""
    datacenter: str | None = field(default=None, validator=check.optional_string)
    """The clients' datacenter (default: the first)."""
    zones: list[str] | None = field(default=None, validator=scenario_checks.names())
    """Zones with clients (default: every zone of the clients' datacenter)."""
    clients_per_zone: int = field(default=2, validator=[check.integer, check.ge(1), check.le(64)])
    """Application instances per zone, each with its own driver policy objects."""
    concurrency: int = field(default=4, validator=[check.integer, check.ge(1), check.le(4096)])
    """Closed loop: requests each client keeps outstanding."""
    think_time_us: float = field(default=0.0, validator=[check.number, check.ge(0.0)])
    """Closed loop: mean pause (exponential) between a response and the next request."""
    rate: float = field(default=3000.0, validator=[check.number, check.gt(0.0)])
    """Open loop: requests per second from all clients together."""
    keys: KeysSpec = field(factory=KeysSpec)
    request_timeout: float = field(default=2.0, validator=[check.number, check.gt(0.0)])
    """Client-side timeout, seconds (the attempt is released as a timeout; no retry)."""
    max_attempts: int | None = field(
        default=None, validator=check.optional(check.integer, check.ge(1))
    )
    """Attempts per request on fast errors (next host of the plan); None: the whole plan."""


@define(frozen=True, slots=True)
class FaultSpec:
    """One fault on one node, active from ``start`` to ``end`` (None: the end of the run)."""

    kind: str = field(validator=check.one_of(*FAULT_KINDS))
    """``slow`` (+``extra_ms`` per task), ``pause`` (no progress for ``pause_s`` every
    ``period_s``), ``down`` (down at start, back at end, cold for ``warmup_s``),
    ``errors`` / ``timeouts`` (``fraction`` of requests answered with a fast error / never
    answered), ``busy`` (another tenant's load using ``utilization`` of its CPU: under processor
    sharing our tasks take 1 / (1 - utilization) as long), ``load`` (other clients' requests,
    not sent by any simulated client: Poisson arrivals at ``rate`` a second, or at
    ``utilization`` x the node's capacity, each a local read it coordinates, taking its
    workers and queue like any request: :mod:`adaptive_lb.tools.sim.background`)."""
    node: str = field(validator=check.string)
    """``ZONE/INDEX``, e.g. ``A/0``."""
    start: float = field(default=0.0, validator=[check.number, check.ge(0.0)])
    end: float | None = field(default=None, validator=check.optional(check.number, check.ge(0.0)))
    extra_ms: float = field(default=10.0, validator=[check.number, check.ge(0.0)])
    pause_s: float = field(default=20.0, validator=[check.number, check.gt(0.0)])
    period_s: float = field(default=50.0, validator=[check.number, check.gt(0.0)])
    fraction: float = field(default=1.0, validator=[check.number, check.ge(0.0), check.le(1.0)])
    utilization: float = field(default=0.7, validator=[check.number, check.ge(0.0), check.le(0.95)])
    rate: float | None = field(default=None, validator=check.optional(check.number, check.gt(0.0)))
    """``load``: requests a second (default: ``utilization`` x the node's capacity)."""
    warmup_s: float = field(default=0.0, validator=[check.number, check.ge(0.0)])
    """``down``: seconds after its return over which the node's service time goes from
    ``warmup_factor`` x to normal (cold caches)."""
    warmup_factor: float = field(default=1.0, validator=[check.number, check.ge(1.0)])
    detection_s: float = field(default=0.0, validator=[check.number, check.ge(0.0)])
    """``down``: delay before the driver sees the node down / up (on_down / on_up)."""

    def __attrs_post_init__(self) -> None:
        if self.end is not None and self.end <= self.start:
            raise ValueError(f"end: must be > start ({show(self.start)}), got {show(self.end)}")
        if self.kind == "pause" and self.pause_s >= self.period_s:
            raise ValueError(
                f"pause_s: must be < period_s ({show(self.period_s)}), got {show(self.pause_s)}"
            )


@define(frozen=True, slots=True)
class ClientPausesSpec:
    """The clients' own pauses (GC, CPU steal): while paused a client neither handles
    answers nor sends, and its timers fire late (:mod:`adaptive_lb.tools.sim.client_pauses`)."""

    rate: float = field(default=0.0, validator=[check.number, check.ge(0.0), check.le(1000.0)])
    """Pauses a second per paused client (Poisson arrivals); 0: none."""
    min_ms: float = field(default=5.0, validator=[check.number, check.ge(0.0)])
    max_ms: float = field(default=50.0, validator=[check.number, check.ge(0.0)])
    """Each pause lasts a duration drawn uniformly between ``min_ms`` and ``max_ms``."""
    clients: int | None = field(default=None, validator=check.optional(check.integer, check.ge(1)))
    """How many clients are paused (the first ones, zone by zone); None: every client."""
    start: float = field(default=0.0, validator=[check.number, check.ge(0.0)])
    end: float | None = field(default=None, validator=check.optional(check.number, check.ge(0.0)))

    def __attrs_post_init__(self) -> None:
        if self.max_ms < self.min_ms:
            raise ValueError(
                f"max_ms: must be >= min_ms ({show(self.min_ms)}), got {show(self.max_ms)}"
            )


@define(frozen=True, slots=True)
class Scenario:
    """A whole simulation: cluster, network, nodes, workload, faults, policies compared."""

    name: str = field(validator=check.string)
    description: str = field(default="", validator=check.string)
    seed: int = field(default=1, validator=check.integer)
    requests: int = field(
        default=30_000, validator=[check.integer, check.ge(1), check.le(100_000_000)]
    )
    """Measured requests per policy (issued after ``warmup``)."""
    warmup: float = field(default=0.5, validator=[check.number, check.ge(0.0)])
    """Virtual seconds at the start whose requests are not measured."""
    max_duration: float = field(default=600.0, validator=[check.number, check.gt(0.0)])
    """No request is issued after this many virtual seconds."""
    settled_after: float | None = field(
        default=None, validator=check.optional(check.number, check.ge(0.0))
    )
    """When set, the results also give the p50 and cross-zone share of the requests started
    from this many virtual seconds on (``settled``): e.g. once a rack is learned."""
    topology: TopologySpec = field(factory=TopologySpec)
    network: NetworkSpec = field(factory=NetworkSpec)
    nodes: NodesSpec = field(factory=NodesSpec)
    workload: WorkloadSpec = field(factory=WorkloadSpec)
    faults: list[FaultSpec] = field(factory=list, metadata={"list_of": FaultSpec})
    client_pauses: ClientPausesSpec = field(factory=ClientPausesSpec)
    """The clients' own pauses (none by default)."""
    fleet: FleetSpec = field(factory=FleetSpec)
    """A fleet of clients with rates of their own (:mod:`~adaptive_lb.tools.sim.fleet`),
    instead of ``workload.clients_per_zone`` clients sharing ``workload.rate``, when
    ``fleet.clients`` is set."""
    policies: list[str] = field(
        factory=lambda: list(DEFAULT_POLICIES), validator=scenario_checks.names(POLICY_NAMES)
    )
    adaptive_lb: Config = field(factory=Config)
    """adaptive-lb's own config for this scenario (same keys as the main YAML file)."""
    reference: dict[str, float] | None = field(default=None, validator=scenario_checks.reference)
    """adaptive-lb's figures measured before (``{seed, requests, p50_ms, p95_ms, p99_ms}``):
    a run with that seed and request count checks it is no worse by more than 2 %."""

    @property
    def is_fleet(self) -> bool:
        """Whether the clients are a fleet (``fleet.clients`` set)."""
        return self.fleet.clients > 0

    @property
    def client_datacenter(self) -> str:
        """The datacenter the clients run in."""
        return self.workload.datacenter or next(iter(self.topology.datacenters))

    @property
    def client_zones(self) -> list[str]:
        """The zones with clients."""
        if self.workload.zones is not None:
            return list(self.workload.zones)
        return list(self.topology.datacenters[self.client_datacenter])

    def zones(self) -> dict[str, str]:
        """Zone -> its datacenter."""
        return {z: dc for dc, zones in self.topology.datacenters.items() for z in zones}


def cross_checks(scenario: Scenario) -> Iterator[tuple[str, str]]:
    """Checks across keys: ``(key path, reason)`` per problem."""
    zones = scenario.zones()
    seen: dict[str, str] = {}
    for dc, dc_zones in scenario.topology.datacenters.items():
        for zone in dc_zones:
            if zone in seen:
                yield f"topology.datacenters.{dc}.{zone}", f"zone also in {seen[zone]}"
            seen[zone] = dc
    replication = scenario.topology.replication
    if isinstance(replication, Mapping):
        for dc in replication:
            if dc not in scenario.topology.datacenters:
                yield f"topology.replication.{dc}", "unknown datacenter"
    matrix = scenario.network.matrix()
    for src in zones:
        for dst in zones:
            if zones[src] == zones[dst] and dst not in matrix.get(src, {}):
                yield f"network.latency_us.{src}.{dst}", "missing (zones of one datacenter)"
    for src, row in matrix.items():
        if src not in zones:
            yield f"network.latency_us.{src}", "unknown zone"
        for dst in row:
            if dst not in zones:
                yield f"network.latency_us.{src}.{dst}", "unknown zone"
    workload = scenario.workload
    client_dc = scenario.client_datacenter
    if workload.datacenter is not None and workload.datacenter not in scenario.topology.datacenters:
        yield "workload.datacenter", f"unknown datacenter {show(workload.datacenter)}"
    elif workload.zones is not None:
        for i, zone in enumerate(workload.zones):
            if zones.get(zone) != client_dc:
                yield f"workload.zones[{i}]", f"{show(zone)} is not a zone of {client_dc}"
    if client_dc in scenario.topology.datacenters and scenario.topology.rf(client_dc) < 1:
        yield "topology.replication", f"no replica in the clients' datacenter {client_dc}"
    for i, fault in enumerate(scenario.faults):
        zone, _, index = fault.node.partition("/")
        fault_dc = zones.get(zone)
        if fault_dc is None or not index.isdigit():
            yield f"faults[{i}].node", f"{show(fault.node)} is not ZONE/INDEX of a known zone"
        elif int(index) >= scenario.topology.datacenters[fault_dc][zone]:
            count = scenario.topology.datacenters[fault_dc][zone]
            yield f"faults[{i}].node", f"zone {zone} has {count} nodes (0-based index), got {index}"


SECRET_KEYS = check.flagged_paths(Scenario, "secret")
"""Key paths of the secrets in a scenario (those of its ``adaptive_lb`` config)."""


def parse_scenario(data: Any, *, source: str | None = None) -> Scenario:
    """A :class:`Scenario` from parsed YAML; :class:`ConfigError` lists every problem."""
    return structure(Scenario, data, source, secret_keys=SECRET_KEYS, check=cross_checks)


def load_scenario(path: str | os.PathLike[str]) -> Scenario:
    """Read and validate one scenario file (as the config file is read: same limits, every
    problem with its key path and line)."""
    text = read_text(path)
    return load_document(
        Scenario, text, os.fspath(path), secret_keys=SECRET_KEYS, check=cross_checks
    )


def scenario_dir() -> Path | None:
    """Where the stock scenarios are: ``adaptive_lb/tools/sim/scenarios``, shipped in the
    package (one copy, the same for a checkout and a ``pip install``). None if the folder
    is missing (a broken install)."""
    directory = Path(__file__).resolve().parent / "scenarios"
    return directory if directory.is_dir() else None
