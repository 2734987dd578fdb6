"""Active probes, the driver-facing part: sends each probe the scheduler orders.

Besides the probes it sends the server-load reads of :mod:`adaptive_lb.stats.server_load`
(``system_views.thread_pools``, Cassandra 4.0+) the same way, to the host the health refresh
orders, each with ``health.server_load.timeout``; a node whose ``release_version`` is below 4
is never asked. And, rarely, the clients-table reads of :mod:`adaptive_lb.stats.fleet` (how many
clients share the cluster): only the count of their rows is kept.

A probe is ``SELECT release_version FROM system.local``
(:data:`~adaptive_lb.health.probes.PROBE_QUERY`) sent through the user's session -- so with its
authentication, needing no schema of the user's -- to one host only, with the driver's per-request
host targeting (``session.execute_async(..., host=host)``, public API of both drivers), with
``health.probe_timeout`` as its timeout. Its outcome goes to the host's
:class:`~adaptive_lb.stats.probe_record.ProbeRecord` from the driver's callback; request tracking
recognises the probe statement and leaves it out of the user's numbers
(:class:`~adaptive_lb.runtime.tracking.RequestTracker`).

:class:`Prober` is started and stopped by request tracking (``attach`` / ``instrument``,
``Attachment.close``, ``session.shutdown()``). It sends from the health refresh thread
(``execute_async`` does not wait for the answer) and its callbacks run on the driver's
threads: they record and return, and never raise into the driver.

Imports the driver's public API and adaptive-lb's probe layers (probes, probe_record,
server_load, fleet).
"""

from __future__ import annotations

import contextlib
import threading
from functools import partial
from typing import Any

from cassandra import ConsistencyLevel, OperationTimedOut, RequestValidationException
from cassandra.cluster import NoHostAvailable
from cassandra.connection import ConnectionBusy, ConnectionException
from cassandra.pool import NoConnectionsAvailable
from cassandra.query import SimpleStatement

from adaptive_lb.health.probes import PROBE_QUERY, ProbeOrder
from adaptive_lb.stats.fleet import (
    CASSANDRA_CLIENTS_QUERY,
    SCYLLA_CLIENTS_QUERY,
    ClientsOrder,
    FleetEstimate,
    clients_from_rows,
)
from adaptive_lb.stats.probe_record import ANSWERED, FAILED, TIMEOUT, UNSENT, ProbeRecord
from adaptive_lb.stats.server_load import (
    THREAD_POOLS_QUERY,
    LoadOrder,
    ServerLoadRecord,
    parse_pools,
    supports_thread_pools,
)

__all__ = ["OwnStatement", "Prober", "outcome_of_exception"]


class OwnStatement(SimpleStatement):
    """A statement of adaptive-lb's own (a probe, a load or clients read): request tracking
    leaves every request made with one out of the user's numbers (one class check)."""


_NOT_SENT = (NoConnectionsAvailable, ConnectionBusy)


def outcome_of_exception(exc: BaseException) -> str:
    """How a probe that ended with ``exc`` ended (:data:`~adaptive_lb.stats.probe_record.OUTCOMES`):
    no answer in time; refused for the client's own reasons (it answered); not sent (no
    connection to the host: the driver's up / down handling has the say); failed."""
    if isinstance(exc, OperationTimedOut):
        return TIMEOUT
    if isinstance(exc, RequestValidationException):
        return ANSWERED
    if isinstance(exc, NoHostAvailable):
        errors = list(getattr(exc, "errors", {}).values())
        if not errors or all(_unsent(error) for error in errors):
            return UNSENT
    return FAILED


def _unsent(error: Any) -> bool:
    if isinstance(error, _NOT_SENT):
        return True
    # The host's pool is gone or shut down: the request never left.
    message = str(error)
    return type(error) is ConnectionException and ("down" in message or "shutdown" in message)


class Prober:
    """Sends the probes of ``policies`` through ``session`` (see the module docstring)."""

    def __init__(self, session: Any, policies: list[Any]) -> None:
        self._session = session
        self._policies = list(policies)
        self._senders: dict[int, Any] = {}
        self._closed = False
        self._lock = threading.Lock()
        self.statement = OwnStatement(
            PROBE_QUERY, consistency_level=ConsistencyLevel.ONE, is_idempotent=True
        )
        """The one statement every probe sends (tracking skips requests made with it)."""
        self.load_statement = OwnStatement(
            THREAD_POOLS_QUERY, consistency_level=ConsistencyLevel.ONE, is_idempotent=True
        )
        """The one statement every server-load read sends (:mod:`adaptive_lb.stats.server_load`;
        tracking skips it too)."""
        self.clients_statements = {
            query: OwnStatement(query, consistency_level=ConsistencyLevel.ONE, is_idempotent=True)
            for query in (CASSANDRA_CLIENTS_QUERY, SCYLLA_CLIENTS_QUERY)
        }
        """The statements of the clients-table reads (:mod:`adaptive_lb.stats.fleet`), by query."""

    def start(self) -> Prober:
        """Have each policy send its due probes after each health refresh."""
        with self._lock:
            for policy in self._policies:
                send = partial(self._send, policy)
                self._senders[id(policy)] = send
                policy.use_prober(
                    send,
                    read_load=partial(self._read_load, policy),
                    read_clients=partial(self._read_clients, policy),
                )
        return self

    def close(self) -> None:
        """Send no more probes (those on their way end as the driver delivers them).
        Idempotent."""
        with self._lock:
            self._closed = True
            senders, self._senders = self._senders, {}
        for policy in self._policies:
            send = senders.get(id(policy))
            if send is not None:
                policy.use_prober(None, replacing=send)

    def _send(self, policy: Any, order: ProbeOrder) -> None:
        if self._closed or getattr(self._session, "is_shutdown", False):
            return  # (session.shutdown() closes the prober once it has shut the session)
        stats = order.stats
        record = stats.probes
        if not record.begin(policy.now_ns(), order.next_ns, order.reason):
            return
        failures = stats.errors_total + stats.timeouts_total
        try:
            future = self._session.execute_async(
                self.statement, timeout=policy.config.health.probe_timeout, host=order.key
            )
            future.add_callbacks(
                _answered,
                _failed,
                callback_args=(policy, record, failures),
                errback_args=(policy, record),
            )
        except Exception:
            record.end(UNSENT, policy.now_ns())
            policy.record_error("probes", "this probe is not sent")

    def _read_load(self, policy: Any, order: LoadOrder) -> None:
        if self._closed or getattr(self._session, "is_shutdown", False):
            return
        record = order.stats.load
        version = getattr(order.key, "release_version", None)
        if supports_thread_pools(version) is False:
            record.mark_unsupported(f"release_version {version}: no system_views.thread_pools")
            return
        if not record.begin(order.next_ns):
            return
        sent_ns = policy.now_ns()
        try:
            future = self._session.execute_async(
                self.load_statement,
                timeout=policy.config.health.server_load.timeout,
                host=order.key,
            )
            future.add_callbacks(
                _loaded,
                _load_failed,
                callback_args=(policy, record, sent_ns),
                errback_args=(record,),
            )
        except Exception:
            record.fail()
            policy.record_error("server_load", "this load read is not sent")

    def _read_clients(self, policy: Any, order: ClientsOrder) -> None:
        if self._closed or getattr(self._session, "is_shutdown", False):
            return
        estimate = policy.fleet
        try:
            future = self._session.execute_async(
                self.clients_statements[order.query],
                timeout=policy.config.health.server_load.timeout,
                host=order.key,
            )
            future.add_callbacks(
                _clients_counted,
                _clients_failed,
                callback_args=(policy, estimate, order.query),
                errback_args=(estimate, order.query),
            )
        except Exception:
            estimate.fail(order.query, absent=False)
            policy.record_error("server_load", "this clients read is not sent")


def _clients_counted(rows: Any, policy: Any, estimate: FleetEstimate, query: str) -> None:
    try:
        try:
            count = clients_from_rows(rows or ())
        except ValueError:
            estimate.fail(query, absent=True)  # a row factory of the user's we cannot read
            return
        estimate.answer(query, count, policy.now_ns())
    except Exception:  # never into the driver
        policy.record_error("server_load", "this clients count is not kept")


def _clients_failed(exc: BaseException, estimate: FleetEstimate, query: str) -> None:
    # No such table (Cassandra 3.x, ScyllaDB for system_views) or no permission: not
    # asked again; a timeout: asked again at the next interval.
    with contextlib.suppress(Exception):  # never into the driver
        estimate.fail(query, absent=isinstance(exc, RequestValidationException))


def _loaded(rows: Any, policy: Any, record: ServerLoadRecord, sent_ns: int) -> None:
    try:
        now = policy.now_ns()
        try:
            pools = parse_pools(rows or ())
        except ValueError as exc:
            record.fail(absent=str(exc))  # a row factory of the user's we cannot read
            return
        half_life = policy.config.health.server_load.half_life
        record.answer(pools, now, max(0, now - sent_ns) / 1e9, half_life)
    except Exception:  # never into the driver
        policy.record_error("server_load", "this load reading is not counted")


def _load_failed(exc: BaseException, record: ServerLoadRecord) -> None:
    # A node without the table refuses the query (InvalidRequest); a role that may not read
    # it, Unauthorized: both are remembered and the host is not read again until it comes back up.
    absent = isinstance(exc, RequestValidationException)
    with contextlib.suppress(Exception):  # never into the driver
        record.fail(absent=f"{type(exc).__name__}: {exc}"[:200] if absent else None)


def _answered(_rows: Any, policy: Any, record: ProbeRecord, failures: int) -> None:
    try:
        record.end(ANSWERED, policy.now_ns(), failures)
    except Exception:  # never into the driver
        policy.record_error("probes", "this probe's answer is not counted")


def _failed(exc: BaseException, policy: Any, record: ProbeRecord) -> None:
    try:
        record.end(outcome_of_exception(exc), policy.now_ns())
    except Exception:  # never into the driver
        policy.record_error("probes", "this probe's failure is not counted")
