"""Every driver internal the policy's plan relies on: the child policy behind the stock
wrappers, the token map's replica maps and token function, scylla-driver's tablet map, and
whether the ``Cluster`` a policy was populated with is still open.

The drivers' public API does not expose a wrapper policy's child, nor scylla-driver's tablet
map. Both are needed (to do TokenAwarePolicy's replica work once instead of twice, and to
route tablet tables), so they are read here and nowhere else (request tracking's driver
internals are in :mod:`adaptive_lb.runtime._driver`). ``tests/unit/test_driver_contract.py`` fails
loudly if a driver release renames or removes any of them, on both drivers.

May import: the driver and attrs; nothing of adaptive-lb (the bottom layer).
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
    RackAwareRoundRobinPolicy = None

__all__ = [
    "LOCAL_DISTANCES",
    "ChildChain",
    "analyse_child",
    "child_of",
    "cluster_is_open",
    "keyspace_replica_map",
    "tablets_of",
    "token_value_function",
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
