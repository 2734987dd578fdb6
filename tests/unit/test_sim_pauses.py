"""The client's own pauses in the simulator (issue 32): answers handled late, sends delayed,
the health refresh late with its lateness observed; false verdicts and their target."""

from __future__ import annotations

import itertools
import json
import random
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

import adaptive_lb
from adaptive_lb.config import ConfigError
from adaptive_lb.health.probes import ProbeOrder
from adaptive_lb.tools.sim import runner
from adaptive_lb.tools.sim.client_pauses import ClientPauses, client_pauses, schedule_tick
from adaptive_lb.tools.sim.driver_side import PoolCounts, attach_driver_side
from adaptive_lb.tools.sim.metrics import PolicyResult, Recorder, false_verdicts
from adaptive_lb.tools.sim.policies import build_policy
from adaptive_lb.tools.sim.report import ScenarioReport, to_json
from adaptive_lb.tools.sim.runner import run_policy
from adaptive_lb.tools.sim.scenario import ClientPausesSpec, load_scenario, parse_scenario
from adaptive_lb.tools.sim.targets import check_targets
from adaptive_lb.tools.sim.workload import SUCCEEDED, Client

SCENARIOS = Path(adaptive_lb.__file__).resolve().parent / "tools" / "sim" / "scenarios"
US = 1_000
MS = 1_000_000
S = 1_000_000_000


def _scenario() -> Any:
    """Three nodes in one rack, 150 us each way, no service time: an answer takes 300 us."""
    return parse_scenario(
        {
            "name": "exact",
            "topology": {"datacenters": {"dc1": {"A": 3}}},
            "network": {"latency_us": {"A": {"A": 150}}, "jitter": 0.0},
            "nodes": {"service_median_us": 0.001, "service_sigma": 0.0, "coordinator_us": 0},
        }
    )


class _Plan:
    def __init__(self, host: object) -> None:
        self.host = host

    def make_query_plan(self, keyspace: object = None, query: object = None):
        return iter([self.host])


class _Feedback:
    """What the policy's HostStats would get, with the virtual time of each call."""

    def __init__(self, engine: Any) -> None:
        self.engine = engine
        self.events: list[tuple[str, int, int]] = []

    def sent(self, host: object) -> None:
        self.events.append(("sent", self.engine.now, 0))

    def success(self, host: object, latency_ns: int) -> None:
        self.events.append(("success", self.engine.now, latency_ns))

    def error(self, host: object, latency_ns: int) -> None:
        self.events.append(("error", self.engine.now, latency_ns))

    def timeout(self, host: object, latency_ns: int) -> None:
        self.events.append(("timeout", self.engine.now, latency_ns))


def test_answers_in_a_pause_are_handled_at_its_end_and_sends_wait_for_it() -> None:
    scenario = _scenario()
    sim = runner.setup(scenario, seed=5)
    node = sim.nodes[0]
    feedback = _Feedback(sim.engine)
    recorder = Recorder(len(sim.nodes))
    client = Client(
        "A-0", "A", _Plan(node.host), feedback, sim.servers, sim.statements, recorder,
        scenario.workload,
    )  # fmt: skip
    client.pools = PoolCounts()
    client.pauses = ClientPauses(windows=[(1 * MS, 41 * MS)])
    # Sent at 0.9 ms, answered at 1.2 ms (paused): read at 41 ms.
    sim.engine.at(900 * US, lambda k: client.start(k, measured=True), 1)
    # Started at 10 ms (paused): sent at 41 ms, answered 300 us later.
    sim.engine.at(10 * MS, lambda k: client.start(k, measured=True), 2)
    sim.engine.run(until_ns=20 * MS)
    assert feedback.events == [("sent", 900 * US, 0)]
    assert client.pools(node.host) == 1  # the answer is on the socket, not read yet
    sim.engine.run()
    ns = pytest.approx  # the service time is 1 ns
    assert feedback.events == [
        ("sent", 900 * US, 0),
        ("success", 41 * MS, ns(40_100 * US, abs=5)),  # the wait is in what the policy gets
        ("sent", 41 * MS, 0),
        ("success", ns(41_300 * US, abs=5), ns(300 * US, abs=5)),  # sent late: its own only
    ]
    assert client.pools(node.host) == 0
    assert list(recorder.status) == [SUCCEEDED, SUCCEEDED]
    # The application waited for both: 40.1 ms, and 31.3 ms from the second's start.
    assert list(recorder.latency_ns) == [ns(40_100 * US, abs=5), ns(31_300 * US, abs=5)]
    assert (client.pauses.answers_late, client.pauses.sends_late) == (1, 1)


def test_a_refresh_due_in_a_pause_runs_at_its_end_and_observes_how_late() -> None:
    scenario = _scenario()
    sim = runner.setup(scenario, seed=5)
    kit = build_policy(
        "adaptive", datacenter="dc1", zone="A", config=scenario.adaptive_lb, clock=sim.clock,
        rng=random.Random(1),
    )  # fmt: skip
    policy = kit.policy
    policy.populate(sim.topology.cluster, list(sim.topology.hosts))
    lateness = policy.health.lateness
    ticks: list[tuple[int, float]] = []

    def tick() -> None:
        levels = lateness.levels(sim.engine.now)  # observed first
        ticks.append((sim.engine.now, levels[-1] if levels else 0.0))
        policy.refresh_health()

    pauses = ClientPauses(windows=[(390 * MS, 430 * MS)])
    schedule_tick(sim.engine, 200 * MS, tick, start_ns=200 * MS, pauses=pauses, policy=policy)
    sim.engine.run(until_ns=900 * MS)
    # Due at 400 ms, run at 430 ms, 30 ms late; the thread then sleeps one interval.
    assert ticks == [
        (200 * MS, 0.0),
        (430 * MS, pytest.approx(0.030)),
        (630 * MS, pytest.approx(0.030)),
        (830 * MS, pytest.approx(0.030)),
    ]
    assert pauses.refreshes_late == 1
    # A baseline without health: run late, nothing observed, no error.
    late: list[int] = []
    again = runner.setup(scenario, seed=5)
    schedule_tick(
        again.engine, 200 * MS, lambda: late.append(again.engine.now), start_ns=200 * MS,
        pauses=ClientPauses(windows=[(390 * MS, 430 * MS)]), policy=object(),
    )  # fmt: skip
    again.engine.run(until_ns=500 * MS)
    assert late == [200 * MS, 430 * MS]


def test_a_probe_answer_in_a_pause_is_recorded_at_its_end() -> None:
    scenario = _scenario()
    sim = runner.setup(scenario, seed=5)
    kit = build_policy(
        "adaptive", datacenter="dc1", zone="A", config=scenario.adaptive_lb, clock=sim.clock,
        rng=random.Random(1),
    )  # fmt: skip
    kit.policy.populate(sim.topology.cluster, list(sim.topology.hosts))
    pauses = ClientPauses(windows=[(100 * US, 20 * MS)])
    pools, prober = attach_driver_side(
        kit.policy, "A", sim.servers, random.Random(1), pauses=pauses
    )
    node = sim.nodes[1]
    stats = kit.policy.stats.get(node.host)
    prober.send(ProbeOrder(node.host, stats, "test", sim.engine.now))
    sim.engine.run(until_ns=10 * MS)
    assert stats.probes.outstanding and pools(node.host) == 1
    sim.engine.run(until_ns=30 * MS)
    assert (stats.probes.answered, pools(node.host)) == (1, 0)
    assert stats.probes.last_latency_s == pytest.approx(0.020)


def test_pauses_are_poisson_uniform_apart_and_a_function_of_the_seed() -> None:
    def draw(seed: int) -> list[tuple[int, int]]:
        pauses = ClientPauses(random.Random(seed), rate=4.0, min_ms=5.0, max_ms=50.0)
        return pauses.windows(100 * S)

    windows = draw(3)
    assert windows == draw(3) and windows != draw(4)
    # One every 1 / 4 s + 27.5 ms on average: ~360 in 100 s.
    assert 300 < len(windows) < 420
    assert all(5 * MS <= b - a <= 50 * MS for a, b in windows)
    assert all(b < a2 for (_, b), (a2, _) in itertools.pairwise(windows))
    pauses = ClientPauses(windows=[(10, 20)])
    assert [pauses.resume_time(t) for t in (9, 10, 19, 20)] == [9, 20, 20, 20]
    spec = ClientPausesSpec(rate=2.0, clients=1, end=5.0)
    assert client_pauses(spec, 1, random.Random(1)) is None  # only the first client
    first = client_pauses(spec, 0, random.Random(1))
    assert first is not None and all(a < 5 * S for a, _ in first.windows(60 * S))
    assert client_pauses(ClientPausesSpec(), 0, random.Random(1)) is None  # rate 0: none


def test_client_pauses_are_validated() -> None:
    with pytest.raises(ConfigError, match=r"client_pauses\.rate: must be >= 0"):
        parse_scenario({"name": "x", "client_pauses": {"rate": -1}})
    with pytest.raises(ConfigError, match=r"max_ms: must be >= min_ms"):
        parse_scenario({"name": "x", "client_pauses": {"min_ms": 9, "max_ms": 2}})


def _node(index: int, faults: list[tuple[float, float]] = ()) -> Any:
    windows = [(round(a * S), round(b * S)) for a, b in faults]
    return SimpleNamespace(index=index, fault_active=lambda t: any(a <= t < b for a, b in windows))


def test_false_verdicts_count_every_transition_out_of_healthy_without_a_fault() -> None:
    nodes = [_node(0, faults=[(10.0, 20.0)]), _node(1)]
    verdicts = [
        (1 * S, 1, "erroring", "healthy"),  # false, ERRORING
        (2 * S, 1, "warming", "erroring"),  # a return: no verdict
        (3 * S, 1, "slow", "warming"),  # false, SLOW
        (4 * S, 1, "erroring", "slow"),  # worse: false, ERRORING
        (5 * S, 1, "warming", "healthy"),  # out of HEALTHY: false
        (6 * S, 1, "healthy", "warming"),
        (12 * S, 0, "slow", "healthy"),  # its fault is on
    ]
    assert false_verdicts(verdicts, nodes) == {
        "false": 4,
        "false_slow": 1,
        "false_erroring": 2,
        "faulted": 1,
    }


def _report(name: str, verdicts: dict[str, int] | None) -> ScenarioReport:
    summary: dict[str, Any] = {"p50_ms": 1.0, "p95_ms": 1.0, "p99_ms": 1.0, "faulted": None}
    if verdicts is not None:
        summary["verdicts"] = verdicts
    result = PolicyResult("adaptive", "a", summary, [], [])
    return ScenarioReport(parse_scenario({"name": name, "policies": ["adaptive"]}), 1, [result])


def test_noisy_client_target_is_no_false_verdict() -> None:
    missed = {
        c.target: (c.met, c.detail)
        for c in check_targets(
            _report("noisy-client", {"false": 3, "false_slow": 2, "false_erroring": 1})
        )
    }
    target = "a: no false verdict (no host leaves HEALTHY without a fault)"
    assert missed[target] == (False, "3 false verdicts (2 SLOW, 1 ERRORING)")
    met = {c.target: c.met for c in check_targets(_report("noisy-client-thin", None))}
    assert met[target] is True  # no transition at all
    assert target not in {c.target for c in check_targets(_report("other", None))}


def test_noisy_client_thin_runs_and_is_a_function_of_its_seed() -> None:
    scenario = load_scenario(SCENARIOS / "noisy-client-thin.yaml")

    def run() -> str:
        results = [run_policy(scenario, "adaptive", seed=2, requests=200)]
        return to_json([ScenarioReport(scenario, 2, results)])

    first = run()
    assert first == run()
    summary = json.loads(first)["scenarios"][0]["results"][0]
    pauses = summary["client_pauses"]
    assert pauses["clients"] == 1 and pauses["pauses"] > 50 and pauses["refreshes_late"] > 0
