"""The driver's view of a made-up cluster: real driver objects, no server behind them.

The simulator, the benchmarks and the tests all need the same thing: a real
``cassandra.cluster.Cluster`` (never connected) whose real ``Metadata`` holds real ``Host``
objects (marked up, with datacenter, rack, host_id and ``broadcast_rpc_address``), a real
Murmur3 ``TokenMap`` built by ``Metadata.rebuild_token_map`` from vnode tokens, and
``KeyspaceMetadata`` with NetworkTopologyStrategy, so that ``metadata.get_replicas`` answers
exactly as it would against a live cluster. :func:`build_topology` makes one, a
:class:`DriverTopology`.

Named for what it is: a topology as the *driver* sees it, which policies ``populate`` from.
It serves nothing; the simulated servers behind the hosts are
:class:`~adaptive_lb.tools.sim.servers.SimulatedServers`. Old names, kept as aliases because many
tests use them: ``ClusterModel`` (:class:`DriverTopology`) and ``build_cluster``
(:func:`build_topology`).

Imports attrs and the driver's public API; nothing of adaptive-lb.
"""

from __future__ import annotations

import random
import uuid
from collections.abc import Mapping, Sequence
from typing import Any, cast

from attrs import define, field
from cassandra.cluster import Cluster
from cassandra.connection import DefaultEndPoint
from cassandra.metadata import KeyspaceMetadata, Metadata
from cassandra.policies import SimpleConvictionPolicy
from cassandra.pool import Host

__all__ = [
    "ClusterModel",
    "DriverTopology",
    "build_cluster",
    "build_topology",
    "murmur3_routing_keys",
]

MURMUR3 = "org.apache.cassandra.dht.Murmur3Partitioner"
_MIN_TOKEN = -(2**63)
_MAX_TOKEN = 2**63 - 1


@define(slots=True)
class DriverTopology:
    """A never-connected driver ``Cluster`` whose metadata describes a made-up topology."""

    cluster: Any
    """A real never-connected ``Cluster`` (or a metadata holder, see ``real_cluster``)."""
    hosts: list[Host]
    hosts_by_dc: dict[str, list[Host]]
    keyspaces: dict[str, dict[str, int]] = field(factory=dict)
    tokens: dict[Host, list[str]] = field(factory=dict)

    @property
    def metadata(self) -> Any:
        """The driver's ``Metadata``."""
        return self.cluster.metadata

    def add_keyspace(self, name: str, replication: Mapping[str, int]) -> None:
        """Define a NetworkTopologyStrategy keyspace and rebuild the token map."""
        self.keyspaces[name] = dict(replication)
        options = {dc: str(rf) for dc, rf in replication.items()}
        self.metadata.keyspaces[name] = KeyspaceMetadata(
            name, True, "NetworkTopologyStrategy", options
        )
        self.rebuild_token_map()

    def rebuild_token_map(self) -> None:
        """Publish a new ``TokenMap`` object (as the driver does after a topology refresh)."""
        self.metadata.rebuild_token_map(MURMUR3, dict(self.tokens))

    def new_host(
        self, datacenter: str, rack: str, address: str, vnodes: int, rng: random.Random
    ) -> Host:
        """Create a host (marked up, with tokens) and add it to the metadata; the caller
        tells the policy (``on_add``) and rebuilds the token map if it wants to."""
        host = _make_host(address, datacenter, rack, rng)
        self.metadata.add_or_return_host(host)
        self.hosts.append(host)
        self.hosts_by_dc.setdefault(datacenter, []).append(host)
        self.tokens[host] = [str(rng.randint(_MIN_TOKEN, _MAX_TOKEN)) for _ in range(vnodes)]
        return host

    def remove_host(self, host: Host) -> None:
        """Remove ``host`` from the metadata and the ring (the caller rebuilds the token map)."""
        self.metadata.remove_host(host)
        self.hosts.remove(host)
        self.hosts_by_dc[host.datacenter].remove(host)
        self.tokens.pop(host, None)

    def shutdown(self) -> None:
        """Release the driver's executor threads."""
        self.cluster.shutdown()


class _MetadataOnly:
    """Stands in for a ``Cluster`` where only ``.metadata`` is read (policy ``populate``)."""

    def __init__(self, metadata: Metadata) -> None:
        self.metadata = metadata
        self.is_shutdown = False

    def shutdown(self) -> None:
        """Nothing to release (marks it shut down, as a ``Cluster`` would be)."""
        self.is_shutdown = True


def _make_host(address: str, datacenter: str, rack: str, rng: random.Random) -> Host:
    host = Host(
        DefaultEndPoint(address, 9042),
        SimpleConvictionPolicy,
        datacenter=datacenter,
        rack=rack,
        host_id=uuid.UUID(int=rng.getrandbits(128), version=4),
    )
    host.broadcast_rpc_address = address
    host.broadcast_rpc_port = 9042
    host.set_up()
    return host


def build_topology(
    datacenters: Mapping[str, Sequence[int]] | Mapping[str, int],
    *,
    vnodes: int = 16,
    replication: Mapping[str, int] | None = None,
    keyspace: str = "ks",
    seed: int = 0,
    real_cluster: bool = True,
) -> DriverTopology:
    """Build a topology: ``datacenters`` maps each DC name to its nodes per rack
    (``{"dc1": [3, 3, 3]}``: racks ``r1..r3`` of 3 nodes) or to a node count (one rack).

    Hosts get addresses ``127.<dc index + 1>.<node // 250>.<node % 250 + 1>``, ``vnodes``
    random Murmur3 tokens each (from ``seed``), and the keyspace ``keyspace`` uses
    NetworkTopologyStrategy with ``replication`` (default RF 3 per DC, capped at its size).

    ``real_cluster=False`` skips the ``Cluster`` object (~0.2 s to create) and holds a real
    ``Metadata`` in a minimal stand-in: for property tests that build hundreds of topologies.
    """
    rng = random.Random(seed)
    cluster: Any
    if real_cluster:
        cluster = Cluster(contact_points=["127.0.0.1"], protocol_version=4)
    else:
        cluster = _MetadataOnly(Metadata())
    topology = DriverTopology(cluster=cluster, hosts=[], hosts_by_dc={})
    for dc_index, (dc, layout) in enumerate(datacenters.items()):
        racks = [layout] if isinstance(layout, int) else list(cast("Sequence[int]", layout))
        node = 0
        for rack_index, count in enumerate(racks):
            for _ in range(count):
                address = f"127.{dc_index + 1}.{node // 250}.{node % 250 + 1}"
                topology.new_host(dc, f"r{rack_index + 1}", address, vnodes, rng)
                node += 1
    if replication is None:
        replication = {dc: min(3, len(hosts)) for dc, hosts in topology.hosts_by_dc.items()}
    topology.add_keyspace(keyspace, replication)
    return topology


ClusterModel = DriverTopology
"""Old name of :class:`DriverTopology` (kept: tests annotate fixtures with it)."""

build_cluster = build_topology
"""Old name of :func:`build_topology` (kept: about forty tests call it)."""


def murmur3_routing_keys(count: int, seed: int = 0) -> list[bytes]:
    """``count`` distinct routing keys (serialized bigints, as a single-column partition key
    of type ``bigint`` is routed)."""
    rng = random.Random(seed)
    keys: set[bytes] = set()
    while len(keys) < count:
        keys.add(rng.getrandbits(63).to_bytes(8, "big"))
    return sorted(keys)
