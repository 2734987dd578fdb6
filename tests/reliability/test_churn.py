"""Topology churn: hosts added, removed, marked down and up, token maps rebuilt, while 8
threads plan. No exception, no duplicate in any plan, no removed host in a plan begun after
its removal; once churn stops every plan is a permutation of the child's, and the removed
hosts' state is gone."""

from __future__ import annotations

import itertools
import random
import threading

from cassandra.policies import DCAwareRoundRobinPolicy, TokenAwarePolicy
from cassandra.protocol import ResultMessage

from adaptive_lb import AdaptiveLoadBalancingPolicy
from adaptive_lb.runtime.attempts import Attempts
from adaptive_lb.tools.sim.driver_topology import build_cluster, murmur3_routing_keys
from tests.reliability.conftest import scaled, statement

PLANNERS = 8


def test_planning_through_topology_churn():
    model = build_cluster({"dc1": [3, 3, 3], "dc2": [2, 2, 2]}, seed=21, real_cluster=False)
    policy = AdaptiveLoadBalancingPolicy(TokenAwarePolicy(DCAwareRoundRobinPolicy("dc1")))
    policy.populate(model.cluster, model.metadata.all_hosts())
    keys = murmur3_routing_keys(300, seed=8)
    sequence = itertools.count()  # orders removals and plan starts across threads
    removed_at: dict[int, tuple[int, object]] = {}  # id(host) -> (sequence, host)
    stop = threading.Event()
    errors: list[BaseException] = []
    violations: list[str] = []
    plans = [0] * PLANNERS

    def plan(index: int) -> None:
        rng = random.Random(index)
        try:
            while not stop.is_set():
                key = rng.choice(keys) if rng.random() < 0.9 else None
                query = statement(key) if key is not None else None
                started = next(sequence)
                hosts = list(policy.make_query_plan("ks", query))
                plans[index] += 1
                if len(hosts) != len(set(hosts)):
                    violations.append(f"duplicate in {hosts}")
                for host in hosts:
                    removal = removed_at.get(id(host))
                    if removal is not None and removal[1] is host and removal[0] < started:
                        violations.append(f"{host} yielded by a plan begun after its removal")
        except BaseException as exc:
            errors.append(exc)

    def churn() -> None:
        rng = random.Random(99)
        added: list = []
        serial = 0
        try:
            for step in range(scaled(1500)):
                action = rng.random()
                if action < 0.3 or len(added) < 3:
                    serial += 1
                    dc = "dc1" if rng.random() < 0.7 else "dc2"
                    rack = f"r{rng.randint(1, 3)}"
                    address = f"10.{serial // 60000}.{serial // 250 % 240}.{serial % 250 + 1}"
                    host = model.new_host(dc, rack, address, 4, rng)
                    policy.on_add(host)
                    policy.on_up(host)
                    added.append(host)
                elif action < 0.55:
                    host = added.pop(rng.randrange(len(added)))
                    policy.on_remove(host)
                    removed_at[id(host)] = (next(sequence), host)
                    model.remove_host(host)
                elif action < 0.6 and removed_at:
                    # Late events and attempts for a host already removed (the driver
                    # may deliver them): they must not bring it back.
                    _, gone = removed_at[rng.choice(list(removed_at))]
                    policy.on_down(gone)
                    policy.on_up(gone)
                    attempts = Attempts.of(policy)
                    attempts.sent(gone)
                    attempts.answered(gone, ResultMessage(2))
                elif action < 0.75:
                    policy.on_down(rng.choice(model.hosts))
                else:
                    policy.on_up(rng.choice(model.hosts))
                if step % 10 == 0:
                    model.rebuild_token_map()
        except BaseException as exc:
            errors.append(exc)
        finally:
            stop.set()

    planners = [threading.Thread(target=plan, args=(i,)) for i in range(PLANNERS)]
    churner = threading.Thread(target=churn)
    for thread in planners:
        thread.start()
    churner.start()
    churner.join(300)
    stop.set()
    for thread in planners:
        thread.join(60)

    assert not errors, errors[:3]
    assert not violations, violations[:5]
    assert all(count > 0 for count in plans)
    assert policy.internal_errors == 0

    # Churn has stopped: every host up again, and every plan is the child's hosts, once.
    for host in model.hosts:
        policy.on_up(host)
    model.rebuild_token_map()
    child = policy.child
    for key in keys[:100]:
        query = statement(key)
        ours = list(policy.make_query_plan("ks", query))
        theirs = list(child.make_query_plan("ks", query))
        assert len(ours) == len(set(ours))
        assert set(ours) == set(theirs)

    # Removed hosts' state is gone (a host object removed is never seen again here).
    removed = [host for _, host in removed_at.values()]
    assert removed
    for host in removed:
        assert host not in policy.stats
        assert policy.topology.view_of(host) is None
        assert policy.health.health(host) is None
    assert len(policy.stats) == len(model.hosts)
    print(f"\n{sum(plans)} plans by {PLANNERS} threads through {len(removed)} removals")
