"""Fixtures for integration tests that run the real driver against Simulacron.

* ``simulacron`` (session scope): one Simulacron process for the whole test session, started
  on first use and killed at the end. Tests using it are skipped (with the reason) only when
  ``java`` is missing, or ``mvn`` is missing and the jar is not cached yet.
  ``SIMULACRON_FINE_TIMER=0`` in the environment selects the stock 100 ms timer.
* ``driver_factory``: ``driver_factory(policy, contact_points=None, **kwargs)`` connects a real
  driver ``Cluster`` (protocol v4, short timeouts, 0.5 s constant reconnection, the policy in
  the default ``ExecutionProfile``) and returns ``(cluster, session)``; every cluster it made is
  shut down after the test.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

import pytest

# One definition for every module: a fixture imported into two test modules is two
# fixtures, and the second would start a second cluster on the same addresses.
from tests.integration.cassandra_fixture import cassandra_cluster  # noqa: F401
from tests.integration.simulacron import (
    DEFAULT_CACHE_DIR,
    SIMULACRON_VERSION,
    Simulacron,
    connect_driver,
    ensure_simulacron_jar,
)

if TYPE_CHECKING:
    from cassandra.cluster import Cluster, Session
    from cassandra.policies import LoadBalancingPolicy

DriverFactory = Callable[..., "tuple[Cluster, Session]"]


def _missing_tools() -> str | None:
    """Why Simulacron cannot run here, or ``None`` when it can."""
    if shutil.which("java") is None:
        return "needs `java` (Java 8+) on PATH to run Simulacron"
    jar = DEFAULT_CACHE_DIR / f"simulacron-standalone-{SIMULACRON_VERSION}.jar"
    if shutil.which("mvn") is None and not jar.is_file() and not os.environ.get("SIMULACRON_JAR"):
        return "needs `mvn` on PATH to fetch the Simulacron jar (or set $SIMULACRON_JAR)"
    return None


@pytest.fixture(scope="session")
def simulacron() -> Iterator[Simulacron]:
    """A running Simulacron shared by the whole session (clusters are created by the tests)."""
    reason = _missing_tools()
    if reason:
        pytest.skip(reason)
    jar = ensure_simulacron_jar()
    fine = os.environ.get("SIMULACRON_FINE_TIMER", "1") != "0"
    sim = Simulacron(jar, fine_timer=fine)
    sim.start()
    try:
        yield sim
    finally:
        sim.stop()


@pytest.fixture
def driver_factory(simulacron: Simulacron) -> Iterator[DriverFactory]:
    """Make connected driver clusters; all of them are shut down when the test ends.

    ``contact_points`` defaults to the first dc1 node of the most recently created cluster.
    """
    made: list[Cluster] = []

    def make(
        policy: LoadBalancingPolicy,
        contact_points: list[str] | None = None,
        **kwargs: Any,
    ) -> tuple[Cluster, Session]:
        if contact_points is None:
            contact_points = [next(iter(simulacron.nodes().values()))[0]]
        cluster, session = connect_driver(contact_points, policy, **kwargs)
        made.append(cluster)
        return cluster, session

    try:
        yield make
    finally:
        for cluster in made:
            cluster.shutdown()
