"""Request tracking: every attempt counted in flight on the host it was sent to, released
exactly once, its latency and outcome recorded.

``adaptive_lb.instrument(session)`` registers a request-init listener (public driver API)
that hooks each ``ResponseFuture`` created by the session whose plan came from an
:class:`~adaptive_lb.policy.AdaptiveLoadBalancingPolicy`. Each *attempt* -- the first try,
a retry on the same or another host, a speculative execution running beside the others --
is:

* counted in flight on its host just before it is written to the connection;
* released once, by whichever happens first: its response arrives (success, fast error,
  server-side timeout, or the ``ConnectionShutdown`` the driver delivers when the session
  or the connection closes), or the request ends while it is still outstanding (a
  speculative execution won; or the client-side timeout fired: counted as a timeout).

Fast errors (overloaded, unavailable, bootstrapping, server error, broken connection) never
enter the latency histogram, so a node that fails fast never looks fast. Requests refused
for the client's own reasons (syntax, invalid, unauthorized...) count as answered: the host
did its job.
"""

from __future__ import annotations

import contextlib
import logging
import threading
from typing import Any

from cassandra import OperationTimedOut
from cassandra.protocol import (
    ErrorMessage,
    ReadTimeoutErrorMessage,
    ResultMessage,
    WriteTimeoutErrorMessage,
)

from adaptive_lb._driver import future_policy, hook_future
from adaptive_lb.policy import AdaptiveLoadBalancingPolicy

__all__ = ["RequestTracker", "instrument"]

log = logging.getLogger("adaptive_lb.tracking")

# Error responses that say nothing about the host's health: the request itself was wrong.
_CLIENT_ERROR_CODES = frozenset(
    (
        0x000A,  # protocol error
        0x0100,  # bad credentials
        0x2000,  # syntax error
        0x2100,  # unauthorized
        0x2200,  # invalid
        0x2300,  # config error
        0x2400,  # already exists
        0x2500,  # unprepared (the driver re-prepares on the same host)
    )
)


class _Attempts:
    """The outstanding attempts of one ResponseFuture: usually one (kept in three slots,
    no container), more with speculative executions or a retry racing a late response.
    A lock makes release exactly-once across the I/O thread that delivers responses, the
    timer thread that fires timeouts and speculative executions, and the application
    thread."""

    __slots__ = ("_lock", "by_id", "extra", "host", "now_ns", "policy", "sent_ns", "stats")

    def __init__(self, policy: AdaptiveLoadBalancingPolicy) -> None:
        self.policy = policy
        self.by_id = policy._topology.by_id
        self.now_ns = policy._now_ns
        self.host: Any = None
        self.stats: Any = None
        self.sent_ns = 0
        self.extra: dict[int, tuple[Any, Any, int]] | None = None
        self._lock = threading.Lock()

    def sent(self, host: Any) -> Any:
        view = self.by_id.get(id(host))
        stats = view.stats if view is not None else self.policy.stats.get(host)
        stats.on_send()
        now = self.now_ns()
        with self._lock:
            if self.host is None:
                self.host, self.stats, self.sent_ns = host, stats, now
                return None
            if self.host is host:
                # The same host again while its attempt is outstanding (a retry racing a
                # late response): the older attempt is superseded.
                previous = self.stats
                self.stats, self.sent_ns = stats, now
            else:
                if self.extra is None:
                    self.extra = {}
                entry = self.extra.get(id(host))
                previous = entry[1] if entry is not None else None
                self.extra[id(host)] = (host, stats, now)
        if previous is not None:
            previous.on_abandon()
        return None

    def not_sent(self, host: Any, _token: Any) -> None:
        released = self._take(host)
        if released is not None:
            released[0].on_unsent()

    def _take(self, host: Any) -> tuple[Any, int] | None:
        with self._lock:
            if self.host is host:
                taken = (self.stats, self.sent_ns)
                self.host = self.stats = None
                return taken
            if self.extra:
                entry = self.extra.pop(id(host), None)
                if entry is not None:
                    return entry[1], entry[2]
        return None

    def answered(self, host: Any, response: Any) -> None:
        taken = self._take(host)
        if taken is None:
            return  # already released (timed out, superseded), or not sent through _query
        stats, sent_ns = taken
        latency_ns = self.now_ns() - sent_ns
        if type(response) is ResultMessage:
            stats.on_success(latency_ns)
        elif isinstance(response, (ReadTimeoutErrorMessage, WriteTimeoutErrorMessage)):
            stats.on_timeout(latency_ns)
        elif isinstance(response, ErrorMessage):
            if getattr(response, "error_code", None) in _CLIENT_ERROR_CODES:
                stats.on_success(latency_ns)
            else:
                stats.on_error(latency_ns, fast=True)
        elif isinstance(response, ResultMessage):
            stats.on_success(latency_ns)
        else:  # an exception: connection broken, shut down, defunct
            stats.on_error(latency_ns, fast=True)

    def ended(self, exception: BaseException | None) -> None:
        """The request is over: what is still outstanding lost to another attempt, or
        timed out with the request."""
        with self._lock:
            if self.host is None and not self.extra:
                return
            outstanding = []
            if self.host is not None:
                outstanding.append((self.stats, self.sent_ns))
                self.host = self.stats = None
            if self.extra:
                outstanding.extend((entry[1], entry[2]) for entry in self.extra.values())
                self.extra = None
        if isinstance(exception, OperationTimedOut):
            now = self.now_ns()
            for stats, sent_ns in outstanding:
                stats.on_timeout(now - sent_ns)
        else:
            for stats, _ in outstanding:
                stats.on_abandon()


class RequestTracker:
    """Tracks the requests of one driver ``Session`` (see :func:`instrument`).

    Every attempt is released by its own response, by the end of its request, or -- when
    the session shuts down -- by the ``ConnectionShutdown`` the driver delivers to every
    pending request, so no registry of live requests is kept on the hot path.
    """

    def __init__(self, session: Any) -> None:
        self._session = session
        self._closed = False
        self.untracked_requests = 0
        """Requests whose plan did not come from an AdaptiveLoadBalancingPolicy."""
        session.add_request_init_listener(self._on_request)

    def _on_request(self, future: Any) -> None:
        policy = future_policy(future)
        if self._closed or not isinstance(policy, AdaptiveLoadBalancingPolicy):
            self.untracked_requests += 1
            return
        hook_future(future, _Attempts(policy))

    def close(self) -> None:
        """Stop tracking new requests (requests already hooked are still released when
        they complete). :func:`instrument` calls it when the session shuts down."""
        self._closed = True
        with contextlib.suppress(ValueError):
            self._session.remove_request_init_listener(self._on_request)


def _session_policies(session: Any) -> list[AdaptiveLoadBalancingPolicy]:
    """The adaptive policies of the session's cluster (execution profiles and legacy)."""
    cluster = session.cluster
    found = []
    profiles = getattr(cluster.profile_manager, "profiles", {})
    candidates = [profile.load_balancing_policy for profile in profiles.values()]
    candidates.append(getattr(cluster, "load_balancing_policy", None))
    for policy in candidates:
        if isinstance(policy, AdaptiveLoadBalancingPolicy) and policy not in found:
            found.append(policy)
    return found


def instrument(session: Any) -> RequestTracker:
    """Track every request of ``session`` made through an AdaptiveLoadBalancingPolicy
    (in any execution profile). Returns the tracker; ``session.shutdown()`` closes it."""
    tracker = RequestTracker(session)
    for policy in _session_policies(session):
        policy.start_health_refresh()
    shutdown = session.shutdown

    def shutdown_and_release(*args: Any, **kwargs: Any) -> Any:
        try:
            return shutdown(*args, **kwargs)
        finally:
            tracker.close()
            for policy in _session_policies(session):
                policy.stop_health_refresh()

    session.shutdown = shutdown_and_release
    return tracker
