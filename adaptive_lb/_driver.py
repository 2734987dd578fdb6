"""Every place adaptive-lb relies on the driver's internals, in one module.

The drivers' public API does not expose a wrapper policy's child, nor scylla-driver's tablet
map. Both are needed (to do TokenAwarePolicy's replica work once instead of twice, and to
route tablet tables), so they are read here and nowhere else. ``tests/unit/test_driver_contract.py``
fails loudly if a driver release renames or removes any of them, on both drivers.
"""

from __future__ import annotations

import importlib.metadata
import inspect
import threading
from collections.abc import Callable
from functools import partial
from typing import Any

import cassandra.cluster
from attrs import define
from cassandra.cluster import ResponseFuture
from cassandra.policies import (
    DCAwareRoundRobinPolicy,
    DefaultLoadBalancingPolicy,
    HostDistance,
    HostFilterPolicy,
    LoadBalancingPolicy,
    RoundRobinPolicy,
    TokenAwarePolicy,
    WhiteListRoundRobinPolicy,
)
from cassandra.pool import HostConnection

try:  # scylla-driver only
    from cassandra.policies import RackAwareRoundRobinPolicy
except ImportError:  # cassandra-driver
    RackAwareRoundRobinPolicy = None

__all__ = [
    "LOCAL_DISTANCES",
    "ChildChain",
    "analyse_child",
    "child_of",
    "cluster_is_open",
    "driver_release",
    "is_tracked",
    "pool_in_flight_reader",
    "pool_problems",
    "session_pools",
    "tablets_of",
    "tracking_problems",
]

_NOT_SET: Any = getattr(cassandra.cluster, "_NOT_SET", None)
"""The driver's "no result yet" sentinel (None: this driver has none; see
:func:`tracking_problems`)."""

LOCAL_DISTANCES: frozenset[int] = frozenset(
    d for d in (getattr(HostDistance, "LOCAL_RACK", None), HostDistance.LOCAL) if d is not None
)
"""Distances of hosts that may be candidates (scylla-driver adds LOCAL_RACK)."""

# Stock policies whose query plan is exactly "the live hosts they were told about via
# populate / on_up / on_add, minus on_down / on_remove, at a non-IGNORED distance", as long
# as a subclass does not override the methods that define that.
_KNOWN_BASES: tuple[type, ...] = tuple(
    cls
    for cls in (
        DCAwareRoundRobinPolicy,
        RackAwareRoundRobinPolicy,
        RoundRobinPolicy,
        WhiteListRoundRobinPolicy,
    )
    if cls is not None
)
_MEMBERSHIP_METHODS = ("make_query_plan", "distance", "populate", "on_up", "on_down", "on_add")


def child_of(policy: LoadBalancingPolicy) -> LoadBalancingPolicy:
    """The child of a stock wrapper policy (private ``_child_policy`` on both drivers)."""
    return policy._child_policy


def cluster_is_open(cluster: Any) -> bool:
    """Whether the ``Cluster`` a policy was populated with is still open: the driver hands
    policies a ``weakref.proxy`` of it, dead once the Cluster is garbage-collected."""
    try:
        return not getattr(cluster, "is_shutdown", False)
    except ReferenceError:
        return False


def tablets_of(metadata: Any) -> Any | None:
    """scylla-driver's tablet map of ``metadata`` (private ``_tablets``), or None."""
    tablets = getattr(metadata, "_tablets", None)
    if tablets is None:
        return None
    if not (hasattr(tablets, "table_has_tablets") and hasattr(tablets, "get_tablet_for_key")):
        return None
    return tablets


def _is_stock(policy: Any, cls: type, methods: tuple[str, ...]) -> bool:
    if not isinstance(policy, cls):
        return False
    policy_type = type(policy)
    return all(getattr(policy_type, name) is getattr(cls, name) for name in methods)


@define(frozen=True, slots=True)
class ChildChain:
    """What :func:`analyse_child` learned about a child policy."""

    base: LoadBalancingPolicy
    """The policy whose plan supplies "the rest" (a TokenAwarePolicy is looked through)."""
    token_aware: TokenAwarePolicy | None
    """The TokenAwarePolicy in the chain, whose replica work adaptive-lb does itself."""
    predicates: tuple[Callable[[Any], Any], ...]
    """HostFilterPolicy predicates between the child and ``base``: applied to the rest of
    the plan and to every candidate at plan time (a predicate's answer may change)."""
    target_host_aware: bool
    """A DefaultLoadBalancingPolicy is in the chain: statements with ``target_host`` get the
    child's plan unchanged."""
    membership_known: bool
    """``base`` is a stock policy whose plan is exactly its live non-IGNORED hosts, so
    candidates can come from the topology snapshot without materialising the plan."""


def analyse_child(child: LoadBalancingPolicy) -> ChildChain:
    """Look through the stock wrappers around the policy that really orders hosts.

    TokenAwarePolicy, HostFilterPolicy and DefaultLoadBalancingPolicy are looked through
    only when their subclass (if any) does not override ``make_query_plan`` or ``distance``:
    a user's own override must run as written.
    """
    policy = child
    token_aware = None
    predicates: list[Callable[[Any], Any]] = []
    target_host_aware = False
    while True:
        if _is_stock(policy, TokenAwarePolicy, ("make_query_plan", "distance")):
            if token_aware is None:
                token_aware = policy
            policy = child_of(policy)
        elif _is_stock(policy, HostFilterPolicy, ("make_query_plan", "distance")):
            predicates.append(policy.predicate)
            policy = child_of(policy)
        elif _is_stock(policy, DefaultLoadBalancingPolicy, ("make_query_plan", "distance")):
            target_host_aware = True
            policy = child_of(policy)
        else:
            break
    membership_known = any(_is_stock(policy, cls, _MEMBERSHIP_METHODS) for cls in _KNOWN_BASES)
    return ChildChain(
        base=policy,
        token_aware=token_aware,
        predicates=tuple(predicates),
        target_host_aware=target_host_aware,
        membership_known=membership_known,
    )


def keyspace_replica_map(token_map: Any, keyspace: str) -> dict[Any, Any] | None:
    """The driver's ``{Token: replicas}`` map of ``keyspace`` (``TokenMap.tokens_to_hosts_by_ks``),
    built on first use exactly as ``TokenMap.get_replicas`` would. The object is replaced by
    the driver when the keyspace's replication changes, so its identity tells whether a
    resolution made from it is still current."""
    by_keyspace = token_map.tokens_to_hosts_by_ks
    replica_map = by_keyspace.get(keyspace)
    if replica_map is None:
        token_map.rebuild_keyspace(keyspace, build_if_absent=True)
        replica_map = by_keyspace.get(keyspace)
    return replica_map


def token_value_function(token_map: Any) -> Callable[[bytes], Any]:
    """A function routing key -> comparable token value (int for Murmur3 / MD5), without
    building a ``Token`` object when the token class has a hash function."""
    token_class = token_map.token_class
    hash_fn = getattr(token_class, "hash_fn", None)
    if hash_fn is not None:
        return hash_fn
    from_key = token_class.from_key
    return lambda key: from_key(key).value


FUTURE_POLICY_ATTRIBUTE = "_load_balancer"
"""The private ``ResponseFuture`` attribute holding the load-balancing policy that made its
query plan (its execution profile's policy), on both drivers. Read with ``getattr`` on
every request, so a name rather than a function (one Python call less)."""


_TRACKED_CLASSES: dict[tuple[type, bool], type] = {}
"""(a future's class, every_end) -> the class to switch it to."""
_TRACKED_BASES: dict[type, type] = {}
"""A tracked class -> the class it tracks."""
_tracked_classes_lock = threading.Lock()


def _tracked_class(cls: type[Any], every_end: bool) -> type:
    """A subclass of ``cls`` (``ResponseFuture`` or a user's subclass of it) whose attempt
    methods report to ``self._adaptive_lb_attempts`` around what ``cls`` does (see
    :func:`hook_future`); for a class that is tracked already, the same for the class it
    tracks. Built once per (class, ``every_end``): a hooked future then costs one
    ``__class__`` assignment, not closures (the per-instance alternative costs ~2 us
    more)."""
    base: Any = _TRACKED_BASES.get(cls, cls)
    key = (base, every_end)
    tracked = _TRACKED_CLASSES.get(key)
    if tracked is not None:
        return tracked
    # The base's own functions, looked up once: cheaper per call than super().
    base_query = base._query
    base_set_result = base._set_result
    base_set_final_result = base._set_final_result
    base_set_final_exception = base._set_final_exception

    class TrackedResponseFuture(base):
        __slots__ = ()  # same layout as base, so __class__ can be assigned

        def _query(self: Any, host: Any, message: Any = None, cb: Any = None) -> Any:
            attempts = self._adaptive_lb_attempts
            attempts.sent(host)
            if cb is not None:  # the driver re-prepares: the response goes to cb instead
                callback = cb

                def cb(response: Any) -> Any:
                    attempts.answered(host, response)
                    return callback(response)

            try:
                request_id = base_query(self, host, message, cb)
            except BaseException:
                attempts.not_sent(host)
                raise
            if request_id is None:  # no connection could take it
                attempts.not_sent(host)
            return request_id

        def _set_result(self: Any, host: Any, connection: Any, pool: Any, response: Any) -> Any:
            attempts = self._adaptive_lb_attempts
            attempts.answered(host, response)
            result = base_set_result(self, host, connection, pool, response)
            # Usually empty by now: the winning response released its own attempt. When not
            # (speculative executions still out), the request may have ended in there.
            if attempts and self._final_result is not _NOT_SET:
                attempts.ended(None)
            return result

        def _set_final_exception(self: Any, response: Any, *args: Any, **kwargs: Any) -> Any:
            attempts = self._adaptive_lb_attempts
            if attempts:
                attempts.ended(response)
            return base_set_final_exception(self, response, *args, **kwargs)

    if every_end:

        class EveryEndResponseFuture(TrackedResponseFuture):
            __slots__ = ()

            def _set_final_result(self: Any, response: Any) -> Any:
                attempts = self._adaptive_lb_attempts
                if attempts:
                    attempts.ended(None)
                return base_set_final_result(self, response)

        tracked = EveryEndResponseFuture
        name = f"TrackedEveryEnd{base.__name__}"
    else:
        tracked = TrackedResponseFuture
        name = f"Tracked{base.__name__}"
    tracked.__qualname__ = tracked.__name__ = name  # which flavour, in tracebacks
    with _tracked_classes_lock:
        tracked = _TRACKED_CLASSES.setdefault(key, tracked)
        _TRACKED_BASES[tracked] = base
        _TRACKED_CLASSES[(cls, every_end)] = tracked
        return tracked


def is_tracked(future: Any) -> bool:
    """Whether ``future`` was hooked by :func:`hook_future` (its request is tracked)."""
    return hasattr(future, "_adaptive_lb_attempts")


def hook_future(future: Any, attempts: Any, every_end: bool = False) -> None:
    """Observe every attempt ``future`` makes, on whichever thread makes it.

    The driver sends each attempt (first try, retry, speculative execution) through
    ``ResponseFuture._query(host, message, cb)``, delivers its response to
    ``ResponseFuture._set_result(host, connection, pool, response)`` -- looked up on the
    future when the attempt is sent -- or to the custom ``cb`` it was sent with
    (re-prepare), and ends the request with ``_set_final_result(response)`` or
    ``_set_final_exception(exc, ...)``. None of these is public, so this one future's class
    is switched to a subclass of its own class that reports each call before making it (no
    driver class is modified; other futures are untouched). ``attempts`` receives:

    * ``sent(host)`` just before an attempt is written (so a response racing in on the I/O
      thread always finds it counted), ``not_sent(host)`` if the driver could not send it;
    * ``answered(host, response)`` when its response (a message, or an exception such as
      ``ConnectionShutdown``) arrives, before the driver acts on it;
    * ``ended(exception_or_None)``, while ``attempts`` is truthy (it has attempts
      outstanding), when the request ends: on a client-side timeout or final error, and
      after the response the request ended with.

    A request can also end outside any response: the driver refreshes the schema after a
    DDL statement, or sets the keyspace of every connection after ``USE``, then calls
    ``_set_final_result`` from another thread or callback. Tracking needs no call then (an
    attempt still outstanding is released by its own response, or by the
    ``ConnectionShutdown`` its connection delivers), so only with ``every_end`` is
    ``_set_final_result`` overridden too: it is one call from the driver's compiled code
    into the interpreter per request (~1 us end to end), which only a request span, finished
    by ``ended``, needs.

    Hooking a future a second time replaces its ``attempts`` (and its class, as
    ``every_end`` says).
    """
    future._adaptive_lb_attempts = attempts
    cls = type(future)
    future.__class__ = _TRACKED_CLASSES.get((cls, every_end)) or _tracked_class(cls, every_end)


_HOOKED_METHODS: dict[str, tuple[str, ...]] = {
    "_query": ("host", "message", "cb"),
    "_set_result": ("host", "connection", "pool", "response"),
    "_set_final_result": ("response",),
    "_set_final_exception": ("response",),
}
"""The ``ResponseFuture`` methods :func:`hook_future` overrides, and their leading
parameters (after ``self``) as it calls them."""


def tracking_problems(future_class: type = ResponseFuture) -> list[str]:
    """What request tracking relies on in this driver and does not find, checked when a
    session is instrumented (empty: all there). A driver release that renamed one of them
    would otherwise have its requests hooked wrongly; the caller turns tracking off instead.
    ``tests/unit/test_driver_contract.py`` pins the same and more, at test time."""
    problems = []
    if _NOT_SET is None:
        problems.append("cassandra.cluster._NOT_SET is gone")
    for name, expected in _HOOKED_METHODS.items():
        method = getattr(future_class, name, None)
        if not callable(method):
            problems.append(f"ResponseFuture.{name} is gone")
            continue
        try:
            parameters = tuple(inspect.signature(method).parameters)[1 : 1 + len(expected)]
        except (TypeError, ValueError):  # compiled without a signature: nothing to compare
            continue
        if parameters != expected:
            problems.append(
                f"ResponseFuture.{name} takes {', '.join(parameters) or 'nothing'} "
                f"(expected {', '.join(expected)})"
            )
    return problems


def driver_release() -> str:
    """The distribution and version providing the ``cassandra`` module, for messages."""
    for distribution in ("scylla-driver", "cassandra-driver"):
        try:
            return f"{distribution} {importlib.metadata.version(distribution)}"
        except importlib.metadata.PackageNotFoundError:
            continue
    return f"cassandra module {getattr(cassandra, '__version__', '?')}"


# ---------------------------------------------------------------- in flight, from the pools


def session_pools(session: Any) -> dict[Any, Any]:
    """The session's connection pools, ``Host -> HostConnection``: the driver's own dict,
    live (pools come and go with hosts and reconnections)."""
    pools: dict[Any, Any] = session._pools
    return pools


def _single_in_flight(pools: dict[Any, Any], host: Any) -> int:
    # cassandra-driver: one connection, a class attribute (None while it is replaced).
    pool = pools.get(host)
    if pool is None:
        return 0
    connection = pool._connection
    return 0 if connection is None else connection.in_flight


def _sharded_in_flight(pools: dict[Any, Any], host: Any) -> int:
    # scylla-driver: one connection per shard (no _connection attribute: a getattr with a
    # default would raise and catch AttributeError on every read).
    pool = pools.get(host)
    if pool is None:
        return 0
    total = 0
    for connection in pool._connections.values():
        total += connection.in_flight
    return total


def pool_in_flight_reader(session: Any) -> Callable[[Any], int]:
    """``host -> requests in flight`` on ``session``'s pool of that host, as the driver
    counts them.

    Each connection's ``in_flight`` rises when an attempt borrows a stream and falls when
    its response is processed or, for a request the client gave up on, when the server's
    late answer releases the orphaned stream: retries, speculative executions, probes and
    the driver's own requests on the connection (heartbeats, ``USE``) all count. One
    connection per host on cassandra-driver (``_connection``, a class attribute), one per
    shard on scylla-driver (``_connections``), told apart once, here; a replaced connection
    waiting for its last answers (``_trash``) is no longer counted. No pool (a host down,
    ignored or not yet connected): 0."""
    pools = session_pools(session)
    single = "_connection" in vars(HostConnection)
    return partial(_single_in_flight if single else _sharded_in_flight, pools)


def pool_problems(session: Any) -> list[str]:
    """What reading in-flight counts from ``session``'s pools relies on and does not find
    (empty: all there), checked at attach on the pools the session has opened; the
    caller then counts in-flight attempts itself, as before. The contract tests pin the
    same at test time."""
    pools = getattr(session, "_pools", None)
    if not isinstance(pools, dict):
        return ["Session._pools is not a dict of connection pools"]
    problems = []
    for pool in list(pools.values()):
        connection = getattr(pool, "_connection", None)
        connections = getattr(pool, "_connections", None)
        if connection is None and isinstance(connections, dict):
            members = list(connections.values())
        elif connection is not None:
            members = [connection]
        else:
            problems.append(f"{type(pool).__name__} has neither _connection nor _connections")
            continue
        for member in members:
            if not isinstance(getattr(member, "in_flight", None), int):
                problems.append(f"{type(member).__name__}.in_flight is not an int")
        if problems:
            break
    return problems
