"""adaptive-lb: adaptive client-side load balancing for the Cassandra / ScyllaDB drivers.

Wrap the policy you already use::

    from adaptive_lb import AdaptiveLoadBalancingPolicy
    policy = AdaptiveLoadBalancingPolicy(TokenAwarePolicy(DCAwareRoundRobinPolicy("dc1")))

The names that need the driver are imported on first use, so that the driver-free modules
(:mod:`adaptive_lb.stats`, :mod:`adaptive_lb.health`, the plan's score) import no driver
module.

May import: the config at once, the policy, request tracking and attachment on first use;
never a tool.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from adaptive_lb.config import Config, ConfigError

if TYPE_CHECKING:
    from adaptive_lb.runtime.attachment import Attachment, attach
    from adaptive_lb.runtime.policy import AdaptiveLoadBalancingPolicy
    from adaptive_lb.runtime.tracking import RequestTracker, instrument

__all__ = [
    "AdaptiveLoadBalancingPolicy",
    "Attachment",
    "Config",
    "ConfigError",
    "RequestTracker",
    "attach",
    "instrument",
]
__version__ = "0.1.0"

_LAZY = {
    "AdaptiveLoadBalancingPolicy": "adaptive_lb.runtime.policy",
    "Attachment": "adaptive_lb.runtime.attachment",
    "attach": "adaptive_lb.runtime.attachment",
    "RequestTracker": "adaptive_lb.runtime.tracking",
    "instrument": "adaptive_lb.runtime.tracking",
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'adaptive_lb' has no attribute {name!r}")
    import importlib

    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value
