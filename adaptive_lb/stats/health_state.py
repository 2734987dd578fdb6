"""The health states a host can be in (shared by stats and health, no dependencies).

Imports the standard library only.
"""

from __future__ import annotations

import enum

__all__ = ["HealthState"]


class HealthState(enum.Enum):
    """Health of a host, as judged from its statistics window."""

    HEALTHY = "healthy"
    SLOW = "slow"
    """Its latency percentile is an outlier among its datacenter peers."""
    ERRORING = "erroring"
    """Its error + timeout rate is above the threshold."""
    WARMING = "warming"
    """It came back (up again, or recovered): its penalty decays to 1 over ``slow_start``."""
