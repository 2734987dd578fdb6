"""Issue 15's simulator measurements and targets: a paused node's return, SLOW verdicts,
settled figures, reference figures (synthetic recordings, no simulation)."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest

from adaptive_lb.config import Config, ConfigError
from adaptive_lb.tools.sim.metrics import (
    PolicyResult,
    Recorder,
    pause_returns,
    settled,
    slow_verdicts,
)
from adaptive_lb.tools.sim.report import ScenarioReport
from adaptive_lb.tools.sim.scenario import load_scenario, parse_scenario, scenario_dir
from adaptive_lb.tools.sim.targets import check_targets

S = 1_000_000_000


def node(index: int, pauses: list[tuple[float, float]] = (), faults: list[Any] = ()) -> Any:
    windows = [(round(a * S), round(b * S)) for a, b in (*pauses, *faults)]
    return SimpleNamespace(
        index=index,
        name=f"A/{index}",
        datacenter="dc1",
        pauses=[(round(a * S), round(b * S)) for a, b in pauses],
        fault_active=lambda t: any(a <= t < b for a, b in windows),
    )


def test_a_paused_nodes_return_is_when_it_gets_half_its_fair_share_again():
    nodes = [node(0, pauses=[(10.0, 20.0)]), node(1), node(2), node(3)]
    recorder = Recorder(len(nodes))
    for ms in range(0, 40_000, 10):  # 100 attempts per second, round robin...
        t = ms * 1_000_000
        target = nodes[(ms // 10) % 4]
        if target.index == 0 and 10 * S <= t < 22_500_000_000:
            target = nodes[1]  # ...but node 0 gets none until 2.5 s after its pause
        recorder.attempt(t, target)
    returns = pause_returns(recorder, nodes, [0, 1, 2, 3])
    # Its share in the 0.5 s window ending at 22.7 s is 40 % of its fair share, at 22.8 s 60 %.
    assert returns == {"A/0": [pytest.approx(2.8)]}


def test_slow_verdicts_are_false_unless_a_fault_is_active_on_the_node():
    nodes = [node(0, faults=[(10.0, 20.0)]), node(1)]
    verdicts = [
        (5 * S, 0, "slow"),  # before its fault: false
        (12 * S, 0, "slow"),  # during it
        (12 * S, 0, "healthy"),
        (13 * S, 1, "slow"),  # never faulted
    ]
    assert slow_verdicts(verdicts, nodes) == {"false": 2, "faulted": 1}


def test_settled_figures_count_only_requests_started_after():
    recorder = Recorder(1)
    request = SimpleNamespace
    for start_s, latency_ms, crossed in ((1, 5.0, True), (11, 1.0, False), (12, 3.0, True)):
        start = start_s * S
        recorder.finish(
            request(start_ns=start, crossed=crossed, touched=False, attempts=1),
            0,
            start + round(latency_ms * 1e6),
        )
    assert settled(recorder, 10.0) == {
        "after_s": 10.0,
        "requests": 2,
        "p50_ms": 1.0,
        "cross_zone": 0.5,
    }


def result(policy: str, label: str | None = None, **summary: Any) -> PolicyResult:
    base = {"p50_ms": 1.0, "p95_ms": 2.0, "p99_ms": 3.0, "faulted": None, "max_mean_host": 1.0}
    return PolicyResult(policy, label or policy, {**base, **summary}, [], [])


def targets(name: str, results: list[PolicyResult], seed: int = 1) -> dict[str, tuple[bool, str]]:
    scenario = load_scenario(scenario_dir() / f"{name}.yaml")
    report = ScenarioReport(scenario, seed, results)
    return {c.target: (c.met, c.detail) for c in check_targets(report)}


def test_a_scenario_is_checked_against_its_reference_figures():
    scenario = load_scenario(scenario_dir() / "overload.yaml")
    reference = scenario.reference
    assert reference is not None and reference["seed"] == 1
    same = {k: reference[k] * 1.019 for k in ("p50_ms", "p95_ms", "p99_ms")}
    worse = {**same, "p95_ms": reference["p95_ms"] * 1.021}
    name = "no worse than before (reference) by > 2% at p50/p95/p99"
    assert targets("overload", [result("adaptive", **same)])[name][0]
    met, detail = targets("overload", [result("adaptive", **worse)])[name]
    assert not met and "p95 " in detail and "(+2.1%)" in detail
    met, detail = targets("overload", [result("adaptive", **worse)], seed=7)[name]
    assert met and detail.startswith("n/a")


def test_gc_pause_return_target():
    name = "paused node back to >= 50 % of its fair share within 3 s of each pause's end"
    back = targets("gc-pause", [result("adaptive", pause_return_s={"A/1": [2.0, 2.9]})])
    assert back[name] == (True, "2.0 s, 2.9 s")
    late = targets("gc-pause", [result("adaptive", pause_return_s={"A/1": [2.0, None]})])
    assert late[name] == (False, "2.0 s, never")


def test_learned_rack_targets():
    racks = {
        "A-0": {"zone": "A", "rack": "A", "source": "learned", "learned_at_s": 1.4, "changes": 1},
        "B-0": {"zone": "B", "rack": "B", "source": "learned", "learned_at_s": 1.6, "changes": 1},
    }
    configured = result("adaptive", settled={"after_s": 10.0, "requests": 9, "p50_ms": 0.70})
    unset = result(
        "adaptive-unset",
        settled={"after_s": 10.0, "requests": 9, "p50_ms": 0.73, "cross_zone": 0.002},
        local_racks=racks,
    )
    found = targets("local-one-auto", [configured, unset])
    assert found["learned rack: p50 within 5% of the configured rack's after 10 s"][0]
    assert found["learned rack: <= 1 % cross-zone after 10 s"][0]
    assert found["every client learned its own zone, once"] == (True, "learned after 1.4-1.6 s")
    racks["B-0"] = {**racks["B-0"], "rack": "C"}
    wrong = targets("local-one-auto", [configured, unset])
    assert wrong["every client learned its own zone, once"][0] is False


def test_far_racks_targets():
    found = targets(
        "far-racks", [result("adaptive", "a", slow_verdicts={"false": 1, "faulted": 2})]
    )
    assert found["a: no host SLOW from distance (no fault active)"] == (False, "1 SLOW verdicts")
    assert found["a: the slowed node is flagged SLOW"][0]


def test_reference_must_name_every_figure():
    with pytest.raises(ConfigError) as info:
        parse_scenario({"name": "x", "reference": {"seed": 1, "requests": 5, "p50_ms": 1.0}})
    assert "reference.p95_ms: required" in str(info.value)
    with pytest.raises(ConfigError) as info:
        parse_scenario({"name": "x", "reference": {"seed": 1.5}})
    assert "reference.seed: must be an integer" in str(info.value)


def test_every_earlier_stock_scenario_has_a_reference_and_runs_the_defaults():
    for name in (
        "local-one",
        "local-quorum",
        "slow-coordinator",
        "gc-pause",
        "node-restart",
        "overload",
        "one-loaded-node",
        "fast-failing-node",
        "hot-partition",
    ):
        scenario = load_scenario(scenario_dir() / f"{name}.yaml")
        assert scenario.reference is not None
        assert scenario.adaptive_lb == Config()  # the shipped defaults, nothing tuned


def test_thin_stall_targets_count_the_user_requests_timed_out():
    name = "<= 3 user requests timed out in the 40 s stall"
    few = targets("thin-stall", [result("adaptive", requests=800, timeouts=0.0025, faulted=0.004)])
    assert few[name] == (True, "2 of 800 (0.40% touched the node)")
    many = targets("thin-stall", [result("adaptive", requests=800, timeouts=0.005, faulted=0.01)])
    assert many[name][0] is False
    slow = targets("thin-stall-1rps", [result("adaptive", requests=80, timeouts=0.0375)])
    assert slow["<= 2 user requests timed out in the 40 s stall"][0] is False


def test_thin_equal_targets_want_an_even_share():
    name = "equal nodes share evenly: each within 15% of its fair share"
    even = targets("thin-equal", [result("adaptive", attempts_by_host={"a": 30, "b": 33, "c": 37})])
    assert even[name] == (True, "30.00% to 37.00%")
    lurching = {"a": 20, "b": 35, "c": 45}  # one host taking what another loses
    uneven = targets("thin-equal", [result("adaptive", attempts_by_host=lurching)])
    assert uneven[name][0] is False
    assert uneven["no equal node below 10 % of requests"][0] is True
