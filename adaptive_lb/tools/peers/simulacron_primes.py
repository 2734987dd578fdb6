"""Priming Simulacron: what its simulated nodes answer (rows, errors, delays, keyspaces).

:class:`SimulacronClient` is the complete REST client: :class:`SimulacronRest` (clusters,
faults, activity log) plus primes. Simulacron has no endpoint that lists primes and cannot
clear one node's primes, so the client keeps a record of every prime it posts and replays
the ones that must survive a clear.

Facts that shape this module (measured, see ``/work/shared/notes/simulacron.md``):

* Priming the same query twice in one scope keeps the FIRST prime: call
  :meth:`SimulacronClient.clear_primes` for that scope before re-priming.
* ``DELETE /prime/{cluster}`` also removes the ``system_schema.keyspaces`` prime; the driver then
  forgets the keyspace on its next schema refresh. :meth:`SimulacronClient.clear_primes`
  re-primes the keyspaces afterwards unless told not to.

Imports the standard library and
:mod:`~adaptive_lb.tools.peers.simulacron_rest` only.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from adaptive_lb.tools.peers.simulacron_rest import Scope, SimulacronRest, quote_path

__all__ = ["ERROR_RESULTS", "SimulacronClient"]

#: Error results accepted by :meth:`SimulacronClient.prime_error`, with the default ``then``
#: fields each needs (any of them can be overridden through keyword arguments).
ERROR_RESULTS: dict[str, dict[str, Any]] = {
    "overloaded": {"message": "simulated overload"},
    "server_error": {"message": "simulated server error"},
    "is_bootstrapping": {"message": "simulated bootstrap"},
    "unavailable": {"consistency_level": "LOCAL_QUORUM", "required": 2, "alive": 1},
    "read_timeout": {
        "consistency_level": "LOCAL_QUORUM",
        "received": 1,
        "block_for": 2,
        "data_present": False,
    },
    "write_timeout": {
        "consistency_level": "LOCAL_QUORUM",
        "received": 1,
        "block_for": 2,
        "write_type": "SIMPLE",
    },
    # Never answers: the request hangs until the client-side timeout; the host stays UP.
    "no_result": {},
    # Closes the connection the request came on (the driver marks the host DOWN).
    "close_connection": {"close_type": "disconnect", "scope": "connection"},
}

_KEYSPACES_QUERY = "SELECT * FROM system_schema.keyspaces"
_KEYSPACES_COLUMNS = {
    "keyspace_name": "ascii",
    "durable_writes": "boolean",
    "replication": "map<ascii,ascii>",
}
_NTS = "org.apache.cassandra.locator.NetworkTopologyStrategy"
_SIMPLE = "org.apache.cassandra.locator.SimpleStrategy"

#: A recorded prime: its scope key (``()``, ``(dc,)`` or ``(dc, node)``) and its JSON body.
Prime = tuple[tuple[str, ...], dict[str, Any]]


class SimulacronClient(SimulacronRest):
    """The REST client of :class:`SimulacronRest` plus priming (see the module docstring)."""

    def __init__(self, http_host: str = "127.0.0.1", http_port: int | None = None) -> None:
        super().__init__(http_host, http_port)
        # Keyspace rows per cluster (see prime_keyspace).
        self._keyspaces: dict[str, dict[str, dict[str, Any]]] = {}
        # Every prime posted, per cluster, in order. Simulacron cannot clear one node's
        # primes (0.12.0 routes DELETE /prime/{c}/{dc}/{node} to the prime handler: HTTP 400),
        # so clear_primes(node) clears the DC and replays the DC's other primes.
        self._primes: dict[str, list[Prime]] = {}

    def remove_cluster(self, cluster: str | None = None) -> None:
        """Unbind and delete a cluster (its addresses become free again) and its primes."""
        name = self._cluster(cluster)
        super().remove_cluster(name)
        self._keyspaces.pop(name, None)
        self._primes.pop(name, None)

    def prime(
        self,
        query: str,
        rows: Sequence[Mapping[str, Any]] | None = None,
        column_types: Mapping[str, str] | None = None,
        *,
        delay_ms: int = 0,
        result: str = "success",
        scope: Scope = None,
        param_types: Mapping[str, str] | None = None,
        params: Mapping[str, Any] | None = None,
        consistency: Sequence[str] | None = None,
        extra: Mapping[str, Any] | None = None,
        cluster: str | None = None,
    ) -> None:
        """Prime ``query`` in ``scope``: matching requests get ``rows`` (or ``result``).

        Args:
            query: the CQL text exactly as the client sends it (prepared statements included:
                with ``param_types`` the driver learns bind markers and partition key).
            rows: result rows as dicts; ``column_types`` maps each column to a CQL type.
            delay_ms: answer after this delay (rounded up to 100 ms with the stock timer).
            result: ``"success"`` or an error result name (see :meth:`prime_error`).
            scope: ``None`` (cluster), ``"dc1"`` or ``("dc1", "node2")``; a node prime wins over
                a cluster prime. Priming the same query again in the same scope keeps the FIRST
                prime: :meth:`clear_primes` that scope first.
            param_types: bind-marker name -> CQL type (``{"k": "int"}``).
            params: only match these bound values (default: any values).
            consistency: only match these consistency levels (e.g. ``["LOCAL_ONE"]``).
            extra: additional ``then`` fields (``ignore_on_prepare``, error fields, ...).
        """
        when: dict[str, Any] = {"query": query}
        if param_types:
            when["param_types"] = dict(param_types)
        if params:
            when["params"] = dict(params)
        if consistency:
            when["consistency_level"] = list(consistency)
        then: dict[str, Any] = {"result": result}
        if result == "success":
            then["rows"] = [dict(r) for r in rows or []]
            then["column_types"] = dict(column_types or {})
        else:
            # Answer PREPARE normally, so statements can still be prepared on a failing node.
            then["ignore_on_prepare"] = True
        if delay_ms:
            then["delay_in_ms"] = int(delay_ms)
        if extra:
            then.update(extra)
        cname = self._cluster(cluster)
        self._post_prime(cname, self._scope_key(scope, cname), {"when": when, "then": then})

    def _post_prime(self, cluster: str, key: tuple[str, ...], body: dict[str, Any]) -> None:
        self._request("POST", "/prime" + quote_path(cluster, *key), body)
        self._primes.setdefault(cluster, []).append((key, body))

    def primes(self, cluster: str | None = None) -> list[Prime]:
        """The primes posted through this object and not cleared: ``(scope key, body)``, in order.

        The scope key is ``()`` (cluster), ``(dc,)`` or ``(dc, node)``. Simulacron has no
        endpoint to list primes; this is the client-side record.
        """
        return list(self._primes.get(self._cluster(cluster), []))

    def prime_error(
        self,
        query: str,
        error: str,
        *,
        scope: Scope = None,
        delay_ms: int = 0,
        param_types: Mapping[str, str] | None = None,
        cluster: str | None = None,
        **fields: Any,
    ) -> None:
        """Prime ``query`` to fail with ``error`` (a key of :data:`ERROR_RESULTS`).

        ``overloaded``, ``server_error``, ``unavailable`` and ``close_connection`` make the
        driver's default retry policy try the next host of the plan; ``read_timeout`` /
        ``write_timeout`` usually reach the caller; ``no_result`` never answers (the request
        hangs until the client timeout while the host stays UP). ``fields`` override the
        defaults, e.g. ``message="busy"`` or ``consistency_level="LOCAL_ONE"``.
        """
        if error not in ERROR_RESULTS:
            raise ValueError(f"unknown error {error!r}; expected one of {sorted(ERROR_RESULTS)}")
        self.prime(
            query,
            result=error,
            scope=scope,
            delay_ms=delay_ms,
            param_types=param_types,
            extra={**ERROR_RESULTS[error], **fields},
            cluster=cluster,
        )

    def clear_primes(
        self, scope: Scope = None, *, keep_schema: bool = True, cluster: str | None = None
    ) -> None:
        """Remove the primes of ``scope`` (``None``: every prime of the cluster).

        * A DC: its primes and its nodes' primes go; cluster primes stay.
        * A node: Simulacron 0.12.0 cannot clear one node (its REST route is miswired), so the
          whole DC is cleared and the DC's other primes (recorded by :meth:`prime`) are posted
          again in their original order.
        * The cluster: everything goes, including the ``system_schema.keyspaces`` prime that
          keeps the driver's keyspace metadata; with ``keep_schema`` (default) the keyspaces of
          :meth:`prime_keyspace` are primed again right away.
        """
        cname = self._cluster(cluster)
        key = self._scope_key(scope, cname)
        recorded = self._primes.get(cname, [])
        if not key:
            self._request("DELETE", "/prime" + self._scope_path(None, cname))
            self._primes[cname] = []
            if keep_schema and self._keyspaces.get(cname):
                self._prime_keyspaces(cname)
            return
        dc = key[0]
        self._request("DELETE", "/prime" + self._scope_path(dc, cname))
        in_dc = [(k, b) for k, b in recorded if k[:1] == (dc,)]
        self._primes[cname] = [(k, b) for k, b in recorded if k[:1] != (dc,)]
        if len(key) == 2:
            for k, body in in_dc:
                if k != key:
                    self._post_prime(cname, k, body)

    def prime_keyspace(
        self,
        name: str,
        replication: Mapping[str, int | str],
        *,
        durable_writes: bool = True,
        strategy: str = "NetworkTopologyStrategy",
        cluster: str | None = None,
    ) -> None:
        """Make ``name`` appear in the driver's schema metadata (so ``get_replicas`` works).

        Primes ``SELECT * FROM system_schema.keyspaces`` with one row per keyspace registered so
        far (a query primed twice keeps its first answer, so adding a second keyspace clears
        all primes of the cluster and posts them again, with the new rows). Prime before the
        driver connects, or call
        ``cluster.refresh_schema_metadata()`` afterwards. Tables are not described: the driver
        knows partition keys only from prepared statements (``param_types``).

        Args:
            replication: ``{"dc1": 2, "dc2": 2}`` for NetworkTopologyStrategy, or
                ``{"replication_factor": 3}`` with ``strategy="SimpleStrategy"``.
            strategy: ``NetworkTopologyStrategy``, ``SimpleStrategy`` or a full class name.
        """
        cname = self._cluster(cluster)
        cls = {"NetworkTopologyStrategy": _NTS, "SimpleStrategy": _SIMPLE}.get(strategy, strategy)
        rep = {"class": cls, **{k: str(v) for k, v in replication.items()}}
        known = self._keyspaces.setdefault(cname, {})
        had_prime = bool(known)
        known[name] = {"keyspace_name": name, "durable_writes": durable_writes, "replication": rep}
        if had_prime:
            # Replace the keyspaces prime: clear everything, replay the rest, prime the new rows.
            others = [(k, b) for k, b in self._primes.get(cname, []) if not _is_keyspaces(b)]
            self._request("DELETE", "/prime" + self._scope_path(None, cname))
            self._primes[cname] = []
            for k, body in others:
                self._post_prime(cname, k, body)
        self._prime_keyspaces(cname)

    def _prime_keyspaces(self, cluster: str) -> None:
        rows = list(self._keyspaces.get(cluster, {}).values())
        self.prime(_KEYSPACES_QUERY, rows=rows, column_types=_KEYSPACES_COLUMNS, cluster=cluster)


def _is_keyspaces(body: Mapping[str, Any]) -> bool:
    return bool(body.get("when", {}).get("query") == _KEYSPACES_QUERY)
