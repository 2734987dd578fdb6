"""Issue 34's fleets: client rates, the per-second measures, the targets (synthetic
recordings), and one small fleet simulated end to end."""

from __future__ import annotations

import random
from typing import Any

import attrs

from adaptive_lb.tools.sim.fleet import FleetRates, FleetSpec, client_rates, clients_per_zone
from adaptive_lb.tools.sim.fleet_metrics import alternations, capacity_shares
from adaptive_lb.tools.sim.metrics import PolicyResult
from adaptive_lb.tools.sim.report import ScenarioReport
from adaptive_lb.tools.sim.runner import run_policy
from adaptive_lb.tools.sim.scenario import FaultSpec, load_scenario, parse_scenario, scenario_dir
from adaptive_lb.tools.sim.targets import check_targets

S = 1_000_000_000


def test_a_fleet_spreads_over_the_zones_with_thin_and_thick_clients():
    spec = FleetSpec(clients=100, thin_min_rps=1, thin_max_rps=20, thick_fraction=0.1)
    assert clients_per_zone(spec, 3) == [34, 33, 33]
    rates = client_rates(spec, 3, random.Random(1))
    assert len(rates) == 100
    assert rates[:3] == [100.0] * 3 and rates[3] != 100.0  # the first of each zone's thick
    assert sum(r == 100.0 for r in rates) == 9  # round(10 % of 34, 33, 33)
    assert all(1 <= r <= 20 for r in rates if r != 100.0)


def test_arrivals_go_to_clients_by_rate_and_a_surge_doubles_them_over_its_ramp():
    spec = FleetSpec(clients=2, surge_at=10.0, surge_factor=2.0, surge_ramp_s=1.0)
    rates = FleetRates(spec, [1.0, 3.0])
    rng = random.Random(2)
    picks = [rates.pick(rng.random()) for _ in range(4000)]
    assert 0.72 < picks.count(1) / 4000 < 0.78
    assert rates.mean_gap_ns(5 * S) == S / 4
    assert rates.mean_gap_ns(10 * S + S // 2) == S / 4 / 1.5
    assert rates.mean_gap_ns(20 * S) == S / 8


def test_capacity_shares_follow_the_faults():
    scenario = parse_scenario(
        {
            "name": "x",
            "faults": [
                {"kind": "busy", "node": "A/1", "start": 2, "end": 4, "utilization": 0.5},
                {"kind": "pause", "node": "A/2", "start": 3, "pause_s": 1, "period_s": 100},
            ],
        }
    )
    caps = capacity_shares(scenario, ["A/0", "A/1", "A/2"], range(1, 6))
    assert caps == [
        [1.0, 1.0, 1.0],
        [1.0, 0.5, 1.0],
        [1.0, 0.5, 0.0],
        [1.0, 1.0, 1.0],
        [1.0, 1.0, 1.0],
    ]


def test_an_alternation_is_above_below_and_back_within_ten_seconds():
    caps = [[1.0, 1.0]] * 12
    steady = [[100, 100]] * 12
    assert alternations(steady, caps) == 0
    noisy = [[100 + d, 100 - d] for d in (5, -5) * 6]  # within 3 sd of the share: chance
    assert alternations(noisy, caps) == 0
    swinging = [[150, 50], [50, 150], [150, 50]] + [[100, 100]] * 9
    assert alternations(swinging, caps) == 2  # each node: above, below, above (or the reverse)
    slow = [[150, 50]] + [[100, 100]] * 5 + [[50, 150]] + [[100, 100]] * 4 + [[150, 50]]
    assert alternations(slow, caps) == 0  # 11 s from the first to the last


def fleet_result(policy: str, p99: float, **fleet: Any) -> PolicyResult:
    base = {"alternations": 0, "cv_1s": 0.1, "own": {}, "clients": 200}
    summary = {"p50_ms": 1.0, "p95_ms": 2.0, "p99_ms": p99, "faulted": None}
    return PolicyResult(policy, policy, {**summary, "fleet": {**base, **fleet}}, [], [])


def test_the_half_capacity_targets():
    half = load_scenario(scenario_dir() / "fleet-half-capacity.yaml")
    healthy = load_scenario(scenario_dir() / "fleet-healthy.yaml")
    degraded = {"node": "A/1", "load_over_capacity": 1.15, "moved_after_s": 12}
    runs = [
        fleet_result("token-aware", 40.0, cv_1s=0.08),
        fleet_result("p2c", 20.0),
        fleet_result("adaptive", 19.0, degraded=degraded, alternations=2, cv_1s=0.07),
    ]
    report = ScenarioReport(half, 1, runs)
    reference = ScenarioReport(healthy, 1, [fleet_result("adaptive", 15.0)])
    found = {c.target: (c.met, c.detail) for c in check_targets(report, [report, reference])}
    assert found["fleet p99 <= 0.9 x the best peer's"] == (False, "19.000 vs 20.000 ms (p2c)")
    assert found["fleet p99 <= 1.3 x the same fleet's with no degraded node"][0] is True
    target = "degraded node's load within 20% of its share of capacity after 30 s"
    assert found[target] == (True, "1.15 x its share")
    assert found["the degraded node's traffic moves within 10 s"] == (False, "after 12 s")
    assert found["no alternations"] == (False, "2")
    assert found["per-node 1 s load CV no worse than stock's"][0] is True
    alone = {c.target for c in check_targets(report)}  # without fleet-healthy: not checked
    assert "fleet p99 <= 1.3 x the same fleet's with no degraded node" not in alone


def test_a_small_fleet_counts_each_nodes_reads_and_probes():
    scenario = load_scenario(scenario_dir() / "fleet-size-10.yaml")
    scenario = attrs.evolve(
        scenario,
        topology=attrs.evolve(scenario.topology, datacenters={"dc1": {"A": 1, "B": 1, "C": 1}}),
        fleet=attrs.evolve(scenario.fleet, clients=6, thin_min_rps=20, thin_max_rps=40),
        faults=[FaultSpec(kind="pause", node="A/0", start=2.0, pause_s=2.0, period_s=100)],
        max_duration=5.0,
    )
    result = run_policy(scenario, "adaptive")
    fleet = result.summary["fleet"]
    assert fleet["clients"] == 6
    # Every client reads every node's thread pools every 2 s: 3 a second per node.
    assert 2.0 <= fleet["own"]["read"]["per_node_s"] <= 4.0
    assert fleet["stalled"]["node"] == "A/0" and fleet["stalled"]["probes_max_s"] >= 1
    series = result.fleet_series
    assert series is not None and series["nodes"] == ["A/0", "B/0", "C/0"]
    assert len(series["attempts"]) == len(series["seconds"]) == len(series["capacity"])
    assert sum(map(sum, series["attempts"])) > 0
