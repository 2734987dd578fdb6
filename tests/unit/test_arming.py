"""Armed requests (adaptive_lb._driver_arming, issue 26): the plan picks the requests
tracking sees, through the driver's own ``Session.execute_async`` and ``_on_request`` (an
offline session: no server), with no per-request listener."""

from __future__ import annotations

import threading
from typing import Any

import pytest
from cassandra.cluster import Session
from cassandra.policies import DCAwareRoundRobinPolicy, TokenAwarePolicy
from cassandra.query import SimpleStatement

from adaptive_lb import AdaptiveLoadBalancingPolicy, instrument
from adaptive_lb._driver import is_tracked
from adaptive_lb._driver_arming import arming_problems
from adaptive_lb.clock import ManualClock
from adaptive_lb.tools.offline_session import OfflineFuture, OfflineSession
from adaptive_lb.tools.sim.driver_topology import build_cluster

STATEMENT = SimpleStatement("SELECT v FROM ks.t WHERE k = 1")


def offline(policy: AdaptiveLoadBalancingPolicy | None = None) -> tuple[Any, OfflineSession]:
    if policy is None:
        model = build_cluster({"dc1": [2, 2, 2]}, seed=3, real_cluster=False)
        policy = AdaptiveLoadBalancingPolicy(
            TokenAwarePolicy(DCAwareRoundRobinPolicy("dc1")), clock=ManualClock(0)
        )
        policy.populate(model.cluster, model.metadata.all_hosts())
    return policy, OfflineSession(policy)


def pin(policy: AdaptiveLoadBalancingPolicy, every: int) -> None:
    """Track one request in ``every``, the rate never re-measured (a frozen clock)."""
    policy.sampler.every = every
    policy.sampler.now_ns = lambda: 0
    policy.sampler._last_ns = 0


def tracked_total(policy: AdaptiveLoadBalancingPolicy) -> int:
    return sum(v.stats.requests_total for v in policy.topology.by_id.values())


def test_the_drivers_session_can_be_armed():
    _, session = offline()
    assert arming_problems(session) == []


def test_only_the_picked_requests_reach_tracking_and_user_listeners_see_all():
    policy, session = offline()
    seen = []
    session.add_request_init_listener(seen.append)  # the driver's public API
    tracker = instrument(session)
    assert tracker.arming and policy.arm is not None
    assert tracker._on_request not in [fn for fn, _, _ in session._request_init_callbacks]
    pin(policy, 4)
    futures = [session.execute_async(STATEMENT) for _ in range(4000)]
    hooked = [f for f in futures if is_tracked(f)]
    assert 800 <= len(hooked) <= 1200  # one in 4, at random
    assert tracked_total(policy) == len(hooked)  # each picked request tracked once
    assert all(type(f) is OfflineFuture for f in futures if not is_tracked(f))
    assert seen == futures  # the user's listener, for every request, in order
    assert "_on_request" not in vars(session)  # nothing armed: the driver's own method
    assert tracker.untracked_requests == 0
    tracker.close()
    assert policy.arm is None


def test_a_plan_without_its_request_hooks_nothing():
    policy, session = offline()
    tracker = instrument(session)
    pin(policy, 1)
    list(policy.make_query_plan(None, STATEMENT))  # e.g. Session.prepare: no request follows
    assert "_on_request" in vars(session)
    pin(policy, 10**9)  # the next request is not picked
    future = session.execute_async(SimpleStatement("SELECT 2"))
    assert not is_tracked(future)
    assert "_on_request" not in vars(session)
    assert tracked_total(policy) == 0
    tracker.close()


def test_another_threads_request_does_not_take_this_threads_arm():
    policy, session = offline()
    tracker = instrument(session)
    pin(policy, 1)
    list(policy.make_query_plan(None, STATEMENT))  # armed on this thread
    pin(policy, 10**9)
    futures = []
    thread = threading.Thread(target=lambda: futures.append(session.execute_async(STATEMENT)))
    thread.start()
    thread.join()
    assert not is_tracked(futures[0])
    assert "_on_request" in vars(session)  # still armed for this thread's request
    assert is_tracked(session.execute_async(STATEMENT))  # same statement, this thread
    assert "_on_request" not in vars(session)
    tracker.close()


def test_a_policy_shared_by_two_sessions_arms_both():
    policy, first = offline()
    _, second = offline(policy)
    trackers = [instrument(first), instrument(second)]
    pin(policy, 1)
    futures = [session.execute_async(STATEMENT) for session in (first, second, first)]
    assert all(is_tracked(f) for f in futures)
    assert tracked_total(policy) == 3
    trackers[0].close()
    assert is_tracked(second.execute_async(STATEMENT))
    assert not is_tracked(first.execute_async(STATEMENT))
    trackers[1].close()
    assert policy.arm is None


def test_telemetry_on_every_request_takes_the_listener_and_gives_it_back():
    class Telemetry:
        every_request = True
        spans = False

        def observe(self, future: Any, policy: Any) -> None:
            return None  # nothing recorded: plain tracking

    policy, session = offline()
    tracker = instrument(session)
    telemetry = Telemetry()
    tracker.telemetry = telemetry
    assert not tracker.arming and policy.arm is None
    assert [fn for fn, _, _ in session._request_init_callbacks] == [tracker._on_request]
    pin(policy, 1)
    assert is_tracked(session.execute_async(STATEMENT))
    telemetry.every_request = False
    tracker.reconsider()  # after a reload
    assert tracker.arming and policy.arm is not None
    assert session._request_init_callbacks == []
    assert is_tracked(session.execute_async(STATEMENT))
    assert tracked_total(policy) == 2
    tracker.close()


def test_an_error_in_tracking_an_armed_request_never_reaches_the_driver(monkeypatch):
    policy, session = offline()
    tracker = instrument(session)
    pin(policy, 1)

    def broken(*args: Any) -> None:
        raise RuntimeError("bug")

    monkeypatch.setattr(tracker, "_track", broken)
    future = session.execute_async(STATEMENT)
    assert future.sent_to is not None  # sent as usual
    assert policy.internal_errors_by_stage["tracking"] == 1
    tracker.close()


def test_a_driver_that_calls_no_on_request_is_not_armed(caplog):
    class Direct(OfflineSession):
        def execute_async(self, query: Any, *args: Any, **kwargs: Any) -> Any:
            future = self._create_response_future(query)
            future.send_request()
            return future

    class Guarded(OfflineSession):
        def __getattribute__(self, name: str) -> Any:
            return super().__getattribute__(name)

    policy, _ = offline()
    (problem,) = arming_problems(Direct(policy))
    assert "execute_async does ['create', 'send']" in problem
    (problem,) = arming_problems(Guarded(policy))
    assert "cannot override _on_request" in problem
    with caplog.at_level("WARNING", logger="adaptive_lb.tracking"):
        tracker = instrument(Direct(policy))
    assert not tracker.arming and tracker.arming_problems  # the listener instead
    (warning,) = [r for r in caplog.records if "does not create requests" in r.getMessage()]
    assert "execute_async does" in warning.getMessage()
    assert policy.arm is None
    listeners = tracker._session._request_init_callbacks
    assert [fn for fn, _, _ in listeners] == [tracker._on_request]
    tracker.close()


@pytest.mark.parametrize("every", [1, 3])
def test_the_sampler_counts_each_plan_once(every):
    policy, session = offline()
    tracker = instrument(session)
    pin(policy, every)
    for _ in range(300):
        session.execute_async(STATEMENT)
    assert policy.sampler.requests == 300
    tracker.close()


def test_the_session_class_is_the_drivers():
    assert OfflineSession.execute_async is Session.execute_async
    assert OfflineSession._on_request is Session._on_request


def test_notes_left_by_plans_without_requests_are_bounded(monkeypatch):
    from adaptive_lb import _driver_arming

    policy, session = offline()
    tracker = instrument(session)
    pin(policy, 1)
    monkeypatch.setattr(_driver_arming, "_MAX_ARMED", 8)
    planned = threading.Barrier(21)

    def plan_only() -> None:  # e.g. a thread that prepares a statement, then ends
        list(policy.make_query_plan(None, SimpleStatement("SELECT 1")))
        planned.wait()  # all alive at once: 20 distinct threads

    threads = [threading.Thread(target=plan_only) for _ in range(20)]
    for thread in threads:
        thread.start()
    planned.wait()
    for thread in threads:
        thread.join()
    assert 1 <= len(_driver_arming._armed) <= 8
    assert is_tracked(session.execute_async(STATEMENT))  # arming still works
    tracker.close()
