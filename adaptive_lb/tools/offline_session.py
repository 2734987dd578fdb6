"""A driver ``Session`` that never leaves the process: the driver's own ``execute_async`` and
``_on_request`` (the request-init listeners) and a real ``ResponseFuture``
subclass whose plan comes from the policy, with no cluster, pool or server.

For what needs the driver's per-request path without a server:
``benchmarks/tracking_overhead.py`` (what tracking adds to a request, the network left out)
and its unit test. Each request is "sent" to the first host of its plan and
answered at once with a real ``ResultMessage``, as one attempt.

Imports the driver and the name of its future's policy attribute
(:data:`adaptive_lb.runtime._driver.FUTURE_POLICY_ATTRIBUTE`); imported by tests and benchmarks,
never by the library.
"""

from __future__ import annotations

import threading
import types
from typing import Any, TypeVar

from cassandra.cluster import ResponseFuture, Session
from cassandra.protocol import ResultMessage

from adaptive_lb.runtime._driver import FUTURE_POLICY_ATTRIBUTE

__all__ = ["OfflineFuture", "OfflineSession", "unsent_future"]

_F = TypeVar("_F", bound=ResponseFuture)

_RESULT = ResultMessage(2)  # a VOID result


def unsent_future(cls: type[_F], policy: Any) -> _F:
    """A ``cls`` (a ``ResponseFuture`` subclass) in the state its ``__init__`` leaves it,
    planned by ``policy``, without a session, a statement or a plan: the attributes the
    methods tracking hooks read (the callbacks and their lock, the "not set" final result,
    the policy). Relies on ResponseFuture privates of both drivers; those the hook uses are
    pinned in ``tests/unit/test_driver_contract.py``."""
    future = object.__new__(cls)  # what the class would do, without its __init__
    setattr(future, FUTURE_POLICY_ATTRIBUTE, policy)
    future._callback_lock = threading.Lock()
    future._callbacks = []
    future._errbacks = []
    future._final_result = ResponseFuture._final_result
    future._final_exception = None
    return future


class OfflineFuture(ResponseFuture):
    """A real ``ResponseFuture`` whose network-facing steps do nothing: ``send_request``
    goes through ``_query``, ``_set_result`` and ``_set_final_result`` (what tracking hooks)
    for the first host of the plan."""

    def _query(self, host: Any, message: Any = None, cb: Any = None) -> Any:
        return 1  # the driver's send

    def _set_result(self, host: Any, connection: Any, pool: Any, response: Any) -> None:
        return None

    def _set_final_result(self, response: Any) -> None:
        return None

    def _set_final_exception(self, response: Any, *args: Any, **kwargs: Any) -> None:
        return None

    def send_request(self, error_no_hosts: bool = True) -> bool:
        """One attempt on the plan's first host, answered at once."""
        host = next(self.query_plan)
        self.sent_to = host
        self._query(host)
        self._set_result(host, None, None, _RESULT)
        self._set_final_result(None)
        return True


class OfflineSession(Session):
    """The driver's ``Session`` with ``policy`` as its default execution profile's policy
    and no connection: ``execute_async`` creates an :class:`OfflineFuture`, makes its plan
    as ``ResponseFuture.__init__`` does, calls ``_on_request`` and sends it."""

    def __init__(self, policy: Any) -> None:  # the driver's would connect
        self._request_init_callbacks: list[Any] = []
        self._pools: dict[Any, Any] = {}
        self.keyspace = None
        self._policy = policy
        profile = types.SimpleNamespace(load_balancing_policy=policy)
        self.cluster = types.SimpleNamespace(
            profile_manager=types.SimpleNamespace(profiles={"default": profile}),
            load_balancing_policy=None,
        )

    def _create_response_future(self, query: Any, *args: Any, **kwargs: Any) -> OfflineFuture:
        future = unsent_future(OfflineFuture, self._policy)
        future.session = self
        future.query = query
        future._host = None
        # As ResponseFuture.__init__ does: the plan first, on the caller's thread.
        future.query_plan = iter(self._policy.make_query_plan(None, query))
        return future

    def shutdown(self) -> None:
        """Nothing to close."""
