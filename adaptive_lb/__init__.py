"""adaptive-lb: adaptive client-side load balancing for the Cassandra / ScyllaDB drivers.

Wrap the policy you already use::

    from adaptive_lb import AdaptiveLoadBalancingPolicy
    policy = AdaptiveLoadBalancingPolicy(TokenAwarePolicy(DCAwareRoundRobinPolicy("dc1")))
"""

from adaptive_lb.config import Config, ConfigError
from adaptive_lb.policy import AdaptiveLoadBalancingPolicy
from adaptive_lb.tracking import RequestTracker, instrument

__all__ = [
    "AdaptiveLoadBalancingPolicy",
    "Config",
    "ConfigError",
    "RequestTracker",
    "instrument",
]
__version__ = "0.1.0"
