"""Connect the real driver to a test cluster (Simulacron or the real Cassandra nodes).

The driver is imported when :func:`connect_driver` is called, so importing this module needs
neither cassandra-driver nor scylla-driver.

Imports the standard library only, the driver when called.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from cassandra.cluster import Cluster, Session
    from cassandra.policies import LoadBalancingPolicy

__all__ = ["CQL_PORT", "connect_driver", "wait_for_pools"]

CQL_PORT = 9042
"""The CQL port of every test node (each node has its own loopback address)."""


def connect_driver(
    contact_points: Sequence[str],
    policy: LoadBalancingPolicy,
    *,
    port: int = CQL_PORT,
    request_timeout: float = 5.0,
    connect_timeout: float = 2.0,
    reconnect_delay: float = 0.5,
    keyspace: str | None = None,
    **cluster_kwargs: Any,
) -> tuple[Cluster, Session]:
    """Connect a real driver ``Cluster`` with ``policy`` to a test cluster; return it and a
    session.

    ``protocol_version=4`` (v5 fails against Simulacron), short connect timeouts, a
    ``ConstantReconnectionPolicy(reconnect_delay)`` and a default ``ExecutionProfile`` holding
    ``policy``; ``compression=False`` unless given (scylla-driver negotiates lz4, which
    Simulacron accepts at STARTUP but cannot decode: every later request is lost).
    ``cluster_kwargs`` go to ``Cluster(...)`` unchanged. On Python 3.12+ (no
    asyncore) the libev reactor is used when no ``connection_class`` is given. The caller must
    ``cluster.shutdown()``; if connecting fails, the cluster is shut down here.
    """
    from cassandra.cluster import EXEC_PROFILE_DEFAULT, Cluster, ExecutionProfile
    from cassandra.policies import ConstantReconnectionPolicy

    if sys.version_info >= (3, 12) and "connection_class" not in cluster_kwargs:
        from cassandra.io.libevreactor import LibevConnection

        cluster_kwargs["connection_class"] = LibevConnection
    cluster_kwargs.setdefault("compression", False)
    profile = ExecutionProfile(load_balancing_policy=policy, request_timeout=request_timeout)
    cluster = Cluster(
        contact_points=list(contact_points),
        port=port,
        protocol_version=4,
        execution_profiles={EXEC_PROFILE_DEFAULT: profile},
        reconnection_policy=ConstantReconnectionPolicy(reconnect_delay),
        connect_timeout=connect_timeout,
        control_connection_timeout=connect_timeout,
        **cluster_kwargs,
    )
    try:
        session = cluster.connect(keyspace)
    except BaseException:
        cluster.shutdown()
        raise
    return cluster, session


def wait_for_pools(session: Any, datacenter: str, timeout: float = 20.0) -> bool:
    """Wait until every host of ``datacenter`` is up with an open connection in ``session``'s
    pools; True if they all are within ``timeout`` seconds.

    Until then the driver skips a host (scylla-driver opens its per-shard pools in the
    background after connect, and a pool that failed to connect under load is retried after
    the reconnection delay), so the first host of a plan may not be the one that serves.
    """
    hosts = [h for h in session.cluster.metadata.all_hosts() if h.datacenter == datacenter]
    deadline = time.monotonic() + timeout
    while True:
        state = session.get_pool_state()
        if all(h.is_up and h in state and state[h]["open_count"] > 0 for h in hosts):
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.1)
