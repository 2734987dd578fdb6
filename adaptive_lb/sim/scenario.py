"""Scenario files: what cluster, network, workload and faults a simulation runs.

A scenario is YAML (``adaptive_lb/data/scenarios/*.yaml``) mapped onto the frozen attrs
classes below and validated like the main config: every problem is reported at once, each
with its key path, in one :class:`adaptive_lb.config.ConfigError`::

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
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import attrs
import yaml
from attrs import define, field

from adaptive_lb.config import Config, ConfigError

__all__ = [
    "CONSISTENCY_LEVELS",
    "DEFAULT_LATENCY_US",
    "FAULT_KINDS",
    "POLICY_NAMES",
    "FaultSpec",
    "KeysSpec",
    "NetworkSpec",
    "NodesSpec",
    "Scenario",
    "TopologySpec",
    "WorkloadSpec",
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
FAULT_KINDS = ("slow", "pause", "down", "errors", "timeouts", "busy")
POLICY_NAMES = ("token-aware", "round-robin", "adaptive", "latency-aware", "slow-replica")
"""Policies the simulator knows (see :mod:`adaptive_lb.sim.policies`)."""


# ---------------------------------------------------------------------------- validators


def _number(instance: Any, attribute: Any, value: Any) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"must be a number, got {value!r}")
    if value != value or value in (float("inf"), float("-inf")):
        raise ValueError(f"must be a finite number, got {value!r}")


def _integer(instance: Any, attribute: Any, value: Any) -> None:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"must be an integer, got {value!r}")


def _ge(bound: float):
    def check(instance: Any, attribute: Any, value: Any) -> None:
        if not value >= bound:
            raise ValueError(f"must be >= {bound}, got {value!r}")

    return check


def _gt(bound: float):
    def check(instance: Any, attribute: Any, value: Any) -> None:
        if not value > bound:
            raise ValueError(f"must be > {bound}, got {value!r}")

    return check


def _le(bound: float):
    def check(instance: Any, attribute: Any, value: Any) -> None:
        if not value <= bound:
            raise ValueError(f"must be <= {bound}, got {value!r}")

    return check


def _one_of(choices: tuple[str, ...]):
    def check(instance: Any, attribute: Any, value: Any) -> None:
        if value not in choices:
            raise ValueError(f"must be one of {', '.join(choices)}; got {value!r}")

    return check


def _string(instance: Any, attribute: Any, value: Any) -> None:
    if not isinstance(value, str):
        raise TypeError(f"must be a string, got {value!r}")


def _optional(*checks: Any):
    def check(instance: Any, attribute: Any, value: Any) -> None:
        if value is not None:
            for c in checks:
                c(instance, attribute, value)

    return check


def _datacenters(instance: Any, attribute: Any, value: Any) -> None:
    if not isinstance(value, Mapping) or not value:
        raise TypeError(f"must map datacenter names to {{zone: nodes}}, got {value!r}")
    for dc, zones in value.items():
        if not isinstance(zones, Mapping) or not zones:
            raise TypeError(f"{dc}: must map zone names to node counts, got {zones!r}")
        for zone, count in zones.items():
            if isinstance(count, bool) or not isinstance(count, int) or count < 1:
                raise ValueError(f"{dc}.{zone}: must be an integer >= 1, got {count!r}")


def _replication(instance: Any, attribute: Any, value: Any) -> None:
    if isinstance(value, int) and not isinstance(value, bool):
        if value < 1:
            raise ValueError(f"must be >= 1, got {value!r}")
        return
    if not isinstance(value, Mapping):
        raise TypeError(f"must be an RF or a {{datacenter: RF}} mapping, got {value!r}")
    for dc, rf in value.items():
        if isinstance(rf, bool) or not isinstance(rf, int) or rf < 1:
            raise ValueError(f"{dc}: must be an integer >= 1, got {rf!r}")


def _matrix(instance: Any, attribute: Any, value: Any) -> None:
    if value is None:
        return
    if not isinstance(value, Mapping):
        raise TypeError(f"must map zone -> zone -> microseconds, got {value!r}")
    for src, row in value.items():
        if not isinstance(row, Mapping):
            raise TypeError(f"{src}: must map zone -> microseconds, got {row!r}")
        for dst, us in row.items():
            if isinstance(us, bool) or not isinstance(us, (int, float)) or us < 0:
                raise ValueError(f"{src}.{dst}: must be a number >= 0, got {us!r}")


def _policies(instance: Any, attribute: Any, value: Any) -> None:
    if not isinstance(value, (list, tuple)) or not value:
        raise TypeError(f"must be a non-empty list of policy names, got {value!r}")
    for name in value:
        if name not in POLICY_NAMES:
            raise ValueError(f"unknown policy {name!r}; known: {', '.join(POLICY_NAMES)}")
    if len(set(value)) != len(value):
        raise ValueError(f"lists a policy twice: {value!r}")


# ---------------------------------------------------------------------------- classes


@define(frozen=True, slots=True)
class TopologySpec:
    """Datacenters -> zones (racks) -> node counts, and the keyspace's replication."""

    datacenters: dict[str, dict[str, int]] = field(
        factory=lambda: {"dc1": {"A": 4, "B": 4, "C": 4}}, validator=_datacenters
    )
    """``{dc: {zone: nodes}}``; zone names are unique across datacenters."""
    replication: int | dict[str, int] = field(default=3, validator=_replication)
    """RF in every datacenter, or ``{dc: RF}`` (NetworkTopologyStrategy)."""
    vnodes: int = field(default=16, validator=[_integer, _ge(1), _le(256)])
    """Tokens per node."""
    tokens: str = field(default="balanced", validator=_one_of(("balanced", "random")))
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

    latency_us: dict[str, dict[str, float]] | None = field(default=None, validator=_matrix)
    """``{from_zone: {to_zone: us}}``; default :data:`DEFAULT_LATENCY_US` (zones A, B, C)."""
    jitter: float = field(default=0.15, validator=[_number, _ge(0.0), _le(2.0)])
    """Sigma of the lognormal factor each message's latency is multiplied by (0: exact)."""
    inter_dc_us: float = field(default=20_000.0, validator=[_number, _ge(0.0)])
    """One-way latency between zones of different datacenters (when not in the matrix)."""

    def matrix(self) -> dict[str, dict[str, float]]:
        """The latency matrix in force."""
        return self.latency_us if self.latency_us is not None else DEFAULT_LATENCY_US


@define(frozen=True, slots=True)
class NodesSpec:
    """Every node's capacity and speed (faults change one node's)."""

    workers: int = field(default=8, validator=[_integer, _ge(1), _le(1024)])
    """Concurrency limit: tasks served at once; more wait in a FIFO queue."""
    service_median_us: float = field(default=300.0, validator=[_number, _gt(0.0)])
    """Median service time of a replica read (lognormal)."""
    service_sigma: float = field(default=0.5, validator=[_number, _ge(0.0), _le(3.0)])
    """Sigma of the lognormal service time."""
    coordinator_us: float = field(default=40.0, validator=[_number, _ge(0.0)])
    """Work of coordinating one request (parse, route, reply), on the same workers."""
    max_queue: int | None = field(default=None, validator=_optional(_integer, _ge(0)))
    """Queued tasks beyond which a coordinator sheds new requests (Overloaded, a fast
    error); None: unbounded."""


@define(frozen=True, slots=True)
class KeysSpec:
    """Which partitions the requests read."""

    count: int = field(default=10_000, validator=[_integer, _ge(1), _le(10_000_000)])
    distribution: str = field(default="uniform", validator=_one_of(("uniform", "zipf")))
    zipf_exponent: float = field(default=1.1, validator=[_number, _gt(0.0), _le(5.0)])


@define(frozen=True, slots=True)
class WorkloadSpec:
    """The clients: where they run, how they send, at what consistency."""

    consistency: str = field(default="LOCAL_ONE", validator=_one_of(CONSISTENCY_LEVELS))
    mode: str = field(default="closed", validator=_one_of(("closed", "open")))
    """``closed``: each client keeps ``concurrency`` requests outstanding; ``open``: Poisson
    arrivals at ``rate`` (total), whatever the latency."""
    datacenter: str | None = field(default=None, validator=_optional(_string))
    """The clients' datacenter (default: the first)."""
    zones: list[str] | None = field(default=None)
    """Zones with clients (default: every zone of the clients' datacenter)."""
    clients_per_zone: int = field(default=2, validator=[_integer, _ge(1), _le(64)])
    """Application instances per zone, each with its own driver policy objects."""
    concurrency: int = field(default=4, validator=[_integer, _ge(1), _le(4096)])
    """Closed loop: requests each client keeps outstanding."""
    think_time_us: float = field(default=0.0, validator=[_number, _ge(0.0)])
    """Closed loop: mean pause (exponential) between a response and the next request."""
    rate: float = field(default=3000.0, validator=[_number, _gt(0.0)])
    """Open loop: requests per second from all clients together."""
    keys: KeysSpec = field(factory=KeysSpec)
    request_timeout: float = field(default=2.0, validator=[_number, _gt(0.0)])
    """Client-side timeout, seconds (the attempt is released as a timeout; no retry)."""
    max_attempts: int | None = field(default=None, validator=_optional(_integer, _ge(1)))
    """Attempts per request on fast errors (next host of the plan); None: the whole plan."""


@define(frozen=True, slots=True)
class FaultSpec:
    """One fault on one node, active from ``start`` to ``end`` (None: the end of the run)."""

    kind: str = field(validator=_one_of(FAULT_KINDS))
    """``slow`` (+``extra_ms`` per task), ``pause`` (no progress for ``pause_s`` every
    ``period_s``), ``down`` (down at start, back at end, cold for ``warmup_s``),
    ``errors`` / ``timeouts`` (``fraction`` of requests answered with a fast error / never
    answered), ``busy`` (another tenant's load using ``utilization`` of its CPU: under processor
    sharing our tasks take 1 / (1 - utilization) as long)."""
    node: str = field(validator=_string)
    """``ZONE/INDEX``, e.g. ``A/0``."""
    start: float = field(default=0.0, validator=[_number, _ge(0.0)])
    end: float | None = field(default=None, validator=_optional(_number, _ge(0.0)))
    extra_ms: float = field(default=10.0, validator=[_number, _ge(0.0)])
    pause_s: float = field(default=20.0, validator=[_number, _gt(0.0)])
    period_s: float = field(default=50.0, validator=[_number, _gt(0.0)])
    fraction: float = field(default=1.0, validator=[_number, _ge(0.0), _le(1.0)])
    utilization: float = field(default=0.7, validator=[_number, _ge(0.0), _le(0.95)])
    warmup_s: float = field(default=0.0, validator=[_number, _ge(0.0)])
    """``down``: seconds after its return over which the node's service time goes from
    ``warmup_factor`` x to normal (cold caches)."""
    warmup_factor: float = field(default=1.0, validator=[_number, _ge(1.0)])
    detection_s: float = field(default=0.0, validator=[_number, _ge(0.0)])
    """``down``: delay before the driver sees the node down / up (on_down / on_up)."""

    def __attrs_post_init__(self) -> None:
        if self.end is not None and self.end <= self.start:
            raise ValueError(f"end ({self.end}) must be after start ({self.start})")
        if self.kind == "pause" and self.pause_s >= self.period_s:
            raise ValueError(f"pause_s ({self.pause_s}) must be < period_s ({self.period_s})")


@define(frozen=True, slots=True)
class Scenario:
    """A whole simulation: cluster, network, nodes, workload, faults, policies compared."""

    name: str = field(validator=_string)
    description: str = field(default="", validator=_string)
    seed: int = field(default=1, validator=_integer)
    requests: int = field(default=30_000, validator=[_integer, _ge(1), _le(100_000_000)])
    """Measured requests per policy (issued after ``warmup``)."""
    warmup: float = field(default=0.5, validator=[_number, _ge(0.0)])
    """Virtual seconds at the start whose requests are not measured."""
    max_duration: float = field(default=600.0, validator=[_number, _gt(0.0)])
    """No request is issued after this many virtual seconds."""
    topology: TopologySpec = field(factory=TopologySpec)
    network: NetworkSpec = field(factory=NetworkSpec)
    nodes: NodesSpec = field(factory=NodesSpec)
    workload: WorkloadSpec = field(factory=WorkloadSpec)
    faults: list[FaultSpec] = field(factory=list, metadata={"list_of": FaultSpec})
    policies: list[str] = field(factory=lambda: list(POLICY_NAMES), validator=_policies)
    adaptive_lb: Config = field(factory=Config, metadata={"config": True})
    """adaptive-lb's own config for this scenario (same keys as the main YAML file)."""

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


# ---------------------------------------------------------------------------- loading


def _reason(exc: BaseException, name: str) -> str:
    text = str(exc)
    for prefix in (f"{name}: ", f"'{name}' "):
        if text.startswith(prefix):
            return text[len(prefix) :]
    return text


def _build(cls: type, data: Any, path: str, errors: list[str]) -> Any:
    """Build attrs class ``cls`` from ``data``; append every problem to ``errors``."""
    if data is None:
        data = {}
    if not isinstance(data, Mapping):
        errors.append(f"{path or '<top>'}: must be a mapping, got {data!r}")
        return None
    attrs.resolve_types(cls)
    fields = {f.name: f for f in attrs.fields(cls)}
    prefix = f"{path}." if path else ""
    for key in data:
        if key not in fields:
            errors.append(f"{prefix}{key}: unknown key (known: {', '.join(fields)})")
    kwargs: dict[str, Any] = {}
    ok = True
    for name, fld in fields.items():
        if name not in data:
            if fld.default is attrs.NOTHING:
                errors.append(f"{prefix}{name}: required")
                ok = False
            continue
        value = data[name]
        where = f"{prefix}{name}"
        if fld.metadata.get("config"):
            value = _build_config(value, where, errors)
            ok = ok and value is not None
        elif "list_of" in fld.metadata:
            if not isinstance(value, list):
                errors.append(f"{where}: must be a list, got {value!r}")
                ok = False
                continue
            items = [
                _build(fld.metadata["list_of"], item, f"{where}[{i}]", errors)
                for i, item in enumerate(value)
            ]
            value = items
            ok = ok and all(item is not None for item in items)
        elif isinstance(fld.type, type) and attrs.has(fld.type):
            value = _build(fld.type, value, where, errors)
            ok = ok and value is not None
        elif fld.validator is not None:
            try:
                fld.validator(None, fld, value)
            except (TypeError, ValueError) as exc:
                errors.append(f"{where}: {_reason(exc, name)}")
                ok = False
                continue
        kwargs[name] = value
    if not ok:
        return None
    try:
        return cls(**kwargs)
    except (TypeError, ValueError) as exc:
        errors.append(f"{path or '<top>'}: {exc}")
        return None


def _build_config(data: Any, path: str, errors: list[str]) -> Config | None:
    """adaptive-lb's own config: through :mod:`adaptive_lb.config`'s loader when it has
    one (``config_from_mapping``), else with this module's structured loader."""
    from adaptive_lb import config as config_module

    from_mapping = getattr(config_module, "config_from_mapping", None)
    if from_mapping is not None:
        try:
            return from_mapping(data or {})
        except ConfigError as exc:
            errors.extend(f"{path}.{e}" for e in exc.errors)
            return None
    return _build(Config, data, path, errors)


def _cross_checks(scenario: Scenario, errors: list[str]) -> None:
    zones = scenario.zones()
    seen: dict[str, str] = {}
    for dc, dc_zones in scenario.topology.datacenters.items():
        for zone in dc_zones:
            if zone in seen:
                errors.append(f"topology.datacenters.{dc}.{zone}: zone also in {seen[zone]}")
            seen[zone] = dc
    replication = scenario.topology.replication
    if isinstance(replication, Mapping):
        for dc in replication:
            if dc not in scenario.topology.datacenters:
                errors.append(f"topology.replication.{dc}: unknown datacenter")
    matrix = scenario.network.matrix()
    for src in zones:
        for dst in zones:
            if zones[src] == zones[dst] and dst not in matrix.get(src, {}):
                errors.append(f"network.latency_us.{src}.{dst}: missing (zones of one DC)")
    for src, row in matrix.items():
        if src not in zones:
            errors.append(f"network.latency_us.{src}: unknown zone")
        for dst in row:
            if dst not in zones:
                errors.append(f"network.latency_us.{src}.{dst}: unknown zone")
    workload = scenario.workload
    if workload.datacenter is not None and workload.datacenter not in scenario.topology.datacenters:
        errors.append(f"workload.datacenter: unknown datacenter {workload.datacenter!r}")
    elif workload.zones is not None:
        if not isinstance(workload.zones, list) or not workload.zones:
            errors.append(f"workload.zones: must be a non-empty list, got {workload.zones!r}")
        else:
            for i, zone in enumerate(workload.zones):
                if zones.get(zone) != scenario.client_datacenter:
                    errors.append(
                        f"workload.zones[{i}]: {zone!r} is not a zone of "
                        f"{scenario.client_datacenter}"
                    )
    if scenario.topology.rf(scenario.client_datacenter) < 1:
        errors.append(
            f"topology.replication: no replica in the clients' datacenter "
            f"{scenario.client_datacenter}"
        )
    for i, fault in enumerate(scenario.faults):
        zone, _, index = fault.node.partition("/")
        dc = zones.get(zone)
        if dc is None or not index.isdigit():
            errors.append(f"faults[{i}].node: {fault.node!r} is not ZONE/INDEX of a known zone")
        elif int(index) >= scenario.topology.datacenters[dc][zone]:
            errors.append(
                f"faults[{i}].node: zone {zone} has {scenario.topology.datacenters[dc][zone]} "
                f"nodes (0-based index), got {index}"
            )


def parse_scenario(data: Any, *, source: str | None = None) -> Scenario:
    """A :class:`Scenario` from parsed YAML; :class:`ConfigError` lists every problem."""
    errors: list[str] = []
    scenario = _build(Scenario, data, "", errors)
    if scenario is not None:
        _cross_checks(scenario, errors)
    if errors or scenario is None:
        raise ConfigError(errors or ["invalid scenario"], source=source)
    return scenario


def load_scenario(path: str | os.PathLike[str]) -> Scenario:
    """Read and validate one scenario file."""
    source = str(path)
    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError(f"cannot read: {exc}", source=source) from exc
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise ConfigError(f"not valid YAML: {exc}", source=source) from exc
    return parse_scenario(data, source=source)


def scenario_dir() -> Path | None:
    """Where the stock scenarios are: ``adaptive_lb/data/scenarios``, shipped in the
    package (one copy, the same for a checkout and a ``pip install``). None if the folder
    is missing (a broken install)."""
    directory = Path(__file__).resolve().parents[1] / "data" / "scenarios"
    return directory if directory.is_dir() else None
