"""Shared fixtures: topologies built from the driver's real objects."""

from __future__ import annotations

import os

import pytest

try:  # the dev extra's; the core install's tests (tests/core) run without it
    from hypothesis import settings
except ImportError:  # pragma: no cover
    settings = None

# The property tests draw new examples every run, in CI too: a verdict that holds only for
# the examples drawn once is no verdict (issue 32). In CI (CI=true) a failure prints the blob
# that reproduces it (@reproduce_failure); locally failing examples stay in .hypothesis/.
if settings is not None:
    settings.register_profile("ci", print_blob=True)
    if os.environ.get("CI", "").lower() in ("1", "true", "yes"):
        settings.load_profile("ci")

from adaptive_lb.tools.sim.driver_topology import ClusterModel, build_cluster


@pytest.fixture
def cluster_3dc() -> ClusterModel:
    """3 DCs, each of 3 racks with 2 nodes (18 hosts), NetworkTopologyStrategy RF 3 per DC."""
    model = build_cluster({"dc1": [2, 2, 2], "dc2": [2, 2, 2], "dc3": [2, 2, 2]}, seed=7)
    yield model
    model.shutdown()
