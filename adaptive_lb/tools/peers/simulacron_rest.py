"""Simulacron's REST API: clusters, node faults and the activity log.

:class:`SimulacronRest` talks to a running Simulacron over HTTP (JSON): it creates simulated
clusters (a data center is a list of racks, one per node), turns a scope such as
``("dc1", "node2")`` into a URL path, and injects node faults: stalled reads, refused or
dropped connections. What the nodes *answer* (primes) is added on top of it by
:class:`~adaptive_lb.tools.peers.simulacron_primes.SimulacronClient`; starting the Java process by
:class:`~adaptive_lb.tools.peers.simulacron.Simulacron`.

Imports the standard library only.
"""

from __future__ import annotations

import json
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Mapping, Sequence
from typing import Any

__all__ = ["Scope", "SimulacronError", "SimulacronRest"]

#: Where a prime or a fault applies: ``None`` = the whole cluster, ``"dc1"`` = one data center,
#: ``("dc1", "node2")`` = one node. Data centers and nodes may be given by name or by numeric
#: id (ints are ids: node id 0 is named ``node1``).
Scope = str | int | tuple[str | int, str | int] | None


class SimulacronError(RuntimeError):
    """Simulacron could not be fetched, started, or refused a REST request."""


class SimulacronRest:
    """A REST client for one Simulacron at ``http://{http_host}:{http_port}``.

    Methods that take a ``cluster`` argument default to the cluster most recently created
    through this object.
    """

    def __init__(self, http_host: str = "127.0.0.1", http_port: int | None = None) -> None:
        self.http_host = http_host
        self.http_port = http_port
        #: The last response of ``POST /cluster`` per cluster name.
        self.clusters: dict[str, dict[str, Any]] = {}
        self.default_cluster: str | None = None

    @property
    def base_url(self) -> str:
        """``http://host:port`` of the REST API."""
        return f"http://{self.http_host}:{self.http_port}"

    # -- plumbing -----------------------------------------------------------------------------

    def _request(
        self,
        method: str,
        path: str,
        body: Any = None,
        *,
        query: Mapping[str, str] | None = None,
        timeout: float = 10.0,
    ) -> Any:
        """Send one REST request; return the decoded JSON answer (or ``None`` if empty)."""
        url = self.base_url + path
        if query:
            url += "?" + urllib.parse.urlencode(query)
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(url, data=data, method=method)
        if data is not None:
            req.add_header("Content-Type", "application/json")
        try:
            with urllib.request.urlopen(req, timeout=timeout) as resp:
                raw = resp.read()
        except urllib.error.HTTPError as exc:
            detail = exc.read().decode(errors="replace")
            raise SimulacronError(f"{method} {path} -> HTTP {exc.code}: {detail}") from exc
        if not raw.strip():
            return None
        try:
            return json.loads(raw)
        except ValueError:
            return raw.decode(errors="replace")

    def answers(self) -> bool:
        """True if the REST API answers ``GET /cluster`` within a second."""
        try:
            self._request("GET", "/cluster", timeout=1.0)
        except (OSError, SimulacronError):
            return False
        return True

    def _cluster(self, cluster: str | None) -> str:
        name = cluster or self.default_cluster
        if name is None:
            raise SimulacronError("no cluster: call create_cluster() first or pass cluster=")
        return name

    def _scope_key(self, scope: Scope, cluster: str | None) -> tuple[str, ...]:
        """``()``, ``(dc,)`` or ``(dc, node)`` with ids translated to names when known."""
        if scope is None:
            return ()
        dc, node = scope if isinstance(scope, tuple) else (scope, None)
        info = self.clusters.get(self._cluster(cluster), {})
        dc_name, node_name = str(dc), None if node is None else str(node)
        for d in info.get("data_centers", []):
            if dc in (d["id"], d["name"]):
                dc_name = d["name"]
                for n in d["nodes"]:
                    if node in (n["id"], n["name"]):
                        node_name = n["name"]
        return (dc_name,) if node_name is None else (dc_name, node_name)

    def _scope_path(self, scope: Scope, cluster: str | None) -> str:
        """``/{cluster}[/{dc}[/{node}]]`` with names quoted for the URL."""
        return quote_path(self._cluster(cluster), *self._scope_key(scope, cluster))

    # -- clusters -----------------------------------------------------------------------------

    def create_cluster(
        self,
        name: str,
        datacenters: Sequence[Sequence[str]],
        *,
        dc_names: Sequence[str] | None = None,
        cassandra_version: str | None = None,
        peer_info: Mapping[str, Any] | None = None,
    ) -> dict[str, list[str]]:
        """Create a cluster and bind its nodes; return node addresses (IP strings) per DC name.

        Args:
            name: the cluster name (also the default ``cluster`` of later calls).
            datacenters: one list per DC with one rack name per node, e.g.
                ``[["r1", "r2", "r3"]] * 3`` for 3 DCs of 3 nodes on racks r1..r3.
            dc_names: DC names (default ``dc1``, ``dc2``, ...). Nodes are named ``node1``... in
                each DC, so a node scope is ``("dc1", "node2")``.
            cassandra_version: version the nodes claim (default: Simulacron's, 3.0.x; a 4.x
                version makes protocol negotiation hang - keep the default).
            peer_info: extra ``peer_info`` entries for every node.

        All nodes listen on port 9042 of consecutive addresses starting at ``node_ip``.
        """
        names = list(dc_names) if dc_names is not None else []
        names += [f"dc{i + 1}" for i in range(len(names), len(datacenters))]
        spec: dict[str, Any] = {"id": 0, "name": name, "data_centers": []}
        if cassandra_version:
            spec["cassandra_version"] = cassandra_version
        for d, racks in enumerate(datacenters):
            nodes = []
            for n, rack in enumerate(racks):
                info = {**(peer_info or {}), "rack": rack}
                nodes.append({"id": n, "name": f"node{n + 1}", "peer_info": info})
            spec["data_centers"].append({"id": d, "name": names[d], "nodes": nodes})
        info = self._request("POST", "/cluster", spec)
        self.clusters[name] = info
        self.default_cluster = name
        return self.nodes(name)

    def nodes(self, cluster: str | None = None) -> dict[str, list[str]]:
        """Node IP addresses per DC name, in node order, from the cluster's creation answer."""
        info = self.clusters[self._cluster(cluster)]
        return {
            dc["name"]: [n["address"].rsplit(":", 1)[0] for n in dc["nodes"]]
            for dc in info["data_centers"]
        }

    def scope_of(self, address: str, cluster: str | None = None) -> tuple[str, str]:
        """The ``(dc, node)`` scope of a node given its IP (``"127.0.2.4"`` or with a port)."""
        ip = str(address).rsplit(":", 1)[0] if ":" in str(address) else str(address)
        info = self.clusters[self._cluster(cluster)]
        for dc in info["data_centers"]:
            for node in dc["nodes"]:
                if node["address"].rsplit(":", 1)[0] == ip:
                    return dc["name"], node["name"]
        raise KeyError(f"{address} is not a node of cluster {self._cluster(cluster)}")

    def describe(self, cluster: str | None = None) -> dict[str, Any]:
        """``GET /cluster/{name}``: live cluster state (including ``active_connections``)."""
        return self._request("GET", "/cluster" + self._scope_path(None, cluster))

    def remove_cluster(self, cluster: str | None = None) -> None:
        """Unbind and delete a cluster (its addresses become free again)."""
        name = self._cluster(cluster)
        self._request("DELETE", "/cluster" + quote_path(name))
        self.clusters.pop(name, None)
        if self.default_cluster == name:
            self.default_cluster = next(iter(self.clusters), None)

    # -- faults -------------------------------------------------------------------------------

    def pause_reads(self, dc: str | int, node: str | int, *, cluster: str | None = None) -> None:
        """Stop reading from the node's connections (a GC-pause-like stall; host stays UP)."""
        self._request("PUT", "/pause-reads" + self._scope_path((dc, node), cluster))

    def resume_reads(self, dc: str | int, node: str | int, *, cluster: str | None = None) -> None:
        """Undo :meth:`pause_reads`: queued requests are then answered."""
        self._request("DELETE", "/pause-reads" + self._scope_path((dc, node), cluster))

    def unbind(
        self, dc: str | int, node: str | int, *, stop: bool = False, cluster: str | None = None
    ) -> None:
        """Refuse new connections to the node (``stop=True``: close the listener instead).

        Existing connections stay open: follow with :meth:`drop_connections` to make the driver
        mark the host DOWN (~1 s), or use :meth:`take_down` for both.
        """
        path = "/listener" + self._scope_path((dc, node), cluster)
        self._request("DELETE", path, query={"type": "stop" if stop else "unbind"})

    def drop_connections(
        self, dc: str | int, node: str | int, *, cluster: str | None = None
    ) -> None:
        """Close every client connection of the node."""
        self._request("DELETE", "/connections" + self._scope_path((dc, node), cluster))

    def take_down(self, dc: str | int, node: str | int, *, cluster: str | None = None) -> None:
        """:meth:`unbind` + :meth:`drop_connections`: the node looks dead to the driver."""
        self.unbind(dc, node, cluster=cluster)
        self.drop_connections(dc, node, cluster=cluster)

    def rebind(self, dc: str | int, node: str | int, *, cluster: str | None = None) -> None:
        """Accept connections again (the driver reconnects per its reconnection policy)."""
        self._request("PUT", "/listener" + self._scope_path((dc, node), cluster))

    # -- activity log -------------------------------------------------------------------------

    def activity_log(
        self, scope: Scope = None, *, cluster: str | None = None
    ) -> list[dict[str, Any]]:
        """Requests received in ``scope`` (needs ``activity_logging=True``), oldest first.

        Each entry is Simulacron's record (``query``, ``type`` such as ``QUERY`` / ``EXECUTE`` /
        ``PREPARE`` / ``OPTIONS``, ``consistency_level``, ``connection`` (the client's address),
        ``received_timestamp`` in ms, ``primed``, ``frame``) plus ``dc`` and ``node`` names.
        """
        cname = self._cluster(cluster)
        data = self._request("GET", "/log" + self._scope_path(scope, cname))
        names = {
            dc["id"]: (dc["name"], {n["id"]: n["name"] for n in dc["nodes"]})
            for dc in self.clusters[cname]["data_centers"]
        }
        out: list[dict[str, Any]] = []
        for dc in (data or {}).get("data_centers", []):
            dc_name, node_names = names.get(dc.get("id"), (str(dc.get("id")), {}))
            for node in dc.get("nodes", []):
                node_name = node_names.get(node.get("id"), str(node.get("id")))
                for entry in node.get("queries", []):
                    out.append({**entry, "dc": dc_name, "node": node_name})
        out.sort(key=lambda e: e.get("received_timestamp", 0))
        return out

    def clear_activity_log(self, scope: Scope = None, *, cluster: str | None = None) -> None:
        """Forget the recorded requests of ``scope``."""
        self._request("DELETE", "/log" + self._scope_path(scope, cluster))


def quote_path(*parts: str) -> str:
    """``/a/b/c`` with every part quoted for a URL."""
    return "/" + "/".join(urllib.parse.quote(p, safe="") for p in parts)
