"""Concurrency: many threads planning and completing requests -- first tries, retries on
another host, speculative second attempts, client timeouts -- while another thread reloads
the config (valid, changed layouts, invalid). The counts must come out exact."""

from __future__ import annotations

import collections
import random
import sys
import threading
import time

from cassandra import OperationTimedOut
from cassandra.policies import DCAwareRoundRobinPolicy, TokenAwarePolicy
from cassandra.protocol import OverloadedErrorMessage, ReadTimeoutErrorMessage, ResultMessage

from adaptive_lb import AdaptiveLoadBalancingPolicy, Config, ConfigError
from adaptive_lb.config import HealthConfig, TrackingConfig
from adaptive_lb.runtime.attempts import Attempts
from adaptive_lb.tools.sim.driver_topology import build_cluster, murmur3_routing_keys
from tests.reliability.conftest import scaled, statement

THREADS = 16


def _cycle(policy, key, rng, sends: collections.Counter) -> None:
    """One request: plan, then one of the attempt patterns the driver produces."""
    plan = list(policy.make_query_plan("ks", statement(key)))
    assert len(plan) == len(set(plan))
    first, second = plan[0], plan[1]
    attempts = Attempts.of(policy)
    pattern = rng.random()
    attempts.sent(first)
    sends[first] += 1
    if pattern < 0.5:  # answered at once
        attempts.answered(first, ResultMessage(2))
        attempts.ended(None)
    elif pattern < 0.65:  # overloaded, retried on the next host
        attempts.answered(first, OverloadedErrorMessage(0x1001, "busy", None))
        attempts.sent(second)
        sends[second] += 1
        attempts.answered(second, ResultMessage(2))
        attempts.ended(None)
    elif pattern < 0.8:  # speculative execution wins; the first answer arrives late
        attempts.sent(second)
        sends[second] += 1
        attempts.answered(second, ResultMessage(2))
        attempts.ended(None)
        attempts.answered(first, ResultMessage(2))
    elif pattern < 0.9:  # server-side timeout, then the client gives up
        attempts.answered(first, ReadTimeoutErrorMessage(0x1200, "timeout", {}))
        attempts.ended(OperationTimedOut({}, first))
    else:  # the client times out with the attempt outstanding
        attempts.ended(OperationTimedOut({}, first))
        attempts.answered(first, ResultMessage(2))  # too late: must not release twice


def test_sixteen_threads_with_retries_and_reloads_keep_exact_counts(tmp_path):
    model = build_cluster({"dc1": [2, 2, 2], "dc2": [2, 2, 2]}, seed=11, real_cluster=False)
    policy = AdaptiveLoadBalancingPolicy(TokenAwarePolicy(DCAwareRoundRobinPolicy("dc1")))
    policy.populate(model.cluster, model.metadata.all_hosts())
    keys = murmur3_routing_keys(500, seed=4)
    configs = [
        Config(tracking=TrackingConfig(window=1.0, intervals=4, significant_digits=2)),
        Config(
            tracking=TrackingConfig(window=5.0, intervals=10, significant_digits=3),
            health=HealthConfig(refresh_interval=0.05),
        ),
    ]
    bad = tmp_path / "bad.yaml"
    bad.write_text("tracking:\n  window: -1\n")
    good = tmp_path / "good.yaml"
    good.write_text("policy:\n  sample_size: 4\n")
    cycles = scaled(2000)
    errors: list[BaseException] = []
    sends_by_thread = [collections.Counter() for _ in range(THREADS)]
    done = threading.Event()
    reloads = collections.Counter()

    def work(index: int) -> None:
        rng = random.Random(index)
        try:
            for _ in range(cycles):
                _cycle(policy, rng.choice(keys), rng, sends_by_thread[index])
                if rng.random() < 0.01:
                    policy.maybe_refresh_health()
        except BaseException as exc:
            errors.append(exc)

    def reload() -> None:
        step = 0
        try:
            while not done.is_set():
                choice = step % 4
                if choice < 2:
                    policy.reload(configs[choice])
                    reloads["config"] += 1
                elif choice == 2:
                    policy.reload(good)
                    reloads["file"] += 1
                else:
                    try:
                        policy.reload(bad)
                    except ConfigError:
                        reloads["rejected"] += 1
                step += 1
                time.sleep(0.001)
        except BaseException as exc:
            errors.append(exc)

    old_interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-5)
    reloader = threading.Thread(target=reload)
    workers = [threading.Thread(target=work, args=(i,)) for i in range(THREADS)]
    try:
        reloader.start()
        for worker in workers:
            worker.start()
        for worker in workers:
            worker.join(300)
    finally:
        done.set()
        reloader.join(30)
        sys.setswitchinterval(old_interval)

    assert not errors, errors[:3]
    assert not any(worker.is_alive() for worker in workers)
    assert reloads["config"] > 2 and reloads["rejected"] > 0
    sends: collections.Counter = collections.Counter()
    for counter in sends_by_thread:
        sends.update(counter)
    assert sum(sends.values()) >= THREADS * cycles
    for host in model.hosts:
        stats = policy.stats.peek(host)
        if stats is None:
            assert sends[host] == 0
            continue
        assert stats.in_flight == 0, host
        assert stats.underflows == 0, host
        released = stats.requests_total + stats.abandons_total + stats.unsent_total
        assert released == sends[host], host
    assert policy.internal_errors == 0
    assert policy.config_reloads["failure"] == reloads["rejected"]
    print(
        f"\n{THREADS} threads x {cycles} cycles, {sum(sends.values())} attempts, "
        f"{sum(reloads.values())} reloads ({reloads['rejected']} rejected)"
    )
