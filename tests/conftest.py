"""Shared fixtures: topologies built from the driver's real objects."""

from __future__ import annotations

import pytest

from adaptive_lb.sim.driver_topology import ClusterModel, build_cluster


@pytest.fixture
def cluster_3dc() -> ClusterModel:
    """3 DCs, each of 3 racks with 2 nodes (18 hosts), NetworkTopologyStrategy RF 3 per DC."""
    model = build_cluster({"dc1": [2, 2, 2], "dc2": [2, 2, 2], "dc3": [2, 2, 2]}, seed=7)
    yield model
    model.shutdown()
