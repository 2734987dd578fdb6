"""Request tracking: every attempt counted in flight on the host it was sent to, released
exactly once, its latency and outcome recorded.

``adaptive_lb.instrument(session)`` registers a request-init listener (public driver API)
that hooks each ``ResponseFuture`` created by the session whose plan came from an
:class:`~adaptive_lb.policy.AdaptiveLoadBalancingPolicy`. Each *attempt* -- the first try,
a retry on the same or another host, a speculative execution running beside the others --
is:

* counted in flight on its host just before it is written to the connection;
* released once, by whichever happens first: its response arrives (success, fast error,
  server-side timeout), the request ends while it is still outstanding (a speculative
  execution won, or the client-side timeout fired: counted as a timeout), or
  :meth:`RequestTracker.close` (session shutdown).

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
    """The outstanding attempts of one ResponseFuture (usually one, more with speculative
    executions). A lock makes release exactly-once across the I/O thread that delivers
    responses, the timer thread that fires timeouts and speculative executions, and the
    application thread."""

    __slots__ = ("__weakref__", "_lock", "outstanding", "policy", "tracker")

    def __init__(self, tracker: RequestTracker, policy: AdaptiveLoadBalancingPolicy) -> None:
        self.tracker = tracker
        self.policy = policy
        self.outstanding: dict[int, tuple[Any, Any, int]] = {}
        self._lock = threading.Lock()

    def on_send(self, host: Any) -> Any:
        policy = self.policy
        view = policy.topology.view_of(host)
        stats = view.stats if view is not None else policy.stats.get(host)
        stats.on_send()
        attempt = (host, stats, policy.clock.now_ns())
        with self._lock:
            previous = self.outstanding.get(id(host))
            self.outstanding[id(host)] = attempt
        if previous is not None:
            previous[1].on_abandon()
        if len(self.outstanding) == 1:
            self.tracker._register(self)
        return attempt

    def on_not_sent(self, host: Any, attempt: Any) -> None:
        with self._lock:
            if self.outstanding.get(id(host)) is not attempt:
                return
            del self.outstanding[id(host)]
        attempt[1].on_abandon()
        self._maybe_unregister()

    def on_response(self, host: Any, response: Any) -> None:
        with self._lock:
            attempt = self.outstanding.pop(id(host), None)
        if attempt is None:
            return  # already released (timed out, superseded), or not sent through _query
        stats = attempt[1]
        latency_ns = self.policy.clock.now_ns() - attempt[2]
        if isinstance(response, ResultMessage):
            stats.on_success(latency_ns)
        elif isinstance(response, (ReadTimeoutErrorMessage, WriteTimeoutErrorMessage)):
            stats.on_timeout(latency_ns)
        elif isinstance(response, ErrorMessage):
            if getattr(response, "error_code", None) in _CLIENT_ERROR_CODES:
                stats.on_success(latency_ns)
            else:
                stats.on_error(latency_ns, fast=True)
        else:  # an exception: connection broken, shut down, defunct
            stats.on_error(latency_ns, fast=True)
        self._maybe_unregister()

    def on_final(self, _result: Any = None) -> None:
        # Whatever is still outstanding lost to another attempt.
        self._release_all(timed_out=False)

    def on_final_error(self, exc: BaseException) -> None:
        self._release_all(timed_out=isinstance(exc, OperationTimedOut))

    def _release_all(self, timed_out: bool) -> None:
        with self._lock:
            attempts = list(self.outstanding.values())
            self.outstanding.clear()
        if attempts:
            now = self.policy.clock.now_ns()
            for _host, stats, sent_ns in attempts:
                if timed_out:
                    stats.on_timeout(now - sent_ns)
                else:
                    stats.on_abandon()
        self.tracker._unregister(self)

    def _maybe_unregister(self) -> None:
        if not self.outstanding:
            self.tracker._unregister(self)


class RequestTracker:
    """Tracks the requests of one driver ``Session`` (see :func:`instrument`)."""

    def __init__(self, session: Any) -> None:
        self._session = session
        self._live: dict[int, _Attempts] = {}
        self._live_lock = threading.Lock()
        self._closed = False
        self.untracked_requests = 0
        """Requests whose plan did not come from an AdaptiveLoadBalancingPolicy."""
        session.add_request_init_listener(self._on_request)

    def _on_request(self, future: Any) -> None:
        policy = future_policy(future)
        if not isinstance(policy, AdaptiveLoadBalancingPolicy) or self._closed:
            self.untracked_requests += 1
            return
        attempts = _Attempts(self, policy)
        hook_future(future, attempts.on_send, attempts.on_not_sent, attempts.on_response)
        future.add_callbacks(attempts.on_final, attempts.on_final_error)

    def _register(self, attempts: _Attempts) -> None:
        with self._live_lock:
            self._live[id(attempts)] = attempts

    def _unregister(self, attempts: _Attempts) -> None:
        with self._live_lock:
            self._live.pop(id(attempts), None)

    @property
    def outstanding_requests(self) -> int:
        """Requests with at least one attempt in flight."""
        return len(self._live)

    def close(self) -> None:
        """Stop tracking new requests and release every attempt still in flight (call it
        when the session shuts down; :func:`instrument` arranges that)."""
        self._closed = True
        with contextlib.suppress(ValueError):
            self._session.remove_request_init_listener(self._on_request)
        with self._live_lock:
            live = list(self._live.values())
            self._live.clear()
        for attempts in live:
            attempts._release_all(timed_out=False)


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
