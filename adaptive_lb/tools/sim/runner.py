"""Run one scenario under one policy, or many (scenario, policy) pairs on worker processes.

A run is a pure function of ``(scenario, policy, seed)``: every random stream is derived
from the seed by name (workload, keys, network, each node, each client's pauses, the driver
policies' own use of the ``random`` module), and worker processes are started with a fixed
``PYTHONHASHSEED`` (the stock ``DCAwareRoundRobinPolicy`` orders hosts through a ``set``,
whose order depends on string hashing). The same seed gives byte-identical JSON; the
cluster, the keys, the open-loop arrivals and the clients' pauses are the same for every
policy of a scenario (common random numbers).

May import the whole simulator but its CLI, attrs and the library's clock.
"""

from __future__ import annotations

import concurrent.futures
import multiprocessing
import os
import random
import time
from collections.abc import Callable, Iterable
from typing import Any

import attrs

from adaptive_lb.core.clock import ManualClock
from adaptive_lb.tools.sim.background import install_background
from adaptive_lb.tools.sim.client_pauses import client_pauses, pause_summary, schedule_tick
from adaptive_lb.tools.sim.driver_side import attach_driver_side
from adaptive_lb.tools.sim.driver_topology import (
    DriverTopology,
    build_topology,
    murmur3_routing_keys,
)
from adaptive_lb.tools.sim.engine import NS_PER_S, Engine
from adaptive_lb.tools.sim.faults import install_faults
from adaptive_lb.tools.sim.fleet import client_rates, clients_per_zone
from adaptive_lb.tools.sim.fleet_load import FleetGenerator
from adaptive_lb.tools.sim.fleet_metrics import fleet_figures
from adaptive_lb.tools.sim.metrics import PolicyResult, Recorder
from adaptive_lb.tools.sim.network import Network
from adaptive_lb.tools.sim.node import Node
from adaptive_lb.tools.sim.policies import LABELS, AdaptiveFeedback, build_policy
from adaptive_lb.tools.sim.scenario import Scenario
from adaptive_lb.tools.sim.servers import SimulatedServers
from adaptive_lb.tools.sim.tracing import RequestTracer, TraceSpec, start_provider
from adaptive_lb.tools.sim.workload import Client, KeyChooser, LoadGenerator, make_statements

__all__ = ["SimulatedCluster", "run_many", "run_policy", "setup"]

_HASH_SEED = "0"


def _rng(seed: int, stream: str) -> random.Random:
    # A str seed is hashed with SHA-512: independent of PYTHONHASHSEED.
    return random.Random(f"{seed}:{stream}")


@attrs.define
class SimulatedCluster:
    """Everything of one run but the clients (exposed for tests): the driver's view of the
    cluster and the simulated servers behind it, on one virtual clock."""

    engine: Engine
    clock: ManualClock
    topology: DriverTopology
    """What the clients' policies see (real driver ``Metadata`` and ``Host`` objects)."""
    nodes: list[Node]
    servers: SimulatedServers
    """What answers the clients' requests."""
    statements: list[Any]

    @property
    def cluster(self) -> SimulatedServers:
        """Old name of :attr:`servers` (kept: tests use it)."""
        return self.servers


def setup(scenario: Scenario, seed: int) -> SimulatedCluster:
    """Build the engine, the driver topology (real hosts, token map), nodes and network."""
    clock = ManualClock(0)
    engine = Engine(clock)
    layout = {dc: list(zones.values()) for dc, zones in scenario.topology.datacenters.items()}
    replication = {dc: scenario.topology.rf(dc) for dc in scenario.topology.datacenters}
    replication = {dc: rf for dc, rf in replication.items() if rf > 0}
    topology = build_topology(
        layout,
        vnodes=scenario.topology.vnodes,
        replication=replication,
        seed=seed,
        real_cluster=False,
    )
    # Racks are the zones: rename r1, r2... to the scenario's zone names.
    nodes: list[Node] = []
    for dc, zones in scenario.topology.datacenters.items():
        hosts = iter(topology.hosts_by_dc[dc])
        for zone, count in zones.items():
            for i in range(count):
                host = next(hosts)
                host.set_location_info(dc, zone)
                node = Node(
                    len(nodes),
                    f"{zone}/{i}",
                    host,
                    zone,
                    dc,
                    scenario.nodes,
                    engine,
                    _rng(seed, f"node:{zone}/{i}"),
                )
                nodes.append(node)
    if scenario.topology.tokens == "balanced":
        _balance_tokens(scenario, topology, nodes, _rng(seed, "tokens"))
    topology.rebuild_token_map()
    network = Network(scenario, _rng(seed, "network"))
    keys = murmur3_routing_keys(scenario.workload.keys.count, seed=seed)
    statements = make_statements(scenario, keys)
    servers = SimulatedServers(scenario, engine, topology, nodes, network, statements)
    return SimulatedCluster(engine, clock, topology, nodes, servers, statements)


def _balance_tokens(
    scenario: Scenario, topology: DriverTopology, nodes: list[Node], rng: random.Random
) -> None:
    """Evenly spaced tokens per datacenter, racks interleaved, each rack's nodes taking
    turns in a shuffled order: every node owns the same share of its rack's ranges."""
    vnodes = scenario.topology.vnodes
    for dc_index, dc in enumerate(scenario.topology.datacenters):
        by_zone: dict[str, list[Node]] = {}
        for node in nodes:
            if node.datacenter == dc:
                by_zone.setdefault(node.zone, []).append(node)
        # Each zone's slots spread evenly over the sequence (weighted interleaving).
        slots = sorted(
            ((k + 0.5) / (len(members) * vnodes), zone)
            for zone, members in by_zone.items()
            for k in range(len(members) * vnodes)
        )
        turns: dict[str, list[Node]] = {zone: [] for zone in by_zone}
        total = len(slots)
        step = 2**64 // total
        offset = dc_index * (step // (len(scenario.topology.datacenters) + 1))
        tokens: dict[Any, list[str]] = {
            node.host: [] for nodes_ in by_zone.values() for node in nodes_
        }
        for j, (_, zone) in enumerate(slots):
            if not turns[zone]:
                turns[zone] = list(by_zone[zone])
                rng.shuffle(turns[zone])
            node = turns[zone].pop()
            tokens[node.host].append(str(-(2**63) + offset + j * step + step // 2))
        topology.tokens.update(tokens)


def run_policy(
    scenario: Scenario,
    policy: str,
    *,
    seed: int | None = None,
    requests: int | None = None,
    trace: TraceSpec | None = None,
) -> PolicyResult:
    """Simulate ``scenario`` with every client using ``policy``; with ``trace``, a sample of
    its requests is exported as spans carrying adaptive-lb's decisions."""
    provider = start_provider(trace) if trace is not None else None
    try:
        return _run_policy(scenario, policy, seed, requests, trace, provider)
    finally:
        if provider is not None:
            provider.shutdown()  # flushes what is queued


def _run_policy(
    scenario: Scenario,
    policy: str,
    seed: int | None,
    requests: int | None,
    trace: TraceSpec | None,
    provider: Any,
) -> PolicyResult:
    started = time.perf_counter()
    seed = scenario.seed if seed is None else seed
    if requests is not None:
        scenario = attrs.evolve(scenario, requests=requests)
    # The driver's policies and adaptive-lb draw from the random module (shuffles, ties).
    random.seed(f"{seed}:policy:{policy}")
    sim = setup(scenario, seed)
    engine = sim.engine
    recorder = Recorder(len(sim.nodes))
    datacenter = scenario.client_datacenter
    kits = []
    clients: list[Client] = []
    local_racks: dict[str, dict[str, Any]] = {}
    policy_rng = _rng(seed, f"policy-rng:{policy}")
    zones = scenario.client_zones
    counts = [scenario.workload.clients_per_zone] * len(zones)
    if scenario.is_fleet:
        counts = clients_per_zone(scenario.fleet, len(zones))
    for zone, count in zip(zones, counts, strict=True):
        for i in range(count):
            kit = build_policy(
                policy,
                datacenter=datacenter,
                zone=zone,
                config=scenario.adaptive_lb,
                clock=sim.clock,
                rng=policy_rng,
                tracer_provider=provider,
            )
            kit.policy.populate(sim.topology.cluster, list(sim.topology.hosts))
            kits.append(kit)
            client = Client(
                f"{zone}-{i}",
                zone,
                kit.policy,
                kit.feedback,
                sim.servers,
                sim.statements,
                recorder,
                scenario.workload,
            )
            pauses_rng = _rng(seed, f"client-pauses:{client.name}")  # the same for every policy
            client.pauses = client_pauses(scenario.client_pauses, len(clients), pauses_rng)
            clients.append(client)
            _wire_client(kit, client, scenario, sim, recorder, seed, local_racks, sum(counts))

    def notify_down(host: Any) -> None:
        for kit in kits:
            kit.policy.on_down(host)

    def notify_up(host: Any) -> None:
        for kit in kits:
            kit.policy.on_up(host)

    if trace is not None:
        tracer = RequestTracer(
            provider,
            trace,
            scenario=scenario.name,
            policy=policy,
            clock=sim.clock,
            expected_requests=scenario.requests,
        )
        for client in clients:
            client.tracer = tracer

    install_faults(scenario, engine, sim.servers, notify_down, notify_up)
    install_background(scenario, engine, sim.nodes, lambda name: _rng(seed, f"load:{name}"))
    keys = KeyChooser(scenario.workload.keys, _rng(seed, "keys"))
    generator: LoadGenerator
    if not scenario.is_fleet:
        generator = LoadGenerator(scenario, engine, clients, keys, _rng(seed, "workload"))
    else:
        rates = client_rates(scenario.fleet, len(zones), _rng(seed, "fleet-rates"))
        generator = FleetGenerator(scenario, engine, clients, keys, _rng(seed, "workload"), rates)
    generator.start()
    horizon = scenario.max_duration + 2 * scenario.workload.request_timeout + 60.0
    engine.run(until_ns=round(horizon * NS_PER_S))
    result = PolicyResult.build(
        policy,
        LABELS[policy],
        recorder,
        sim.nodes,
        datacenter,
        bool(scenario.faults),
        time.perf_counter() - started,
        settled_after=scenario.settled_after,
        local_racks=local_racks or None,
    )
    if isinstance(generator, FleetGenerator):
        fleet = (len(generator.clients), generator.rates.total)
        result.summary["fleet"], result.fleet_series = fleet_figures(
            scenario, recorder, sim.nodes, *fleet
        )
    paused = [client.pauses for client in clients if client.pauses is not None]
    if paused:
        result.summary["client_pauses"] = pause_summary(paused, engine.now)
    return result


def _wire_client(
    kit: Any,
    client: Client,
    scenario: Scenario,
    sim: SimulatedCluster,
    recorder: Recorder,
    seed: int,
    local_racks: dict[str, dict[str, Any]],
    sessions: int,
) -> None:
    """Give ``client`` production's driver side (adaptive-lb) and schedule its policy's
    periodic tick (late after the client's own pauses), its verdicts recorded. In a fleet
    scenario the nodes answer the clients-table reads with the ``sessions`` clients (the
    others leave them out: with a dozen clients the fleet's budget does not bind, and their
    figures stay comparable with earlier runs)."""
    policy, zone, engine = kit.name, client.zone, sim.engine
    if isinstance(kit.feedback, AdaptiveFeedback):
        # Production's rules: in-flight from the pools, a sample tracked, probes.
        rng = _rng(seed, f"probes:{policy}:{client.name}")
        client.pools, _ = attach_driver_side(
            kit.policy,
            zone,
            sim.servers,
            rng,
            scenario.nodes.thread_pools,
            client.pauses,
            sessions if scenario.is_fleet else None,
        )
        client.sampler = kit.policy.sampler
    if kit.tick is not None and kit.tick_interval:
        interval = round(kit.tick_interval * NS_PER_S)
        tick = kit.tick
        if policy in ("adaptive", "adaptive-unset"):
            tick = _recording_verdicts(kit.tick, recorder, sim)
        if policy == "adaptive-unset":
            rack = local_racks[client.name] = {"zone": zone}
            tick = _recording_local_rack(tick, kit.policy, rack, sim)
        schedule_tick(
            engine, interval, tick, start_ns=interval, pauses=client.pauses, policy=kit.policy
        )


def _recording_verdicts(
    tick: Callable[[], Any], recorder: Recorder, sim: SimulatedCluster
) -> Callable[[], None]:
    """``tick`` (an adaptive policy's health refresh), its transitions recorded."""

    def refresh() -> None:
        for transition in tick() or ():
            node = sim.servers.node_of(transition.key)
            new, old = transition.new.state.value, transition.old.state.value
            recorder.verdict(sim.engine.now, node, new, old)

    return refresh


def _recording_local_rack(
    tick: Callable[[], Any], policy: Any, record: dict[str, Any], sim: SimulatedCluster
) -> Callable[[], None]:
    """``tick``, then note the client's local rack in ``record``: the rack in force and its
    source, when it was first learned, how many times it changed."""
    record.update(rack=None, source=policy.local_rack_source, learned_at_s=None, changes=0)

    def refresh() -> None:
        tick()
        rack = policy.local_rack
        if rack != record["rack"]:
            record["changes"] += 1
            if record["learned_at_s"] is None and policy.local_rack_source == "learned":
                record["learned_at_s"] = round(sim.engine.now / 1e9, 2)
        record["rack"], record["source"] = rack, policy.local_rack_source

    return refresh


def _job(args: tuple[Scenario, str, int | None, int | None, TraceSpec | None]) -> PolicyResult:
    scenario, policy, seed, requests, trace = args
    return run_policy(scenario, policy, seed=seed, requests=requests, trace=trace)


def _fleet_cost(scenario: Scenario, policy: str) -> float:
    """A fleet run's cost, roughly (0 for any other run): adaptive-lb's health refresh of
    each client dominates."""
    if not scenario.is_fleet:
        return 0.0
    weight = 20.0 if policy in ("adaptive", "adaptive-unset") else 1.0
    return weight * scenario.fleet.clients * scenario.max_duration


def run_many(
    jobs: Iterable[tuple[Scenario, str]],
    *,
    seed: int | None = None,
    requests: int | None = None,
    workers: int | None = None,
    on_done: Callable[[Scenario, str, PolicyResult], None] | None = None,
    trace: TraceSpec | None = None,
) -> list[PolicyResult]:
    """Run every (scenario, policy) job on ``workers`` spawned processes (default: one per
    CPU) and return the results in job order; ``on_done`` is called as each finishes."""
    jobs = list(jobs)
    workers = max(1, min(workers or os.cpu_count() or 1, len(jobs)))
    context = multiprocessing.get_context("spawn")
    previous = os.environ.get("PYTHONHASHSEED")
    os.environ["PYTHONHASHSEED"] = _HASH_SEED
    try:
        with concurrent.futures.ProcessPoolExecutor(workers, mp_context=context) as pool:
            # Fleets' adaptive runs first (minutes each, the rest seconds): the workers
            # finish together. Results stay in job order.
            order = sorted(range(len(jobs)), key=lambda i: -_fleet_cost(*jobs[i]))
            futures = {
                pool.submit(_job, (jobs[i][0], jobs[i][1], seed, requests, trace)): i for i in order
            }
            results: list[PolicyResult | None] = [None] * len(jobs)
            for future in concurrent.futures.as_completed(futures):
                i = futures[future]
                result = future.result()
                results[i] = result
                if on_done is not None:
                    on_done(jobs[i][0], jobs[i][1], result)
    finally:
        if previous is None:
            os.environ.pop("PYTHONHASHSEED", None)
        else:
            os.environ["PYTHONHASHSEED"] = previous
    return [r for r in results if r is not None]
