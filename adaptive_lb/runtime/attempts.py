"""The attempts of one tracked request: each counted on its host as it is sent and
released exactly once -- by its response, or by the end of its request -- with its outcome
and latency recorded on the host's statistics (see :mod:`adaptive_lb.runtime.tracking` for which
requests are tracked, and :func:`adaptive_lb.runtime._driver.hook_future` for where the driver
calls these).

Fast errors (overloaded, unavailable, bootstrapping, server error, broken connection) never
enter the latency histogram, so a node that fails fast never looks fast. Requests refused
for the client's own reasons (syntax, invalid, unauthorized...) count as answered: the host
did its job.

May import: the policy it serves (its statistics), the driver's message classes.
"""

from __future__ import annotations

from typing import Any

from cassandra import OperationTimedOut
from cassandra.protocol import (
    ErrorMessage,
    ReadTimeoutErrorMessage,
    ResultMessage,
    WriteTimeoutErrorMessage,
)

from adaptive_lb.runtime.policy import AdaptiveLoadBalancingPolicy
from adaptive_lb.stats.host import HostStats

__all__ = [
    "CLIENT_ERROR",
    "CONNECTION_ERROR",
    "ERROR",
    "SERVER_TIMEOUT",
    "SUCCESS",
    "Attempts",
    "outcome_of",
]
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
    request spans (:mod:`adaptive_lb.runtime.request_spans`) both classify with it."""
    if isinstance(response, ResultMessage):
        return SUCCESS
    if isinstance(response, (ReadTimeoutErrorMessage, WriteTimeoutErrorMessage)):
        return SERVER_TIMEOUT
    if isinstance(response, ErrorMessage):
        if getattr(response, "error_code", None) in _CLIENT_ERROR_CODES:
            return CLIENT_ERROR
        return ERROR
    return CONNECTION_ERROR


class Attempts(dict[int, tuple[HostStats, int]]):
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
    def of(cls, policy: AdaptiveLoadBalancingPolicy) -> Attempts:
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
