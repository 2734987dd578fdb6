"""Every place adaptive-lb relies on the driver's internals, in one module.

The drivers' public API does not expose a wrapper policy's child, nor scylla-driver's tablet
map. Both are needed (to do TokenAwarePolicy's replica work once instead of twice, and to
route tablet tables), so they are read here and nowhere else. ``tests/unit/test_driver_contract.py``
fails loudly if a driver release renames or removes any of them, on both drivers.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from attrs import define
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

try:  # scylla-driver only
    from cassandra.policies import RackAwareRoundRobinPolicy
except ImportError:  # cassandra-driver
    RackAwareRoundRobinPolicy = None  # type: ignore[assignment,misc]

__all__ = [
    "LOCAL_DISTANCES",
    "ChildChain",
    "analyse_child",
    "child_of",
    "tablets_of",
]

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


def future_policy(future: Any) -> Any:
    """The load-balancing policy that made ``future``'s query plan (its execution
    profile's policy; private ``ResponseFuture._load_balancer`` on both drivers)."""
    return getattr(future, "_load_balancer", None)


def hook_future(future: Any, attempts: Any) -> None:
    """Observe every attempt ``future`` makes, on whichever thread makes it.

    The driver sends each attempt (first try, retry, speculative execution) through
    ``ResponseFuture._query(host, message, cb)``, delivers its response to
    ``ResponseFuture._set_result(host, connection, pool, response)`` -- bound when the
    attempt is sent, so an instance attribute set here is the one called -- or to the
    custom ``cb`` it was sent with (re-prepare), and ends the request with
    ``_set_final_result(response)`` or ``_set_final_exception(exc, ...)``. None of these is
    public, so they are wrapped on this one future instance only (no driver class is
    modified). ``attempts`` receives:

    * ``sent(host) -> token`` just before an attempt is written (so a response racing in
      on the I/O thread always finds it counted), ``not_sent(host, token)`` if the driver
      could not send it;
    * ``answered(host, response)`` when its response (a message, or an exception such as
      ``ConnectionShutdown``) arrives, before the driver acts on it;
    * ``ended(exception_or_None)`` when the request ends (after the winning response, or
      on a client-side timeout / final error).
    """
    query = future._query
    set_result = future._set_result
    set_final_result = future._set_final_result
    set_final_exception = future._set_final_exception
    sent = attempts.sent
    answered = attempts.answered
    ended = attempts.ended

    def tracked_query(host: Any, message: Any = None, cb: Any = None) -> Any:
        token = sent(host)
        if cb is not None:
            callback = cb

            def cb(response: Any) -> Any:
                answered(host, response)
                return callback(response)

        try:
            request_id = query(host, message, cb)
        except BaseException:
            attempts.not_sent(host, token)
            raise
        if request_id is None:
            attempts.not_sent(host, token)
        return request_id

    def tracked_set_result(host: Any, connection: Any, pool: Any, response: Any) -> Any:
        answered(host, response)
        return set_result(host, connection, pool, response)

    def tracked_final_result(response: Any) -> Any:
        ended(None)
        return set_final_result(response)

    def tracked_final_exception(response: Any, *args: Any, **kwargs: Any) -> Any:
        ended(response)
        return set_final_exception(response, *args, **kwargs)

    future._query = tracked_query
    future._set_result = tracked_set_result
    future._set_final_result = tracked_final_result
    future._set_final_exception = tracked_final_exception
