"""Request tracking: exact in-flight accounting across retries, speculative executions,
timeouts and shutdown, with the driver's real response messages."""

from __future__ import annotations

import random
import sys
import threading

from cassandra import OperationTimedOut
from cassandra.connection import ConnectionShutdown
from cassandra.policies import DCAwareRoundRobinPolicy, TokenAwarePolicy
from cassandra.protocol import (
    OverloadedErrorMessage,
    ReadTimeoutErrorMessage,
    ResultMessage,
    SyntaxException,
    UnavailableErrorMessage,
)

from adaptive_lb import AdaptiveLoadBalancingPolicy
from adaptive_lb.core.clock import ManualClock
from adaptive_lb.runtime.attempts import Attempts
from adaptive_lb.runtime.tracking import RequestTracker
from adaptive_lb.tools.sim.driver_topology import build_cluster

MS = 1_000_000


class ListenerRegistry:
    """Stands in for the two Session methods RequestTracker uses (the real Session needs a
    live cluster; tests/integration covers that)."""

    def __init__(self) -> None:
        self.listeners = []

    def add_request_init_listener(self, fn, *args, **kwargs):
        self.listeners.append(fn)

    def remove_request_init_listener(self, fn, *args, **kwargs):
        self.listeners.remove(fn)


# Not named ``setup``: pytest 8.0 (the dev extra's floor) calls a module-level function of
# that name before the module's tests, as nose did (pytest 8.1 dropped that).
def build(clock=None):
    model = build_cluster({"dc1": [2, 2, 2]}, seed=3, real_cluster=False)
    policy = AdaptiveLoadBalancingPolicy(
        TokenAwarePolicy(DCAwareRoundRobinPolicy("dc1")), clock=clock or ManualClock(0)
    )
    policy.populate(model.cluster, model.metadata.all_hosts())
    tracker = RequestTracker(ListenerRegistry())
    return model, policy, tracker


def success():
    return ResultMessage(2)


def test_outcomes_are_classified():
    clock = ManualClock(0)
    model, policy, _tracker = build(clock)
    host = model.hosts[0]
    stats = policy.stats.get(host)
    cases = [
        (success(), "success"),
        (OverloadedErrorMessage(0x1001, "busy", None), "error"),
        (UnavailableErrorMessage(0x1000, "unavailable", {}), "error"),
        (ReadTimeoutErrorMessage(0x1200, "timeout", {}), "timeout"),
        (SyntaxException(0x2000, "bad cql", None), "success"),  # not the host's fault
        (ConnectionShutdown("gone"), "error"),
    ]
    for response, _ in cases:
        attempts = Attempts.of(policy)
        attempts.sent(host)
        assert stats.in_flight == 1
        clock.advance(3 * MS)
        attempts.answered(host, response)
        assert stats.in_flight == 0
    window = stats.window_stats()
    assert (window.successes, window.errors, window.timeouts) == (2, 3, 1)
    # Fast errors are not latency samples; successes and the server timeout are.
    assert window.samples == 3


def test_speculative_loser_is_released_once_when_the_request_ends():
    model, policy, _tracker = build()
    first, second = model.hosts[0], model.hosts[1]
    attempts = Attempts.of(policy)
    attempts.sent(first)
    attempts.sent(second)  # speculative execution
    attempts.answered(second, success())
    attempts.ended(None)
    assert policy.stats.get(first).in_flight == 0
    assert policy.stats.get(first).requests_total == 0  # abandoned, no outcome
    # The loser's late response must not release it a second time.
    attempts.answered(first, success())
    assert policy.stats.get(first).underflows == 0


def test_client_timeout_counts_a_timeout_on_every_outstanding_attempt():
    clock = ManualClock(0)
    model, policy, _tracker = build(clock)
    attempts = Attempts.of(policy)
    attempts.sent(model.hosts[0])
    attempts.sent(model.hosts[1])
    clock.advance(2000 * MS)
    attempts.ended(OperationTimedOut({}, model.hosts[1]))
    for host in model.hosts[:2]:
        stats = policy.stats.get(host)
        assert stats.in_flight == 0 and stats.timeouts_total == 1
        assert stats.window_stats((100.0,)).latency[100.0] >= 1.99


def test_not_sent_attempt_is_released():
    model, policy, _tracker = build()
    attempts = Attempts.of(policy)
    attempts.sent(model.hosts[0])
    attempts.not_sent(model.hosts[0])
    stats = policy.stats.get(model.hosts[0])
    assert stats.in_flight == 0
    assert (stats.unsent_total, stats.abandons_total, stats.requests_total) == (1, 0, 0)


def test_shutdown_releases_everything_in_flight():
    """On shutdown the driver answers every pending attempt with ConnectionShutdown."""
    model, policy, tracker = build()
    pending = []
    for host in model.hosts:
        attempts = Attempts.of(policy)
        attempts.sent(host)
        pending.append((attempts, host))
    assert sum(policy.stats.get(h).in_flight for h in model.hosts) == len(model.hosts)
    tracker.close()
    for attempts, host in pending:
        attempts.answered(host, ConnectionShutdown("shutting down"))
        attempts.ended(ConnectionShutdown("shutting down"))
    assert all(policy.stats.get(h).in_flight == 0 for h in model.hosts)
    assert tracker._session.listeners == []


def test_many_threads_random_attempt_histories_end_at_zero():
    """16 threads x 10,000 attempts: first tries, retries on another host, speculative
    executions, successes, fast and slow errors, client timeouts, late responses. The
    threads switch every 10 us instead of every 5 ms: more interleavings in fewer attempts."""
    model, policy, _tracker = build(ManualClock(0))
    hosts = model.hosts
    responses = [
        success,
        lambda: OverloadedErrorMessage(0x1001, "busy", None),
        lambda: ReadTimeoutErrorMessage(0x1200, "timeout", {}),
    ]
    totals = {"attempts": 0, "outcomes": 0}
    lock = threading.Lock()

    def worker(seed: int) -> None:
        rng = random.Random(seed)
        attempts_made = outcomes = 0
        while attempts_made < 10_000:
            request = Attempts.of(policy)
            plan = rng.sample(hosts, 3)
            outstanding = [plan[0]]
            request.sent(plan[0])
            attempts_made += 1
            if rng.random() < 0.3:  # retry on the next host after an error
                request.answered(plan[0], responses[1]())
                outcomes += 1
                outstanding = [plan[1]]
                request.sent(plan[1])
                attempts_made += 1
            if rng.random() < 0.3:  # speculative execution beside it
                request.sent(plan[2])
                outstanding.append(plan[2])
                attempts_made += 1
            roll = rng.random()
            if roll < 0.1:
                request.ended(OperationTimedOut({}, outstanding[0]))
                outcomes += len(outstanding)
            else:
                winner = rng.choice(outstanding)
                request.answered(winner, rng.choice(responses)())
                outcomes += 1
                request.ended(None)
            if rng.random() < 0.2:  # late response after the end
                request.answered(rng.choice(outstanding), success())
        with lock:
            totals["attempts"] += attempts_made
            totals["outcomes"] += outcomes

    threads = [threading.Thread(target=worker, args=(seed,)) for seed in range(16)]
    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-5)
    try:
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    finally:
        sys.setswitchinterval(interval)
    stats = [policy.stats.get(h) for h in hosts]
    assert all(s.in_flight == 0 for s in stats)
    assert all(s.underflows == 0 for s in stats)
    assert sum(s.requests_total for s in stats) == totals["outcomes"]
