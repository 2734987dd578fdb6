"""Learning the client's rack (``policy.local_rack: auto``): the pure learner, and the policy
learning it from the latency it measures (real driver Host / Metadata objects, statistics
fed on a manual clock)."""

from __future__ import annotations

import pytest
from cassandra.policies import DCAwareRoundRobinPolicy, TokenAwarePolicy
from cassandra.query import SimpleStatement

from adaptive_lb import AdaptiveLoadBalancingPolicy, Config
from adaptive_lb.config import (
    HealthConfig,
    PolicyConfig,
    RackLearningConfig,
)
from adaptive_lb.core.clock import ManualClock
from adaptive_lb.health.model import HealthState
from adaptive_lb.plan.locality import LocalRack, RackLearner, resolve_local_rack
from adaptive_lb.plan.planner import PlanRecord
from adaptive_lb.tools.sim.driver_topology import build_cluster, murmur3_routing_keys
from tests.unit.test_tracing import decision_attributes

MS = 1_000_000
S = 1_000_000_000
LEARNING = RackLearningConfig(margin=0.2, learn_after=1.0, relearn_after=30.0)
NEAR = {"r1": 0.0007, "r2": 0.0019, "r3": 0.0010}
"""Median latency of each rack's hosts from a client in r1 (seconds)."""


def run(learner: RackLearner, medians: dict[str, float], seconds: float, start_s: float) -> float:
    """Feed ``medians`` every 200 ms for ``seconds``; returns the time reached."""
    t = start_s
    for _ in range(round(seconds / 0.2)):
        t += 0.2
        learner.observe(medians, round(t * S), LEARNING)
    return t


# ----------------------------------------------------------------- the pure learner


def test_the_clear_fastest_rack_is_learned_after_learn_after():
    learner = RackLearner()
    t = run(learner, NEAR, 0.8, 0.0)
    assert learner.rack is None  # not for long enough yet
    run(learner, NEAR, 0.4, t)
    assert learner.rack == "r1" and learner.baseline == NEAR["r1"]


def test_no_rack_is_learned_without_a_clear_margin_or_a_second_rack():
    learner = RackLearner()
    run(learner, {"r1": 0.00100, "r2": 0.00110, "r3": 0.00105}, 60.0, 0.0)  # all alike
    assert learner.rack is None
    run(learner, {"r1": 0.0007}, 60.0, 60.0)  # one rack measured: nothing to compare
    assert learner.rack is None


def test_no_rack_is_learned_while_a_rack_with_live_hosts_is_not_measured():
    """r1 gets no fresh measurement (its hosts unhealthy, or no samples yet): it might be
    the nearest, so r3 is not learned although it clearly beats r2."""
    learner = RackLearner()
    t = 0.0
    for _ in range(30):
        t += 0.2
        learner.observe({"r2": 0.0019, "r3": 0.0010}, round(t * S), LEARNING, NEAR, NEAR)
    assert learner.rack is None
    for _ in range(6):
        t += 0.2
        learner.observe(NEAR, round(t * S), LEARNING, NEAR, NEAR)
    assert learner.rack == "r1"


def test_the_candidate_must_stay_the_same_for_the_whole_learn_after():
    learner = RackLearner()
    t = 0.0
    for _ in range(10):  # r1 and r3 take turns at being fastest: never learned
        t = run(learner, {"r1": 0.0007, "r3": 0.0010}, 0.6, t)
        t = run(learner, {"r1": 0.0010, "r3": 0.0007}, 0.6, t)
    assert learner.rack is None


def learned_r1() -> tuple[RackLearner, float]:
    learner = RackLearner()
    t = run(learner, NEAR, 2.0, 0.0)
    assert learner.rack == "r1"
    return learner, t


def test_a_learned_rack_without_fresh_measurements_is_kept():
    """A GC pause or a restart of the local nodes: unhealthy hosts are not measured, so
    the local rack has no median at all for a while -- no evidence either way."""
    learner, t = learned_r1()
    run(learner, {"r2": 0.0019, "r3": 0.0010}, 600.0, t)
    assert learner.rack == "r1" and learner.changes == 1


def test_a_short_doubt_does_not_flip_it():
    learner, t = learned_r1()
    for _ in range(5):  # r3 clearly faster for 20 s at a time, then r1 again
        t = run(learner, {**NEAR, "r3": 0.0004}, 20.0, t)
        t = run(learner, NEAR, 1.0, t)
    assert learner.rack == "r1" and learner.changes == 1


def test_a_moved_client_converges_to_its_new_rack():
    """The pod moved from r1 to r2: r1 is now far; the other racks get no traffic (r1 still
    wins every plan), so only r1's own jump shows it. After relearn_after the rack is
    forgotten, traffic spreads, and r2 is learned from fresh numbers."""
    learner, t = learned_r1()
    t = run(learner, {"r1": 0.0019}, 29.8, t)
    assert learner.rack == "r1"
    t = run(learner, {"r1": 0.0019}, 0.4, t)
    assert learner.rack is None  # forgotten: no rack penalty, every rack gets traffic
    t = run(learner, {"r1": 0.0019, "r2": 0.0007, "r3": 0.0020}, 1.2, t)
    assert learner.rack == "r2" and learner.changes == 3


def test_a_rack_that_left_the_local_datacenter_is_forgotten():
    learner, t = learned_r1()
    assert learner.observe(NEAR, round((t + 0.2) * S), LEARNING, racks={"r2", "r3"})
    assert learner.rack is None


def test_resolve_local_rack_prefers_configured_then_child_then_learning():
    assert resolve_local_rack("r2", "r9") == ("r2", "configured")
    assert resolve_local_rack("auto", "r9") == ("r9", "child")
    assert resolve_local_rack(None, "r9") == ("r9", "child")
    assert resolve_local_rack("auto", None) == (None, "learned")
    assert resolve_local_rack(None, None) == (None, "unknown")


def test_local_rack_source_is_unknown_until_learned():
    local = LocalRack()
    assert local.configure(None, "learned", LEARNING) is None
    assert (local.rack, local.source, local.learned, local.learning) == (
        None,
        "unknown",
        None,
        True,
    )
    for i in range(10):
        local.observe(NEAR, set(NEAR), round((i + 1) * 0.2 * S))
    assert (local.rack, local.source, local.learned) == ("r1", "learned", "r1")
    # A configured rack wins, and stops the learning.
    assert local.configure("r3", "configured", None) == "r3"
    assert (local.source, local.learned, local.learning) == ("configured", None, False)
    assert not local.observe(NEAR, set(NEAR), 100 * S)


# ----------------------------------------------------------------- through the policy


class Client:
    """Nine hosts in racks r1..r3 of dc1 (RF 3: one replica per rack) and a policy with
    nothing configured about its rack; the client is near ``near`` (0.7 ms), 1 ms from the
    next rack and 1.9 ms from the farthest."""

    def __init__(self, config: Config | None = None, child_rack: str | None = None) -> None:
        self.clock = ManualClock(0)
        self.model = build_cluster({"dc1": [3, 3, 3]}, replication={"dc1": 3}, seed=3)
        self.hosts = list(self.model.metadata.all_hosts())
        config = config or Config(
            policy=PolicyConfig(rack_learning=LEARNING), health=HealthConfig(min_samples=20)
        )
        base = DCAwareRoundRobinPolicy("dc1")
        if child_rack is not None:
            base.local_rack = child_rack  # as RackAwareRoundRobinPolicy has
        self.policy = AdaptiveLoadBalancingPolicy(TokenAwarePolicy(base), config, clock=self.clock)
        self.policy.populate(self.model.cluster, self.hosts)
        self.latency_ms = {"r1": 0.7, "r2": 1.9, "r3": 1.0}
        self.extra_ms: dict[object, float] = {}

    def second(self, racks: tuple[str, ...] = ("r1", "r2", "r3")) -> None:
        """One second: 30 answers from every host of ``racks``, 5 health refreshes."""
        for _ in range(5):
            self.clock.advance(200 * MS)
            for host in self.hosts:
                if host.rack in racks and host not in self.extra_ms.get("down", ()):
                    stats = self.policy.stats.get(host)
                    for _ in range(6):
                        stats.on_send()
                        latency = self.latency_ms[host.rack] + self.extra_ms.get(host, 0.0)
                        stats.on_success(int(latency * MS))
            self.policy.refresh_health()

    def penalties(self) -> dict[str, set[float]]:
        found: dict[str, set[float]] = {}
        for host in self.hosts:
            found.setdefault(host.rack, set()).add(self.policy.stats.get(host).rack_penalty)
        return found


def test_the_policy_learns_its_rack_and_applies_the_rack_penalty():
    c = Client()
    assert (c.policy.local_rack, c.policy.local_rack_source, c.policy.learned_rack) == (
        None,
        "unknown",
        None,
    )
    assert c.penalties() == {"r1": {1.0}, "r2": {1.0}, "r3": {1.0}}  # as without a rack
    for _ in range(3):
        c.second()
    assert (c.policy.local_rack, c.policy.local_rack_source, c.policy.learned_rack) == (
        "r1",
        "learned",
        "r1",
    )
    penalties = c.penalties()
    assert penalties["r1"] == {1.0}
    assert min(penalties["r3"]) == pytest.approx(4.0) and min(penalties["r2"]) > 4.0
    # Plans now start in r1, and a traced plan says why.
    key = murmur3_routing_keys(1, seed=4)[0]
    statement = SimpleStatement("SELECT 1", routing_key=key, keyspace="ks")
    record = PlanRecord()
    plan = list(c.policy._planner.plan("ks", statement, record))
    assert plan[0].rack == "r1"
    assert (record.local_rack, record.local_rack_source) == ("r1", "learned")


def test_a_configured_rack_or_the_childs_wins_over_learning():
    configured = Client(Config(policy=PolicyConfig(local_rack="r3")))
    child = Client(child_rack="r2")
    for _ in range(3):
        configured.second()
        child.second()
    assert (configured.policy.local_rack, configured.policy.local_rack_source) == (
        "r3",
        "configured",
    )
    assert (child.policy.local_rack, child.policy.local_rack_source) == ("r2", "child")
    assert configured.policy.learned_rack is None and child.policy.learned_rack is None


def test_null_turns_learning_off():
    c = Client(Config(policy=PolicyConfig(local_rack=None), health=HealthConfig(min_samples=20)))
    for _ in range(3):
        c.second()
    assert (c.policy.local_rack, c.policy.local_rack_source) == (None, "unknown")


def test_one_slow_local_node_never_flips_the_learned_rack():
    c = Client()
    for _ in range(3):
        c.second()
    slow = next(h for h in c.hosts if h.rack == "r1")
    c.extra_ms[slow] = 20.0
    for _ in range(60):
        c.second()
    assert c.policy.stats.get(slow).health_state is HealthState.SLOW
    assert c.policy.local_rack == "r1" and c.policy.learned_rack == "r1"


def test_a_restart_or_a_gc_pause_of_the_local_nodes_never_flips_it():
    c = Client()
    for _ in range(3):
        c.second()
    local = [h for h in c.hosts if h.rack == "r1"]
    for host in local:  # every local node restarts...
        c.policy.on_down(host)
    c.clock.advance_s(2.0)
    for _ in range(10):  # ...meanwhile the others answer, r3 faster than ever
        c.latency_ms["r3"] = 0.3
        c.second(("r2", "r3"))
    for host in local:
        c.policy.on_up(host)  # back, WARMING: not measured
    for _ in range(5):
        c.second(("r2", "r3"))
    assert c.policy.local_rack == "r1"
    # A local node stalled (GC pause): ERRORING, not measured; the others are far slower.
    c.latency_ms["r3"] = 1.0
    stuck = c.policy.stats.get(local[0])
    stuck.on_send()
    for _ in range(40):
        c.second(("r2", "r3"))
    assert stuck.health_state is HealthState.ERRORING
    assert c.policy.local_rack == "r1"


def test_a_moved_client_relearns_its_new_rack():
    c = Client()
    for _ in range(3):
        c.second()
    assert c.policy.local_rack == "r1"
    c.latency_ms = {"r1": 1.9, "r2": 0.7, "r3": 1.0}  # the pod now runs next to r2
    seconds = 0
    while c.policy.local_rack != "r2" and seconds < 120:
        # Only the racks that get traffic are measured: r1 alone while it is the local
        # rack, every rack once it is forgotten.
        c.second(("r1",) if c.policy.local_rack == "r1" else ("r1", "r2", "r3"))
        seconds += 1
    assert c.policy.local_rack == "r2" and c.policy.local_rack_source == "learned"
    # The window first has to show r1's jump (up to a 10 s window), then the doubt lasts
    # relearn_after, then the new rack is learned after learn_after.
    assert seconds <= 10 + LEARNING.relearn_after + LEARNING.learn_after + 1
    assert c.penalties()["r2"] == {1.0}


def test_the_decision_record_says_whether_the_rack_was_learned_or_configured():
    attributes = decision_attributes
    learned = attributes(PlanRecord(local_rack="r1", local_rack_source="learned"))
    assert learned["adaptive_lb.local_rack"] == "r1"
    assert learned["adaptive_lb.local_rack.source"] == "learned"
    unknown = attributes(PlanRecord())
    assert "adaptive_lb.local_rack" not in unknown
    assert unknown["adaptive_lb.local_rack.source"] == "unknown"
