"""Request tracking: the attempts of the tracked requests counted, timed and released
exactly once, their outcomes recorded; the plans' in-flight counts taken from the driver.

``adaptive_lb.instrument(session)`` registers a request-init listener (public driver API)
that sees each ``ResponseFuture`` created by the session whose plan came from an
:class:`~adaptive_lb.policy.AdaptiveLoadBalancingPolicy`, and gives that policy the
session's pools to read each host's in-flight count from (the driver's own count: every
request, tracked or not). It *tracks* every request while the policy's traffic is thin and
one in k above ``tracking.samples_per_host`` per local host per second
(:mod:`adaptive_lb.sampling`), and every request whose context records a span. Each
*attempt* of a tracked request -- the first try, a retry on the same or another host, a
speculative execution running beside the others -- is:

* counted on its host just before it is written to the connection;
* released once, by whichever happens first: its response arrives (success, fast error,
  server-side timeout, or the ``ConnectionShutdown`` the driver delivers when the session
  or the connection closes), or the request ends while it is still outstanding (a
  speculative execution won; or the client-side timeout fired: counted as a timeout).

Fast errors (overloaded, unavailable, bootstrapping, server error, broken connection) never
enter the latency histogram, so a node that fails fast never looks fast. Requests refused
for the client's own reasons (syntax, invalid, unauthorized...) count as answered: the host
did its job. Where the driver's pools are not what this release reads, every request is
tracked and in-flight is counted here instead.

May import: the policy it serves (its row), the prober, the statistics, decision tracing,
the driver and its internals (:mod:`adaptive_lb._driver`); never a tool.
"""

from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import Callable
from random import random
from typing import Any

from cassandra import OperationTimedOut
from cassandra.protocol import (
    ErrorMessage,
    ReadTimeoutErrorMessage,
    ResultMessage,
    WriteTimeoutErrorMessage,
)

from adaptive_lb._driver import (
    FUTURE_POLICY_ATTRIBUTE,
    driver_release,
    hook_future,
    pool_in_flight_reader,
    pool_problems,
    tracking_problems,
)
from adaptive_lb.policy import AdaptiveLoadBalancingPolicy
from adaptive_lb.prober import Prober
from adaptive_lb.stats import HostStats
from adaptive_lb.tracing import current_recording_span

__all__ = [
    "CLIENT_ERROR",
    "CONNECTION_ERROR",
    "ERROR",
    "SERVER_TIMEOUT",
    "SUCCESS",
    "RequestTracker",
    "close_on_shutdown",
    "instrument",
    "outcome_of",
    "session_policies",
]

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


SUCCESS = "success"
"""An attempt's outcome: a result."""
SERVER_TIMEOUT = "server_timeout"
"""The coordinator answered with a read or write timeout."""
CLIENT_ERROR = "client_error"
"""The request was refused for the client's own reasons (syntax, invalid, unauthorized...):
the host did its job, so it counts as answered."""
ERROR = "error"
"""Any other error answer (overloaded, unavailable, bootstrapping, server error...)."""
CONNECTION_ERROR = "connection_error"
"""No answer: the connection broke, closed or went defunct."""


def outcome_of(response: Any) -> str:
    """The outcome of an attempt from what the driver delivered for it: a protocol message,
    or an exception for a broken connection. One of the constants above; tracking and the
    request spans (:mod:`adaptive_lb.request_spans`) both classify with it."""
    if isinstance(response, ResultMessage):
        return SUCCESS
    if isinstance(response, (ReadTimeoutErrorMessage, WriteTimeoutErrorMessage)):
        return SERVER_TIMEOUT
    if isinstance(response, ErrorMessage):
        if getattr(response, "error_code", None) in _CLIENT_ERROR_CODES:
            return CLIENT_ERROR
        return ERROR
    return CONNECTION_ERROR


class _Attempts(dict[int, tuple[HostStats, int]]):
    """The outstanding attempts of one ResponseFuture: ``id(host) -> (its HostStats, send
    time in ns)``. Usually one, more with speculative executions or a retry racing a late
    response.

    Release is exactly-once across the I/O thread that delivers responses, the timer thread
    that fires timeouts and speculative executions, and the application thread, without a
    lock: an attempt is released only by whoever *pops* it, and ``dict.pop`` /
    ``dict.popitem`` are atomic (under the GIL, and per object under free-threaded CPython).
    A dict subclass rather than an object holding a dict: one fewer allocation and no Python
    ``__init__`` per request."""

    __slots__ = ("policy",)

    policy: AdaptiveLoadBalancingPolicy

    @classmethod
    def of(cls, policy: AdaptiveLoadBalancingPolicy) -> _Attempts:
        """No attempt yet, for a request planned by ``policy``."""
        attempts = cls()
        attempts.policy = policy
        return attempts

    def sent(self, host: Any) -> None:
        """An attempt is about to be written to ``host``."""
        policy = self.policy
        stats = policy.attempt_stats(host)
        if stats is None:
            return  # a host the policy has forgotten: counted there, never tracked
        stats.on_send()
        key = id(host)
        # The same host again while its attempt is outstanding (a retry racing a late
        # response): the older attempt is superseded.
        previous = self.pop(key, None)
        self[key] = (stats, policy.now_ns())
        if previous is not None:
            previous[0].on_abandon()

    def not_sent(self, host: Any) -> None:
        """The attempt counted by :meth:`sent` was never written."""
        taken = self.pop(id(host), None)
        if taken is not None:
            taken[0].on_unsent()

    def answered(self, host: Any, response: Any) -> None:
        """``host`` answered (a message, or an exception for a broken connection)."""
        taken = self.pop(id(host), None)
        if taken is None:
            return  # already released (timed out, superseded), or not sent through _query
        stats, sent_ns = taken
        latency_ns = self.policy.now_ns() - sent_ns
        if type(response) is ResultMessage:  # the common case, without a call
            stats.on_success(latency_ns)
            return
        outcome = outcome_of(response)
        if outcome is SERVER_TIMEOUT:
            stats.on_timeout(latency_ns)
        elif outcome is SUCCESS or outcome is CLIENT_ERROR:
            stats.on_success(latency_ns)
        else:
            stats.on_error(latency_ns, fast=True)

    def ended(self, exception: BaseException | None) -> None:
        """The request is over: what is still outstanding lost to another attempt, or
        timed out with the request."""
        if not self:
            return
        timed_out = isinstance(exception, OperationTimedOut)
        now = self.policy.now_ns()
        while True:
            try:
                _, (stats, sent_ns) = self.popitem()
            except KeyError:
                return
            if timed_out:
                stats.on_timeout(now - sent_ns)
            else:
                stats.on_abandon()


class RequestTracker:
    """Tracks the requests of one driver ``Session`` (see :func:`instrument`).

    Every attempt is released by its own response, by the end of its request, or -- when
    the session shuts down -- by the ``ConnectionShutdown`` the driver delivers to every
    pending request, so no registry of live requests is kept on the hot path. While it is
    open, the session's adaptive policies know that tracking reaches them
    (``policy.request_tracking``) and refresh their health on a thread.
    """

    def __init__(self, session: Any) -> None:
        self._session = session
        self._closed = False
        self._close_lock = threading.Lock()
        self.untracked_requests = 0
        """Requests whose plan did not come from an AdaptiveLoadBalancingPolicy."""
        self.telemetry: Any | None = None
        """Request spans and the operation-duration histogram
        (:class:`adaptive_lb.request_spans.RequestTelemetry`), set by
        :func:`adaptive_lb.attach` when tracing or OpenTelemetry metrics are on; its
        ``observe(future, policy)`` returns the attempts object of a request it records,
        or None."""
        self.policies = session_policies(session)
        """The session's adaptive policies (execution profiles and legacy)."""
        self.prober = Prober(session, self.policies)
        """Sends the policies' active probes (:mod:`adaptive_lb.prober`)."""
        self._probe_query = self.prober.statement
        self.pool_problems: list[str] = []
        """What this driver lacks for reading in-flight counts from the session's pools;
        not empty: every request is tracked and its attempts counted in flight here."""
        self._in_flight_source: Callable[[Any], int] | None = None
        self._sourced: frozenset[AdaptiveLoadBalancingPolicy] = frozenset()
        """The policies whose in-flight counts come from this session's pools."""
        self.sampling = False
        """Only a sample of requests is tracked (:mod:`adaptive_lb.sampling`) once traffic
        is thick: the plans read in-flight counts from the driver's pools."""
        self._load_query = self.prober.load_statement
        self.problems = tracking_problems()
        """What this driver lacks that tracking hooks; not empty: no request is tracked
        (nor touched, nor probed), and the policies plan as if every host were idle."""
        if self.problems:
            self._closed = True
            _warn_unknown_driver(self.problems)
            return
        self.pool_problems = pool_problems(session)
        if self.pool_problems:
            _warn_unknown_driver(self.pool_problems, "in-flight counts")
        else:
            self._in_flight_source = pool_in_flight_reader(session)
        self.sampling = self._in_flight_source is not None
        session.add_request_init_listener(self._on_request)
        for policy in self.policies:
            self._adopt(policy)
            policy.tracking_attached()
            policy.start_health_refresh()
        self.prober.start()

    def _on_request(self, future: Any) -> None:
        if future.query is self._probe_query or future.query is self._load_query:
            return  # adaptive-lb's own probe or load read: counted apart, on the host
        policy = getattr(future, FUTURE_POLICY_ATTRIBUTE, None)
        if self._closed or not isinstance(policy, AdaptiveLoadBalancingPolicy):
            self.untracked_requests += 1
            return
        telemetry = self.telemetry
        attempts = None
        # Inline, the one check per request when nothing records: no call unless a span
        # is current (or telemetry records every request).
        if telemetry is not None and (
            telemetry.every_request or (telemetry.spans and current_recording_span() is not None)
        ):
            try:
                attempts = telemetry.observe(future, policy)
            except Exception:
                policy.record_error("tracing", "this request is tracked without its span")
        if attempts is None:
            if self.sampling:
                if policy not in self._sourced:
                    self._adopt(policy)
                # Sampler.take, inlined: tracked with probability 1 / every.
                sampler = policy.sampler
                n = next(sampler.count)
                every = sampler.every
                if every > 1 and random() * every >= 1.0:
                    return
                sampler.picked(n)
            attempts = _Attempts()
            attempts.policy = policy
            hook_future(future, attempts)
        else:  # a request span ends with its request, even one that ends outside a response
            hook_future(future, attempts, every_end=True)

    def _adopt(self, policy: AdaptiveLoadBalancingPolicy) -> None:
        """Read ``policy``'s in-flight counts from this session's pools (a policy of an
        execution profile added after attach is adopted at its first request)."""
        source = self._in_flight_source
        if source is not None:
            with self._close_lock:
                if self._closed:
                    return
                policy.stats.add_in_flight_source(source)
                self._sourced = self._sourced | {policy}

    def close(self) -> None:
        """Stop tracking new requests (requests already hooked are still released when
        they complete) and the policies' health refresh. Idempotent; :func:`instrument`
        calls it when the session shuts down."""
        with self._close_lock:
            if self._closed:
                return
            self._closed = True
        self.prober.close()
        with contextlib.suppress(ValueError):
            self._session.remove_request_init_listener(self._on_request)
        if self._in_flight_source is not None:
            for policy in self._sourced:
                policy.stats.remove_in_flight_source(self._in_flight_source)
        for policy in self.policies:
            policy.tracking_attached(False)
            policy.stop_health_refresh()


_warned_drivers: set[tuple[str, str]] = set()


def _warn_unknown_driver(problems: list[str], what: str = "") -> None:
    """One WARNING per driver release and process: tracking is off (or, for ``what``
    "in-flight counts", every request is tracked instead of a sample), and why."""
    release = driver_release()
    if (release, what) in _warned_drivers:
        return
    _warned_drivers.add((release, what))
    if what:
        log.warning(
            "adaptive-lb: %s does not keep its connection pools as this release expects "
            "(%s): in-flight counts are taken by tracking every request instead of from "
            "the pools (more CPU per request). docs/deployment.md lists the tested releases.",
            release,
            "; ".join(problems),
        )
        return
    log.warning(
        "adaptive-lb: %s is not a driver release whose internals request tracking knows "
        "(%s): requests are not tracked and every host looks idle; plans are still "
        "ordered by rack, replica and health. docs/deployment.md lists the tested releases.",
        release,
        "; ".join(problems),
    )


def session_policies(session: Any) -> list[AdaptiveLoadBalancingPolicy]:
    """The adaptive policies of the session's cluster (execution profiles and legacy)."""
    cluster = getattr(session, "cluster", None)
    if cluster is None:
        return []
    found: list[AdaptiveLoadBalancingPolicy] = []
    profiles = getattr(cluster.profile_manager, "profiles", {})
    candidates = [profile.load_balancing_policy for profile in profiles.values()]
    candidates.append(getattr(cluster, "load_balancing_policy", None))
    for policy in candidates:
        if isinstance(policy, AdaptiveLoadBalancingPolicy) and policy not in found:
            found.append(policy)
    return found


def close_on_shutdown(session: Any, close: Callable[[], Any]) -> None:
    """Make ``session.shutdown()`` call ``close()`` once it has shut the session down."""
    shutdown = session.shutdown

    def shutdown_and_close(*args: Any, **kwargs: Any) -> Any:
        try:
            return shutdown(*args, **kwargs)
        finally:
            close()

    session.shutdown = shutdown_and_close


def instrument(session: Any) -> RequestTracker:
    """Track every request of ``session`` made through an AdaptiveLoadBalancingPolicy
    (in any execution profile) and refresh their health. Returns the tracker;
    ``session.shutdown()`` closes it. :func:`adaptive_lb.attach` does this and starts
    everything else the config enables."""
    tracker = RequestTracker(session)
    close_on_shutdown(session, tracker.close)
    return tracker
