"""The future hook (adaptive_lb.runtime._driver.hook_future) on a real ResponseFuture whose network
steps are stand-ins that do what the driver's do with the request's state: every attempt
reported once, the end of the request where it happens."""

from __future__ import annotations

from cassandra.cluster import ResponseFuture
from cassandra.policies import DCAwareRoundRobinPolicy, TokenAwarePolicy
from cassandra.protocol import ResultMessage

from adaptive_lb import AdaptiveLoadBalancingPolicy
from adaptive_lb.core.clock import ManualClock
from adaptive_lb.runtime._driver import hook_future
from adaptive_lb.runtime.attempts import Attempts
from adaptive_lb.tools.offline_session import unsent_future
from adaptive_lb.tools.sim.driver_topology import build_cluster

SCHEMA_CHANGE = ResultMessage(5)  # RESULT_KIND_SCHEMA_CHANGE: the driver ends it later


class DriverLikeFuture(ResponseFuture):
    """The driver's request bookkeeping without a network: ``_set_result`` ends the request
    with the response, except a schema change, which the driver ends later from another
    thread (after refreshing its schema)."""

    def _query(self, host, message=None, cb=None):
        return 1

    def _set_result(self, host, connection, pool, response):
        if self._final_result is not ResponseFuture._final_result:
            return None  # a late response: the driver drops it
        if response is not SCHEMA_CHANGE:
            self._set_final_result(response)
        return None

    def _set_final_result(self, response):
        self._final_result = response

    def _set_final_exception(self, response, *args, **kwargs):
        self._final_exception = response


def new_future(policy):
    """A ResponseFuture in the state its ``__init__`` leaves it, without a session."""
    return unsent_future(DriverLikeFuture, policy)


class Recorded(Attempts):
    """Tracking, plus a record of when the request was heard to end."""

    __slots__ = ("ends",)

    def ended(self, exception):
        self.ends.append(exception)
        Attempts.ended(self, exception)

    def __bool__(self):
        return True  # like a request span's attempts: hears every end

    @classmethod
    def hooked(cls, future, policy):
        """A Recorded attempts object of ``policy``, hooked on ``future`` with every_end."""
        attempts = cls.of(policy)
        attempts.ends = []
        hook_future(future, attempts, every_end=True)
        return attempts


# Not named ``setup``: pytest 8.0 (the dev extra's floor) calls a module-level function of
# that name before the module's tests, as nose did (pytest 8.1 dropped that).
def build():
    model = build_cluster({"dc1": [2, 2, 2]}, seed=3, real_cluster=False)
    policy = AdaptiveLoadBalancingPolicy(
        TokenAwarePolicy(DCAwareRoundRobinPolicy("dc1")), clock=ManualClock(0)
    )
    policy.populate(model.cluster, model.metadata.all_hosts())
    return model.hosts, policy


def test_a_speculative_loser_is_abandoned_when_the_winner_ends_the_request():
    (first, second, *_), policy = build()
    future = new_future(policy)
    hook_future(future, Attempts.of(policy))
    future._query(first)
    future._query(second)  # speculative execution
    future._set_result(second, None, None, ResultMessage(2))
    loser, winner = policy.stats.get(first), policy.stats.get(second)
    assert (loser.in_flight, loser.abandons_total, loser.requests_total) == (0, 1, 0)
    assert (winner.in_flight, winner.requests_total) == (0, 1)
    future._set_result(first, None, None, ResultMessage(2))  # the loser's late answer
    assert loser.underflows == 0 and loser.requests_total == 0


def test_a_request_ended_outside_a_response_releases_its_loser_when_it_answers():
    (first, second, *_), policy = build()
    future = new_future(policy)
    hook_future(future, Attempts.of(policy))
    assert "_set_final_result" not in vars(type(future))  # one call less per request
    future._query(first)
    future._query(second)
    future._set_result(second, None, None, SCHEMA_CHANGE)
    future._set_final_result(None)  # the driver, after its schema refresh
    loser = policy.stats.get(first)
    assert loser.in_flight == 1  # still out: the host is still working on it
    future._set_result(first, None, None, ResultMessage(2))
    assert (loser.in_flight, loser.requests_total, loser.underflows) == (0, 1, 0)


def test_every_end_hears_a_request_that_ends_outside_a_response():
    (first, *_), policy = build()
    future = new_future(policy)
    attempts = Recorded.hooked(future, policy)
    future._query(first)
    future._set_result(first, None, None, SCHEMA_CHANGE)
    assert attempts.ends == []
    future._set_final_result(None)
    assert attempts.ends == [None]
    assert policy.stats.get(first).in_flight == 0


def test_every_end_hears_the_end_once_when_a_response_ends_it():
    (first, *_), policy = build()
    future = new_future(policy)
    attempts = Recorded.hooked(future, policy)
    future._query(first)
    future._set_result(first, None, None, ResultMessage(2))
    assert len(attempts.ends) >= 1  # Recorded is always truthy: the post-check hears it too
    assert policy.stats.get(first).requests_total == 1
    assert policy.stats.get(first).underflows == 0


def test_hooking_again_switches_flavour_without_stacking_hooks():
    (first, *_), policy = build()
    future = new_future(policy)
    hook_future(future, Attempts.of(policy))
    plain = type(future)
    hook_future(future, Attempts.of(policy), every_end=True)
    every_end = type(future)
    assert every_end is not plain and "_set_final_result" in vars(every_end)
    hook_future(future, Attempts.of(policy))
    assert type(future) is plain
    # Each attempt is still reported exactly once.
    future._query(first)
    assert policy.stats.get(first).in_flight == 1
    future._set_result(first, None, None, ResultMessage(2))
    assert policy.stats.get(first).in_flight == 0
    assert [c for c in type(future).__mro__ if c is DriverLikeFuture] == [DriverLikeFuture]
    assert type(future).__mro__.index(DriverLikeFuture) == 1
