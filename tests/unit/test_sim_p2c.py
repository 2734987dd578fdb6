"""The P2C + peak-EWMA baseline (Finagle / Linkerd) and the demo's closing tally."""

from __future__ import annotations

import math
import random
from types import SimpleNamespace
from typing import Any

from adaptive_lb.core.clock import ManualClock
from adaptive_lb.tools.sim.metrics import PolicyResult
from adaptive_lb.tools.sim.p2c import PENALTY, PeakEwmaP2CPolicy
from adaptive_lb.tools.sim.report import ScenarioReport, format_tally
from adaptive_lb.tools.sim.scenario import load_scenario, scenario_dir

S = 1_000_000_000
MS = 1_000_000


class Child:
    """A token-aware child stand-in: the replicas first, then the others."""

    def __init__(self, hosts: list[Any]) -> None:
        self.hosts = hosts

    def populate(self, cluster: Any, hosts: Any) -> None:
        pass

    def make_query_plan(self, keyspace: Any = None, query: Any = None) -> Any:
        return iter(self.hosts)


def p2c(hosts: list[Any], replicas: int) -> tuple[PeakEwmaP2CPolicy, ManualClock]:
    clock = ManualClock(0)
    policy = PeakEwmaP2CPolicy(Child(hosts), clock, random.Random(1))
    metadata = SimpleNamespace(get_replicas=lambda keyspace, key: hosts[:replicas])
    policy.populate(SimpleNamespace(metadata=metadata), hosts)
    return policy, clock


QUERY = SimpleNamespace(routing_key=b"k", keyspace="ks")


def test_peak_ewma_takes_a_slower_answer_at_once_and_decays_over_its_decay_time():
    host = object()
    policy, clock = p2c([host], 1)
    policy.sent(host)
    clock.set(1 * S)
    policy.success(host, 4 * MS)
    assert policy.cost(host) == 4 * MS
    policy.sent(host)
    clock.set(2 * S)
    policy.success(host, 20 * MS)  # slower: the peak, at once
    assert policy.cost(host) == 20 * MS
    clock.set(12 * S)  # 10 s (the decay time) without an answer: 1 / e of it left
    assert math.isclose(policy.cost(host), 20 * MS / math.e, rel_tol=1e-9)


def test_cost_is_latency_times_outstanding_plus_one_and_unmeasured_pending_is_penalised():
    a, b = object(), object()
    policy, _ = p2c([a, b], 2)
    assert policy.cost(a) == 0.0  # nothing measured, nothing outstanding: tried first
    policy.sent(a)
    assert policy.cost(a) == PENALTY + 1
    policy.success(a, 2 * MS)
    policy.sent(a)
    policy.sent(a)
    assert policy.cost(a) == 2 * MS * 3


def test_two_choices_among_the_replicas_the_cheaper_first_the_rest_after():
    hosts = [SimpleNamespace(name=n) for n in "abcd"]
    policy, _ = p2c(hosts, 3)
    for host, latency in zip(hosts[:3], (1, 9, 9), strict=True):
        policy.sent(host)
        policy.success(host, latency * MS)
    firsts = []
    for _ in range(300):
        plan = list(policy.make_query_plan("ks", QUERY))
        assert sorted(h.name for h in plan) == list("abcd") and plan[-1].name == "d"
        firsts.append(plan[0].name)
    # a is first whenever it is one of the two drawn: 2 draws in 3.
    assert 0.6 < firsts.count("a") / 300 < 0.74
    assert firsts.count("d") == 0


def result(policy: str, **summary: Any) -> PolicyResult:
    base = {"p50_ms": 1.0, "p95_ms": 2.0, "p99_ms": 3.0, "faulted": None, "max_mean_host": 1.0}
    return PolicyResult(policy, policy, {**base, **summary}, [], [])


def test_the_tally_counts_targets_and_names_every_miss():
    scenario = load_scenario(scenario_dir() / "thin-slow.yaml")
    runs = [result("adaptive", faulted=0.2), result("p2c", p99_ms=2.5), result("slow-replica")]
    lines = format_tally([ScenarioReport(scenario, 2, runs)]).splitlines()
    assert lines == [
        "targets: 1 met, 2 missed of 3",
        "  MISSED thin-slow: p99 <= p2c: 3.000 vs 2.500 ms",
        "  MISSED thin-slow: <= 5 % touch the +50 ms node after 10 s: 20.00%",
    ]
