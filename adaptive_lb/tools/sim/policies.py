"""The policies a simulation compares, built per client, with their feedback hooks: the
driver's stock policies, adaptive-lb, and two baseline policies of other drivers
(:mod:`adaptive_lb.tools.sim.baselines`).

========================  ==========================================================
name                      policy objects (one set per simulated client)
========================  ==========================================================
``token-aware``           stock ``TokenAwarePolicy(DCAwareRoundRobinPolicy(dc),
                          shuffle_replicas=True)``
``round-robin``           stock ``DCAwareRoundRobinPolicy(dc)``
``adaptive``              ``AdaptiveLoadBalancingPolicy(TokenAwarePolicy(DCAware...))``
                          with ``policy.local_rack`` = the client's zone, on the
                          simulator's clock; completions go to its ``HostStats``
                          lifecycle methods, health refreshed every
                          ``health.refresh_interval`` of virtual time
``adaptive-unset``        the same, told nothing of the client's zone: the
                          scenario's ``policy.local_rack`` as it is (default
                          ``auto``: each client learns its rack from latency)
``latency-aware``         :class:`~adaptive_lb.tools.sim.baselines.LatencyAwarePolicy`
                          (C++ / Rust drivers) around ``TokenAware(DCAware)``
``slow-replica``          :class:`~adaptive_lb.tools.sim.baselines.SlowReplicaAvoidancePolicy`
                          (Java driver 4) around ``TokenAware(DCAware)``
``p2c``                   :class:`~adaptive_lb.tools.sim.p2c.PeakEwmaP2CPolicy`
                          (Finagle / Linkerd: power of two choices over peak-EWMA
                          cost) around ``TokenAware(DCAware)``
========================  ==========================================================

May import the library's policy, config and clock, the driver's policies and the simulator's
baselines and P2C.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from typing import Any

import attrs
from attrs import define
from cassandra.policies import DCAwareRoundRobinPolicy, TokenAwarePolicy

from adaptive_lb.config import Config
from adaptive_lb.core.clock import Clock
from adaptive_lb.runtime.policy import AdaptiveLoadBalancingPolicy
from adaptive_lb.tools.sim.baselines import LatencyAwarePolicy, SlowReplicaAvoidancePolicy
from adaptive_lb.tools.sim.p2c import PeakEwmaP2CPolicy

__all__ = ["LABELS", "AdaptiveFeedback", "NoFeedback", "PolicyKit", "build_policy"]

LABELS = {
    "token-aware": "TokenAware(DCAware) shuffle",
    "round-robin": "DCAwareRoundRobin",
    "adaptive": "adaptive-lb",
    "adaptive-unset": "adaptive-lb, rack unset",
    "latency-aware": "latency-aware (C++/Rust)",
    "slow-replica": "slow-replica (Java 4)",
    "p2c": "P2C peak-EWMA (Finagle)",
}
"""Short display names for tables and plots."""


class NoFeedback:
    """Stock policies learn nothing from completions."""

    __slots__ = ()

    def sent(self, host: Any) -> None:
        pass

    def success(self, host: Any, latency_ns: int) -> None:
        pass

    def error(self, host: Any, latency_ns: int) -> None:
        pass

    def timeout(self, host: Any, latency_ns: int) -> None:
        pass


class AdaptiveFeedback:
    """Feeds adaptive-lb's per-host :class:`~adaptive_lb.stats.host.HostStats` exactly as the
    driver-side tracking (:mod:`adaptive_lb.runtime.tracking`) does: ``on_send`` per attempt, then
    ``on_success`` / ``on_error(fast=True)`` / ``on_timeout``."""

    __slots__ = ("_registry", "_stats")

    def __init__(self, policy: AdaptiveLoadBalancingPolicy) -> None:
        self._registry = policy.stats
        self._stats: dict[int, Any] = {}
        policy.tracking_attached()

    def _of(self, host: Any) -> Any:
        stats = self._stats.get(id(host))
        if stats is None:
            stats = self._stats[id(host)] = self._registry.get(host)
        return stats

    def sent(self, host: Any) -> None:
        self._of(host).on_send()

    def success(self, host: Any, latency_ns: int) -> None:
        self._of(host).on_success(latency_ns)

    def error(self, host: Any, latency_ns: int) -> None:
        self._of(host).on_error(latency_ns, fast=True)

    def timeout(self, host: Any, latency_ns: int) -> None:
        self._of(host).on_timeout(latency_ns)


@define
class PolicyKit:
    """One client's policy, how it learns, and what must run periodically."""

    name: str
    policy: Any
    feedback: Any
    tick_interval: float | None = None
    """Virtual seconds between calls of ``tick`` (None: nothing periodic)."""
    tick: Callable[[], Any] | None = None


def _token_aware(datacenter: str) -> TokenAwarePolicy:
    return TokenAwarePolicy(DCAwareRoundRobinPolicy(datacenter), shuffle_replicas=True)


def build_policy(
    name: str,
    *,
    datacenter: str,
    zone: str,
    config: Config,
    clock: Clock,
    rng: random.Random,
    tracer_provider: Any = None,
) -> PolicyKit:
    """The policy ``name`` for a client in ``zone`` of ``datacenter`` (adaptive-lb records
    its decisions through ``tracer_provider`` when a span is current)."""
    if name == "token-aware":
        return PolicyKit(name, _token_aware(datacenter), NoFeedback())
    if name == "round-robin":
        return PolicyKit(name, DCAwareRoundRobinPolicy(datacenter), NoFeedback())
    if name in ("adaptive", "adaptive-unset"):
        if name == "adaptive":
            config = attrs.evolve(config, policy=attrs.evolve(config.policy, local_rack=zone))
        policy = AdaptiveLoadBalancingPolicy(
            _token_aware(datacenter), config, clock=clock, tracer_provider=tracer_provider
        )
        return PolicyKit(
            name,
            policy,
            AdaptiveFeedback(policy),
            tick_interval=config.health.refresh_interval,
            tick=policy.refresh_health,
        )
    if name == "latency-aware":
        policy = LatencyAwarePolicy(_token_aware(datacenter), clock)
        return PolicyKit(name, policy, policy, tick_interval=policy.update_rate, tick=policy.tick)
    if name == "slow-replica":
        policy = SlowReplicaAvoidancePolicy(_token_aware(datacenter), clock, rng)
        return PolicyKit(name, policy, policy)
    if name == "p2c":
        policy = PeakEwmaP2CPolicy(_token_aware(datacenter), clock, rng)
        return PolicyKit(name, policy, policy)
    raise ValueError(f"unknown policy {name!r}")
