"""Every driver internal request tracking relies on: the future hook, the pools' in-flight
counts, the checks of both a session is attached with, and the event loop's timer the
stall rule times the client's reading of answers with.

The drivers have no public hook on each attempt of a request (first try, retry,
speculative execution) nor on the number of requests in flight on a host, so they are read
here and nowhere else. Every other private driver access is in
:mod:`adaptive_lb.plan._driver_policies` (the child policy, the token map, tablets): no
module of adaptive-lb outside these two reads a driver private.
``tests/unit/test_driver_contract.py`` fails loudly if a driver release renames or removes
any of them, on both drivers; :func:`tracking_problems` and :func:`pool_problems` check the
same at attach, on the driver a user has.

May import: the driver and the standard library; nothing of adaptive-lb (the bottom
layer).
"""

from __future__ import annotations

import importlib.metadata
import inspect
import threading
from collections.abc import Callable
from functools import partial
from typing import Any

import cassandra.cluster
from cassandra.cluster import ResponseFuture
from cassandra.pool import HostConnection

__all__ = [
    "FUTURE_POLICY_ATTRIBUTE",
    "driver_release",
    "hook_future",
    "is_tracked",
    "loop_timer",
    "pool_in_flight_reader",
    "pool_problems",
    "session_pools",
    "tracking_problems",
]

_NOT_SET: Any = getattr(cassandra.cluster, "_NOT_SET", None)
"""The driver's "no result yet" sentinel (None: this driver has none; see
:func:`tracking_problems`)."""

FUTURE_POLICY_ATTRIBUTE = "_load_balancer"
"""The private ``ResponseFuture`` attribute holding the load-balancing policy that made its
query plan (its execution profile's policy), on both drivers. Read with ``getattr`` on
every request, so a name rather than a function (one Python call less)."""


_TRACKED_CLASSES: dict[tuple[type, bool], type] = {}
"""(a future's class, every_end) -> the class to switch it to."""
_TRACKED_BASES: dict[type, type] = {}
"""A tracked class -> the class it tracks."""
_tracked_classes_lock = threading.Lock()


def _tracked_class(cls: type[Any], every_end: bool) -> type:
    """A subclass of ``cls`` (``ResponseFuture`` or a user's subclass of it) whose attempt
    methods report to ``self._adaptive_lb_attempts`` around what ``cls`` does (see
    :func:`hook_future`); for a class that is tracked already, the same for the class it
    tracks. Built once per (class, ``every_end``): a hooked future then costs one
    ``__class__`` assignment, not closures (the per-instance alternative costs ~2 us
    more)."""
    base: Any = _TRACKED_BASES.get(cls, cls)
    key = (base, every_end)
    tracked = _TRACKED_CLASSES.get(key)
    if tracked is not None:
        return tracked
    # The base's own functions, looked up once: cheaper per call than super().
    base_query = base._query
    base_set_result = base._set_result
    base_set_final_result = base._set_final_result
    base_set_final_exception = base._set_final_exception

    class TrackedResponseFuture(base):
        __slots__ = ()  # same layout as base, so __class__ can be assigned

        def _query(self: Any, host: Any, message: Any = None, cb: Any = None) -> Any:
            attempts = self._adaptive_lb_attempts
            attempts.sent(host)
            if cb is not None:  # the driver re-prepares: the response goes to cb instead
                callback = cb

                def cb(response: Any) -> Any:
                    attempts.answered(host, response)
                    return callback(response)

            try:
                request_id = base_query(self, host, message, cb)
            except BaseException:
                attempts.not_sent(host)
                raise
            if request_id is None:  # no connection could take it
                attempts.not_sent(host)
            return request_id

        def _set_result(self: Any, host: Any, connection: Any, pool: Any, response: Any) -> Any:
            attempts = self._adaptive_lb_attempts
            attempts.answered(host, response)
            result = base_set_result(self, host, connection, pool, response)
            # Usually empty by now: the winning response released its own attempt. When not
            # (speculative executions still out), the request may have ended in there.
            if attempts and self._final_result is not _NOT_SET:
                attempts.ended(None)
            return result

        def _set_final_exception(self: Any, response: Any, *args: Any, **kwargs: Any) -> Any:
            attempts = self._adaptive_lb_attempts
            if attempts:
                attempts.ended(response)
            return base_set_final_exception(self, response, *args, **kwargs)

    if every_end:

        class EveryEndResponseFuture(TrackedResponseFuture):
            __slots__ = ()

            def _set_final_result(self: Any, response: Any) -> Any:
                attempts = self._adaptive_lb_attempts
                if attempts:
                    attempts.ended(None)
                return base_set_final_result(self, response)

        tracked = EveryEndResponseFuture
        name = f"TrackedEveryEnd{base.__name__}"
    else:
        tracked = TrackedResponseFuture
        name = f"Tracked{base.__name__}"
    tracked.__qualname__ = tracked.__name__ = name  # which flavour, in tracebacks
    with _tracked_classes_lock:
        tracked = _TRACKED_CLASSES.setdefault(key, tracked)
        _TRACKED_BASES[tracked] = base
        _TRACKED_CLASSES[(cls, every_end)] = tracked
        return tracked


def is_tracked(future: Any) -> bool:
    """Whether ``future`` was hooked by :func:`hook_future` (its request is tracked)."""
    return hasattr(future, "_adaptive_lb_attempts")


def hook_future(future: Any, attempts: Any, every_end: bool = False) -> None:
    """Observe every attempt ``future`` makes, on whichever thread makes it.

    The driver sends each attempt (first try, retry, speculative execution) through
    ``ResponseFuture._query(host, message, cb)``, delivers its response to
    ``ResponseFuture._set_result(host, connection, pool, response)`` -- looked up on the
    future when the attempt is sent -- or to the custom ``cb`` it was sent with
    (re-prepare), and ends the request with ``_set_final_result(response)`` or
    ``_set_final_exception(exc, ...)``. None of these is public, so this one future's class
    is switched to a subclass of its own class that reports each call before making it (no
    driver class is modified; other futures are untouched). ``attempts`` receives:

    * ``sent(host)`` just before an attempt is written (so a response racing in on the I/O
      thread always finds it counted), ``not_sent(host)`` if the driver could not send it;
    * ``answered(host, response)`` when its response (a message, or an exception such as
      ``ConnectionShutdown``) arrives, before the driver acts on it;
    * ``ended(exception_or_None)``, while ``attempts`` is truthy (it has attempts
      outstanding), when the request ends: on a client-side timeout or final error, and
      after the response the request ended with.

    A request can also end outside any response: the driver refreshes the schema after a
    DDL statement, or sets the keyspace of every connection after ``USE``, then calls
    ``_set_final_result`` from another thread or callback. Tracking needs no call then (an
    attempt still outstanding is released by its own response, or by the
    ``ConnectionShutdown`` its connection delivers), so only with ``every_end`` is
    ``_set_final_result`` overridden too: it is one call from the driver's compiled code
    into the interpreter per request (~1 us end to end), which only a request span, finished
    by ``ended``, needs.

    Hooking a future a second time replaces its ``attempts`` (and its class, as
    ``every_end`` says).
    """
    future._adaptive_lb_attempts = attempts
    cls = type(future)
    future.__class__ = _TRACKED_CLASSES.get((cls, every_end)) or _tracked_class(cls, every_end)


_HOOKED_METHODS: dict[str, tuple[str, ...]] = {
    "_query": ("host", "message", "cb"),
    "_set_result": ("host", "connection", "pool", "response"),
    "_set_final_result": ("response",),
    "_set_final_exception": ("response",),
}
"""The ``ResponseFuture`` methods :func:`hook_future` overrides, and their leading
parameters (after ``self``) as it calls them."""


def tracking_problems(future_class: type = ResponseFuture) -> list[str]:
    """What request tracking relies on in this driver and does not find, checked when a
    session is instrumented (empty: all there). A driver release that renamed one of them
    would otherwise have its requests hooked wrongly; the caller turns tracking off instead.
    ``tests/unit/test_driver_contract.py`` pins the same and more, at test time."""
    problems = []
    if _NOT_SET is None:
        problems.append("cassandra.cluster._NOT_SET is gone")
    for name, expected in _HOOKED_METHODS.items():
        method = getattr(future_class, name, None)
        if not callable(method):
            problems.append(f"ResponseFuture.{name} is gone")
            continue
        try:
            parameters = tuple(inspect.signature(method).parameters)[1 : 1 + len(expected)]
        except (TypeError, ValueError):  # compiled without a signature: nothing to compare
            continue
        if parameters != expected:
            problems.append(
                f"ResponseFuture.{name} takes {', '.join(parameters) or 'nothing'} "
                f"(expected {', '.join(expected)})"
            )
    return problems


def driver_release() -> str:
    """The distribution and version providing the ``cassandra`` module, for messages."""
    for distribution in ("scylla-driver", "cassandra-driver"):
        try:
            return f"{distribution} {importlib.metadata.version(distribution)}"
        except importlib.metadata.PackageNotFoundError:
            continue
    return f"cassandra module {getattr(cassandra, '__version__', '?')}"


def loop_timer(session: Any) -> Callable[[float, Callable[[], None]], Any] | None:
    """The driver's timer on the thread that reads the session's answers:
    ``cluster.connection_class.create_timer(delay_s, callback)``, what the driver times its
    own request timeouts with, on every reactor (None: this driver has none). How late it
    fires is how late the client reads answers (:mod:`adaptive_lb.stats.lateness`)."""
    connection_class = getattr(getattr(session, "cluster", None), "connection_class", None)
    create = getattr(connection_class, "create_timer", None)
    return create if callable(create) else None


# ---------------------------------------------------------------- in flight, from the pools


def session_pools(session: Any) -> dict[Any, Any]:
    """The session's connection pools, ``Host -> HostConnection``: the driver's own dict,
    live (pools come and go with hosts and reconnections)."""
    pools: dict[Any, Any] = session._pools
    return pools


def _single_in_flight(pools: dict[Any, Any], held: dict[int, Any], host: Any) -> int:
    # cassandra-driver: one connection, a class attribute (None while it is replaced).
    pool = held.get(id(host))
    if pool is None or pool.is_shutdown:
        pool = _look_up_pool(pools, held, host)
        if pool is None:
            return 0
    connection = pool._connection
    return 0 if connection is None else connection.in_flight


def _sharded_in_flight(pools: dict[Any, Any], held: dict[int, Any], host: Any) -> int:
    # scylla-driver: one connection per shard (no _connection attribute: a getattr with a
    # default would raise and catch AttributeError on every read).
    pool = held.get(id(host))
    if pool is None or pool.is_shutdown:
        pool = _look_up_pool(pools, held, host)
        if pool is None:
            return 0
    total = 0
    for connection in pool._connections.values():
        total += connection.in_flight
    return total


def _look_up_pool(pools: dict[Any, Any], held: dict[int, Any], host: Any) -> Any | None:
    # A host not read before, or whose pool the driver has shut down since (renewed or
    # removed). Keyed by id: the pool refers to its host, so the id is not reused while
    # the entry lives. The shut-down pools of hosts no longer read go here too.
    for key, old in list(held.items()):
        if old.is_shutdown:
            held.pop(key, None)
    pool = pools.get(host)
    if pool is not None:
        held[id(host)] = pool
    return pool


def pool_in_flight_reader(session: Any) -> Callable[[Any], int]:
    """``host -> requests in flight`` on ``session``'s pool of that host, as the driver
    counts them.

    Each connection's ``in_flight`` rises when an attempt borrows a stream and falls when
    its response is processed or, for a request the client gave up on, when the server's
    late answer releases the orphaned stream: retries, speculative executions, probes and
    the driver's own requests on the connection (heartbeats, ``USE``) all count. One
    connection per host on cassandra-driver (``_connection``, a class attribute), one per
    shard on scylla-driver (``_connections``), told apart once, here; a replaced connection
    waiting for its last answers (``_trash``) is no longer counted. No pool (a host down,
    ignored or not yet connected): 0.

    Each host's pool is looked up in the session's pools once, then held until the driver
    shuts it down: looking a driver ``Host`` up in a dict hashes it through its endpoint in
    Python (~2,600 instructions, most of a read), and a plan reads a few hosts. The driver
    shuts a pool down when it replaces it (at once) or removes it (from its executor,
    after its host is down or ignored: no longer a candidate of any plan); until then the
    held pool's count is read, where a lookup would find the new pool or none."""
    pools = session_pools(session)
    single = "_connection" in vars(HostConnection)
    held: dict[int, Any] = {}
    return partial(_single_in_flight if single else _sharded_in_flight, pools, held)


def pool_problems(session: Any) -> list[str]:
    """What reading in-flight counts from ``session``'s pools relies on and does not find
    (empty: all there), checked at attach on the pools the session has opened; the
    caller then counts in-flight attempts itself, as before. The contract tests pin the
    same at test time."""
    pools = getattr(session, "_pools", None)
    if not isinstance(pools, dict):
        return ["Session._pools is not a dict of connection pools"]
    problems = []
    for pool in list(pools.values()):
        connection = getattr(pool, "_connection", None)
        connections = getattr(pool, "_connections", None)
        if connection is None and isinstance(connections, dict):
            members = list(connections.values())
        elif connection is not None:
            members = [connection]
        else:
            problems.append(f"{type(pool).__name__} has neither _connection nor _connections")
            continue
        if not isinstance(getattr(pool, "is_shutdown", None), bool):
            problems.append(f"{type(pool).__name__}.is_shutdown is not a bool")
        for member in members:
            if not isinstance(getattr(member, "in_flight", None), int):
                problems.append(f"{type(member).__name__}.in_flight is not an int")
        if problems:
            break
    return problems
