"""Request tracking: a sample of requests hooked, their attempts counted, timed and released
exactly once (:mod:`adaptive_lb.runtime.attempts`); the plans' in-flight counts taken from the
driver.

``adaptive_lb.instrument(session)`` registers a request-init listener (public driver API)
that sees each ``ResponseFuture`` created by the session whose plan came from an
:class:`~adaptive_lb.runtime.policy.AdaptiveLoadBalancingPolicy`, and gives that policy the
session's pools to read each host's in-flight count from (the driver's own count: every
request, tracked or not). It *tracks* every request while the policy's traffic is thin and
one in k above ``tracking.samples_per_host`` per local host per second
(:mod:`adaptive_lb.stats.sampling`); a request with a request span left out of the sample has
its attempts followed for the span only (no host statistics). Each
*attempt* of a tracked request -- the first try, a retry on the same or another host, a
speculative execution running beside the others -- is counted on its host just before it
is written to the connection and released once, by its response or by the end of its
request (:class:`~adaptive_lb.runtime.attempts.Attempts`). Where the driver's pools are not what
this release reads, every request is tracked and in-flight is counted here instead.

May import: the policy it serves (its row), the attempts, the prober, decision tracing, the
driver's internals (:mod:`adaptive_lb.runtime._driver`); never a tool.
"""

from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import Callable
from random import random
from typing import Any

from adaptive_lb.runtime._driver import (
    FUTURE_POLICY_ATTRIBUTE,
    driver_release,
    hook_future,
    loop_timer,
    pool_in_flight_reader,
    pool_problems,
    tracking_problems,
)
from adaptive_lb.runtime.attempts import (
    CLIENT_ERROR,
    CONNECTION_ERROR,
    ERROR,
    SERVER_TIMEOUT,
    SUCCESS,
    Attempts,
    outcome_of,
)
from adaptive_lb.runtime.policy import AdaptiveLoadBalancingPolicy
from adaptive_lb.runtime.prober import OwnStatement, Prober
from adaptive_lb.telemetry.tracing import current_recording_span

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
        (:class:`adaptive_lb.runtime.request_spans.RequestTelemetry`), set by
        :func:`adaptive_lb.attach` when tracing or OpenTelemetry metrics are on; its
        ``observe(future, policy)`` returns the attempts object of a request it records,
        or None."""
        self.policies = session_policies(session)
        """The session's adaptive policies (execution profiles and legacy)."""
        self.prober = Prober(session, self.policies)
        """Sends the policies' active probes (:mod:`adaptive_lb.runtime.prober`)."""
        self.pool_problems: list[str] = []
        """What this driver lacks for reading in-flight counts from the session's pools;
        not empty: every request is tracked and its attempts counted in flight here."""
        self._in_flight_source: Callable[[Any], int] | None = None
        self._sourced: frozenset[AdaptiveLoadBalancingPolicy] = frozenset()
        """The policies whose in-flight counts come from this session's pools."""
        self.sampling = False
        """Only a sample of requests is tracked (:mod:`adaptive_lb.stats.sampling`) once traffic
        is thick: the plans read in-flight counts from the driver's pools."""
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
        timer = loop_timer(session)
        for policy in self.policies:
            self._adopt(policy)
            policy.tracking_attached()
            policy.use_loop_timer(timer)
            policy.start_health_refresh()
        self.prober.start()

    def _on_request(self, future: Any) -> None:
        if future.query.__class__ is OwnStatement:
            return  # adaptive-lb's own probe or read: counted apart, on the host
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
        tracked = True
        if self.sampling:
            if policy not in self._sourced:
                self._adopt(policy)
            # Sampler.take, inlined: tracked with probability 1 / every.
            sampler = policy.sampler
            n = next(sampler.count)
            every = sampler.every
            if every > 1 and random() * every >= 1.0:
                tracked = False
            else:
                sampler.picked(n)
        if attempts is None:
            if not tracked:
                return
            attempts = Attempts()
            attempts.policy = policy
            hook_future(future, attempts)
        else:  # a request span ends with its request, even one that ends outside a response
            # A request left out of the sample still has its span: its attempts followed
            # for the span alone.
            attempts.tracked = tracked
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
            policy.use_loop_timer(None)
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
