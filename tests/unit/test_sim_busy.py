"""Other clients' load in the simulator (issue 24): background arrivals on a node, the
simulated server-load read answered from the node's queue, the busy-node targets."""

from __future__ import annotations

import random
from typing import Any

import pytest

from adaptive_lb.config import ConfigError
from adaptive_lb.stats.server_load import LoadOrder, parse_pools, pressure_of
from adaptive_lb.tools.sim import runner
from adaptive_lb.tools.sim.background import Background, capacity, install_background
from adaptive_lb.tools.sim.driver_side import attach_driver_side
from adaptive_lb.tools.sim.load_reads import SimLoadReader, thread_pools_rows
from adaptive_lb.tools.sim.metrics import PolicyResult
from adaptive_lb.tools.sim.policies import build_policy
from adaptive_lb.tools.sim.report import ScenarioReport
from adaptive_lb.tools.sim.runner import run_policy
from adaptive_lb.tools.sim.scenario import NodesSpec, load_scenario, parse_scenario, scenario_dir
from adaptive_lb.tools.sim.targets import check_targets

S = 1_000_000_000


def _scenario(**nodes: Any) -> Any:
    return parse_scenario(
        {
            "name": "three",
            "topology": {"datacenters": {"dc1": {"A": 3}}},
            "network": {"latency_us": {"A": {"A": 150}}, "jitter": 0.0},
            "nodes": {"workers": 2, "service_median_us": 1000, **nodes},
            "workload": {"clients_per_zone": 1},
            "faults": [{"kind": "load", "node": "A/2", "start": 1.0, "end": 5.0, "rate": 1500}],
        }
    )


def test_capacity_is_workers_over_the_mean_task() -> None:
    spec = NodesSpec(workers=2, service_median_us=1000, service_sigma=0.0, coordinator_us=0)
    assert capacity(spec) == pytest.approx(2000.0)
    assert capacity(NodesSpec(workers=2, service_median_us=1000)) < 2000.0  # lognormal mean


def test_background_load_takes_the_nodes_workers_in_its_window_only() -> None:
    scenario = _scenario()
    sim = runner.setup(scenario, seed=3)
    node = sim.nodes[2]
    seen: list[tuple[int, int]] = []
    sim.engine.every(S // 10, lambda: seen.append((sim.engine.now, node.busy + len(node.queue))))
    (load,) = install_background(
        scenario, sim.engine, sim.nodes, lambda name: random.Random(f"3:{name}")
    )
    sim.engine.run(until_ns=7 * S)
    assert load.node is node and load.shed == 0
    assert 4 * 1500 * 0.9 < load.sent < 4 * 1500 * 1.1  # Poisson at 1500/s for 4 s
    busy = [n for t, n in seen if 1.5 * S <= t < 5 * S]
    assert sum(busy) / len(busy) > 1.0  # ~75 % of 2 workers, and a queue
    assert all(n == 0 for t, n in seen if t < 1 * S or t >= 5.2 * S)
    assert all(n.tasks_done == 0 for n in sim.nodes[:2])  # no other node touched
    again = runner.setup(scenario, seed=3)
    (other,) = install_background(
        scenario, again.engine, again.nodes, lambda name: random.Random(f"3:{name}")
    )
    again.engine.run(until_ns=7 * S)
    assert other.sent == load.sent  # a function of the seed


def test_background_rate_defaults_to_a_share_of_capacity() -> None:
    scenario = parse_scenario(
        {
            "name": "share",
            "faults": [{"kind": "load", "node": "A/0", "utilization": 0.5, "end": 2.0}],
        }
    )
    sim = runner.setup(scenario, seed=1)
    (load,) = install_background(scenario, sim.engine, sim.nodes, random.Random)
    assert load.mean_gap_ns == pytest.approx(S / (0.5 * capacity(scenario.nodes)))
    assert isinstance(load, Background)


def test_a_load_fault_and_thread_pools_are_validated() -> None:
    with pytest.raises(ConfigError) as caught:
        parse_scenario(
            {
                "name": "bad",
                "nodes": {"thread_pools": "yes"},
                "faults": [{"kind": "load", "node": "A/0", "rate": 0}],
            }
        )
    text = str(caught.value)
    assert "nodes.thread_pools" in text and "faults[0].rate" in text


def _adaptive(sim: Any, scenario: Any) -> Any:
    kit = build_policy(
        "adaptive",
        datacenter="dc1",
        zone="A",
        config=scenario.adaptive_lb,
        clock=sim.clock,
        rng=random.Random(1),
    )
    kit.policy.populate(sim.topology.cluster, list(sim.topology.hosts))
    return kit.policy


def test_the_read_answers_the_nodes_queue_and_the_policy_turns_it_into_its_factor() -> None:
    scenario = _scenario()
    sim = runner.setup(scenario, seed=3)
    busy = sim.nodes[2]
    policy = _adaptive(sim, scenario)
    attach_driver_side(policy, "A", sim.servers, random.Random(7), thread_pools=True)
    install_background(scenario, sim.engine, sim.nodes, lambda name: random.Random(name))
    sim.engine.every(S // 5, policy.refresh_health, start_ns=S // 5)  # as the runner ticks
    sim.engine.run(until_ns=4 * S)
    record = policy.stats.get(busy.host).load
    assert record.answered >= 1 and record.supported is True and record.pool
    assert record.pressure is not None and record.pressure > 1.0
    assert policy.stats.get(busy.host).server_load > 1.0  # publish(), the production code
    for idle in sim.nodes[:2]:
        assert policy.stats.get(idle.host).server_load == 1.0
        assert policy.stats.get(idle.host).load.answered >= 1
    # The rows are the node's state: busy workers, the worker limit, the queue.
    rows = thread_pools_rows(busy)
    assert rows[0][1:] == (busy.busy, busy.workers, len(busy.queue), 0)
    assert pressure_of(parse_pools(rows)) is not None


def test_nodes_without_thread_pools_are_read_once_and_remembered() -> None:
    scenario = _scenario()
    sim = runner.setup(scenario, seed=3)
    policy = _adaptive(sim, scenario)
    attach_driver_side(policy, "A", sim.servers, random.Random(7), thread_pools=False)
    sim.engine.every(S // 5, policy.refresh_health, start_ns=S // 5)
    sim.engine.run(until_ns=10 * S)
    for node in sim.nodes:
        record = policy.stats.get(node.host).load
        assert (record.sent, record.supported, record.answered) == (1, False, 0)
        assert "thread_pools" in record.unsupported_reason
        assert policy.stats.get(node.host).server_load == 1.0


def test_a_read_that_times_out_is_a_failure_and_its_late_answer_frees_the_stream() -> None:
    scenario = _scenario()
    sim = runner.setup(scenario, seed=3)
    policy = _adaptive(sim, scenario)
    pools, _ = attach_driver_side(policy, "A", sim.servers, random.Random(7))
    reader = SimLoadReader(policy, "A", sim.servers, pools, thread_pools=True)
    node = sim.nodes[0]
    stats = policy.stats.get(node.host)
    node.pauses = [(0, 3 * S)]
    reader.read(LoadOrder(node.host, stats, 0))
    reader.read(LoadOrder(node.host, stats, 0))  # one outstanding at a time
    sim.engine.run(until_ns=1 * S)
    assert (reader.sent, stats.load.failed, stats.load.outstanding, pools(node.host)) == (
        1,
        1,
        False,
        1,
    )
    sim.engine.run()
    assert (stats.load.answered, pools(node.host)) == (0, 0)


def test_the_thresholds_are_drawn_from_the_seeded_stream() -> None:
    scenario = _scenario()
    draws = []
    for _ in range(2):
        sim = runner.setup(scenario, seed=3)
        policy = _adaptive(sim, scenario)
        attach_driver_side(policy, "A", sim.servers, random.Random(7), thread_pools=True)
        policy.refresh_health()
        draws.append([policy.stats.get(node.host).load.draw for node in sim.nodes])
    assert draws[0] == draws[1] and len(set(draws[0])) == 3


def _result(policy: str, faulted: float, timeline: list[list[int]]) -> PolicyResult:
    summary = {"p50_ms": 1.0, "p95_ms": 2.0, "p99_ms": 3.0, "faulted": faulted}
    return PolicyResult(
        policy,
        policy,
        summary,
        [],
        timeline,
        timeline_step_s=1.0,
        timeline_start_s=5.0,
        node_names=["A/0", "A/1", "A/2"],
    )


def test_busy_node_targets_compare_with_stock_and_look_for_a_return() -> None:
    scenario = load_scenario(scenario_dir() / "busy-node.yaml")
    stock = _result("token-aware", 0.33, [[10, 10, 10]] * 40)
    steady = [[10, 10, 3]] * 5 + [[15, 15, 0]] * 35
    comeback = [[10, 10, 3]] * 5 + [[15, 15, 0]] * 20 + [[10, 10, 10]] * 5 + [[15, 15, 0]] * 10
    share = "<= 50% of stock's share touch the busy node"
    settle = "no return while loaded: after 10 s, every 5 s window <= 50% of stock's share"
    checks = {
        c.target: c
        for c in check_targets(
            ScenarioReport(scenario, 1, [stock, _result("adaptive", 0.02, steady)])
        )
    }
    assert checks[share].met and checks[share].detail == "2.00% vs stock 33.00%"
    assert checks[settle].met and checks[settle].detail == "most 0.00% in 6 windows"
    report = ScenarioReport(scenario, 1, [stock, _result("adaptive", 0.05, comeback)])
    checks = {c.target: c for c in check_targets(report)}
    assert checks[share].met and not checks[settle].met


@pytest.mark.parametrize("name", ["busy-node", "busy-node-no-pools"])
def test_busy_node_scenario_runs_and_is_a_function_of_its_seed(name: str) -> None:
    scenario = load_scenario(scenario_dir() / f"{name}.yaml")
    first = run_policy(scenario, "adaptive", requests=400)
    again = run_policy(scenario, "adaptive", requests=400)
    assert first.summary == again.summary
    if name == "busy-node":
        assert first.summary["faulted"] <= 0.1  # the thread pools tell it at once
