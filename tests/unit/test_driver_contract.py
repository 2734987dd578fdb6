"""Fails loudly if a driver release changes an internal that adaptive_lb.runtime._driver or
adaptive_lb.plan._driver_policies relies on.

Every private or semi-private attribute adaptive-lb reads is listed in
adaptive_lb/runtime/_driver.py (request tracking: futures, pools) or
adaptive_lb/plan/_driver_policies.py (the child policy, the token map, tablets); this file checks
each one on the installed driver (CI runs it against both drivers).
"""

from __future__ import annotations

import importlib.metadata
import types

from cassandra.metadata import Metadata, TokenMap
from cassandra.policies import (
    DCAwareRoundRobinPolicy,
    DefaultLoadBalancingPolicy,
    HostFilterPolicy,
    TokenAwarePolicy,
)

from adaptive_lb.plan._driver_policies import (
    analyse_child,
    child_of,
    keyspace_replica_map,
    tablets_of,
    token_value_function,
)
from adaptive_lb.runtime._driver import (
    FUTURE_POLICY_ATTRIBUTE,
    driver_release,
    loop_timer,
    pool_in_flight_reader,
    tracking_problems,
)
from adaptive_lb.tools.sim.driver_topology import build_cluster


def installed_driver() -> str:
    for dist in ("scylla-driver", "cassandra-driver"):
        try:
            importlib.metadata.version(dist)
            return dist
        except importlib.metadata.PackageNotFoundError:
            continue
    raise AssertionError("neither cassandra-driver nor scylla-driver is installed")


def test_wrappers_keep_their_child_in_child_policy():
    inner = DCAwareRoundRobinPolicy("dc1")
    for wrapper in (
        TokenAwarePolicy(inner),
        HostFilterPolicy(inner, lambda h: True),
        DefaultLoadBalancingPolicy(inner),
    ):
        assert child_of(wrapper) is inner, type(wrapper).__name__


def test_analyse_child_looks_through_stock_wrappers():
    inner = DCAwareRoundRobinPolicy("dc1")
    chain = analyse_child(
        DefaultLoadBalancingPolicy(HostFilterPolicy(TokenAwarePolicy(inner), bool))
    )
    assert chain.base is inner
    assert chain.token_aware is not None
    assert chain.predicates == (bool,)
    assert chain.target_host_aware
    assert chain.membership_known


def test_token_map_layout():
    model = build_cluster({"dc1": [2, 2]}, seed=1, real_cluster=False)
    token_map = model.metadata.token_map
    assert isinstance(token_map, TokenMap)
    assert isinstance(token_map.tokens_to_hosts_by_ks, dict)
    assert isinstance(token_map.ring, list)
    replica_map = keyspace_replica_map(token_map, "ks")
    assert set(replica_map) == set(token_map.ring)
    value_of = token_value_function(token_map)
    key = b"\x00\x00\x00\x2a"
    assert value_of(key) == token_map.token_class.from_key(key).value
    assert isinstance(token_map.ring[0].value, int)


def test_tablets_attribute_matches_the_driver():
    tablets = tablets_of(Metadata())
    if installed_driver() == "scylla-driver":
        # Metadata._tablets with table_has_tablets and get_tablet_for_key: scylla-driver
        # 3.29.5 and later (3.29.0-3.29.4 have no table_has_tablets).
        assert tablets is not None, "no Metadata._tablets with the methods tablets_of needs"
        assert callable(tablets.table_has_tablets)
        assert callable(tablets.get_tablet_for_key)
    else:
        assert tablets is None


def test_response_future_internals_the_hook_uses():
    from cassandra.cluster import _NOT_SET, ResponseFuture

    # The hook overrides these four and, after _set_result, tells whether the request ended
    # by _final_result leaving its "not set" sentinel (the class default).
    for name in ("_query", "_set_result", "_set_final_result", "_set_final_exception"):
        assert callable(getattr(ResponseFuture, name)), name
    assert ResponseFuture._final_result is _NOT_SET


def test_response_future_keeps_its_policy_where_tracking_reads_it():
    from cassandra.cluster import ResponseFuture

    class Policy:
        def make_query_plan(self, working_keyspace=None, query=None):
            return iter(())

    policy = Policy()
    cluster = types.SimpleNamespace(_default_load_balancing_policy=None)
    session = types.SimpleNamespace(row_factory=None, keyspace=None, cluster=cluster)
    future = ResponseFuture(session, None, None, None, load_balancer=policy)
    assert getattr(future, FUTURE_POLICY_ATTRIBUTE) is policy


def test_the_runtime_check_finds_nothing_missing_in_this_driver():
    """What attach checks on the driver a user has (``tracking_problems``): nothing is
    missing in the releases we test, so tracking is on."""
    assert tracking_problems() == []
    assert driver_release().split()[0] in ("cassandra-driver", "scylla-driver")


def test_the_runtime_check_names_what_a_driver_release_changed():
    """A release that renamed what the hook overrides (a subclass stands in for it: no such
    release exists) is named, method and parameters, so tracking stays off."""
    from cassandra.cluster import ResponseFuture

    class Renamed(ResponseFuture):
        def _query(self, target, message=None, cb=None):
            return None

        _set_final_exception = None

    assert tracking_problems(Renamed) == [
        "ResponseFuture._query takes target, message, cb (expected host, message, cb)",
        "ResponseFuture._set_final_exception is gone",
    ]


def test_the_event_loop_timer_the_stall_rule_times_the_client_with():
    """``cluster.connection_class.create_timer(timeout, callback)``: how the driver times
    its own request timeouts, on the thread that reads the answers, a classmethod of every
    reactor's connection class. Fired for real in
    tests/integration/test_false_verdicts_simulacron.py."""
    import inspect

    from cassandra.cluster import Cluster
    from cassandra.connection import Connection

    cluster = Cluster(contact_points=["127.0.0.1"], protocol_version=4)
    try:
        create = loop_timer(types.SimpleNamespace(cluster=cluster))
        assert create is not None
        assert list(inspect.signature(create).parameters) == ["timeout", "callback"]
    finally:
        cluster.shutdown()
    assert "create_timer" in vars(Connection)  # the base class declares it
    assert loop_timer(types.SimpleNamespace()) is None


def test_per_request_host_targeting_the_probes_use():
    """Probes (adaptive_lb.runtime.prober) use public API only: ``Session.execute_async(...,
    timeout=, host=)`` sends to that host alone (both drivers since 3.x), the request-init
    listener sees the statement as ``ResponseFuture.query``, and the exceptions it
    classifies are where it imports them from."""
    import inspect

    from cassandra.cluster import ResponseFuture, Session

    parameters = inspect.signature(Session.execute_async).parameters
    assert {"timeout", "host"} <= set(parameters)
    init = inspect.signature(ResponseFuture.__init__).parameters
    assert {"query", "host"} <= set(init)
    assert hasattr(ResponseFuture, "query")  # documented: the statement being executed


def test_a_pool_says_when_it_is_shut_down():
    """The in-flight reader holds each host's pool until its ``is_shutdown`` (a class
    default of False, set by ``HostConnection.shutdown`` on both drivers)."""
    from cassandra.pool import HostConnection

    assert HostConnection.is_shutdown is False
    assert callable(HostConnection.shutdown)


class _Connection:
    def __init__(self, in_flight: int) -> None:
        self.in_flight = in_flight


class _Pool:
    """A pool as the reader sees it on either driver."""

    def __init__(self, in_flight: int) -> None:
        self.is_shutdown = False
        self._connection = _Connection(in_flight)
        self._connections = {0: self._connection}


def test_the_in_flight_reader_follows_the_pools_the_driver_renews_and_removes():
    hosts = build_cluster({"dc1": 2}, real_cluster=False).hosts
    a, b = hosts
    first = _Pool(3)
    session = types.SimpleNamespace(_pools={a: first})
    read = pool_in_flight_reader(session)
    assert (read(a), read(b)) == (3, 0)
    first._connection.in_flight = 4
    assert read(a) == 4  # live, from the pool held
    # renewed: the new pool goes in, then the old one is shut down
    second = _Pool(1)
    session._pools[a] = second
    first.is_shutdown = True
    assert read(a) == 1
    # a pool appears for a host that had none
    session._pools[b] = _Pool(7)
    assert read(b) == 7
    # removed: popped, then shut down
    del session._pools[a]
    second.is_shutdown = True
    assert read(a) == 0
