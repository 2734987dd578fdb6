"""Session-scoped pytest fixture for a real 3-node Apache Cassandra 5.0 cluster.

``tests/integration/conftest.py`` imports it, so every integration module shares one
cluster (a module importing it itself would get a fixture, and a cluster, of its own).

* ``cassandra_cluster`` (session scope): a :class:`~tests.integration.cassandra.CassandraCluster`
  of 3 nodes at 127.0.3.1-3 (port 9042 on each), data center ``dc1``, racks r1/r2/r3, one
  fixed evenly spaced token per node; started on first use, SIGKILLed at the end of the
  session. Its ``timings`` hold the seconds spent fetching jars and starting. Tests using it
  are skipped (with the reason) only when ``java`` is missing, or ``mvn`` is missing and the
  jars are not cached yet. ``ADAPTIVE_LB_CASSANDRA_HEAP_MB`` overrides the 384 MB heaps.
"""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest

from tests.integration.cassandra import CassandraCluster, missing_tools

__all__ = ["cassandra_cluster"]


@pytest.fixture(scope="session")
def cassandra_cluster() -> Iterator[CassandraCluster]:
    """A running 3-node Cassandra cluster shared by the whole test session."""
    reason = missing_tools()
    if reason:
        pytest.skip(reason)
    heap = int(os.environ.get("ADAPTIVE_LB_CASSANDRA_HEAP_MB", "384"))
    cluster = CassandraCluster(3, heap_mb=heap)
    cluster.start()
    try:
        yield cluster
    finally:
        cluster.stop()
