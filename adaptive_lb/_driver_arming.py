"""Armed requests: the session's ``_on_request`` replaced for one request at a time, so
that tracking sees the requests it samples and no other.

A request-init listener (the public hook) is a call from the driver's compiled code into
the interpreter on every request, ~2.5 us before it does anything: a tenth of what a
tracked request costs, paid by the nine requests in ten that sampling leaves alone. The
driver gives a cheaper place. ``Session.execute_async`` creates the ``ResponseFuture``,
whose ``__init__`` makes the query plan -- the policy runs, on the caller's thread -- then
calls ``self._on_request(future)`` (which runs the listeners), then sends. ``Session`` is a
plain class, so an instance attribute named ``_on_request`` wins over the method. When the
policy's plan picks a request, it *arms* it (:meth:`RequestArming.arm`): the thread's
``(policy, statement)`` is noted and the session's ``_on_request`` set to
:meth:`RequestArming._on_request`, which takes the note, hooks the future, calls the
driver's own ``_on_request`` (the user's listeners, unchanged) and, with no request armed
on any thread, removes itself. Requests that are not armed run the driver's code only.

A note is taken only by the request whose future has the noted statement and policy, so a
plan made without a request following it (``Session.prepare``, the next page of a result)
arms nothing; a request on another thread that takes the session's attribute in between
finds no note of its own. Two threads arming and disarming at once can at worst leave one
armed request unhooked (a sample lost, never a count wrong: tracking releases what it
hooks). :func:`arming_problems` checks at attach that the driver still calls
``_on_request`` this way, by running the session class's own ``execute_async`` on a stand-in
(no I/O), and that the plan is made when the future is created; tracking falls back to
the public listener otherwise. ``tests/unit/test_driver_contract.py`` pins both.

Imports the driver and the standard library; nothing of adaptive-lb but the bottom layer
(:mod:`adaptive_lb._driver`).
"""

from __future__ import annotations

import threading
import types
from collections.abc import Callable
from functools import partial
from threading import get_ident
from typing import Any

from cassandra.cluster import ResponseFuture

from adaptive_lb._driver import FUTURE_POLICY_ATTRIBUTE

__all__ = ["RequestArming", "arming_problems", "set_arm", "watch_new_profiles"]

_ATTRIBUTE = "_on_request"
"""The ``Session`` method ``execute_async`` calls between creating a future and sending it."""

_MAX_ARMED = 1024
"""Notes kept at most: a plan with no request after it on a thread that then ends leaves
its note behind; past this many, they are dropped (a few samples lost, no memory held)."""

_armed: dict[int, tuple[Any, Any]] = {}
"""Thread ident -> ``(policy, statement)`` of the request just planned on that thread and
armed, until that request's ``_on_request`` (shared by every session: a plan does not know
its session)."""


class RequestArming:
    """Hands the armed requests of one ``session`` to ``handle(future, policy)`` (see the
    module docstring). ``handle`` runs on the caller's thread before the request is sent;
    it must not raise."""

    __slots__ = ("_handle", "_listeners", "_session", "_stand_in")

    def __init__(self, session: Any, handle: Callable[[Any, Any], None]) -> None:
        self._session = session
        self._handle = handle
        self._listeners: Callable[[Any, Any], None] = getattr(type(session), _ATTRIBUTE)
        self._stand_in = self._on_request  # one bound method, set again and again

    def arm(self, policy: Any, statement: Any) -> None:
        """The plan being made on this thread by ``policy`` for ``statement`` is for a
        request tracking wants: hand that request to ``handle`` when it is created."""
        if len(_armed) >= _MAX_ARMED:  # notes no request took (threads long gone)
            _armed.clear()
        _armed[get_ident()] = (policy, statement)
        self._session._on_request = self._stand_in

    def _on_request(self, future: Any) -> None:
        session = self._session
        armed = _armed.pop(get_ident(), None)
        if not _armed:
            session.__dict__.pop(_ATTRIBUTE, None)
            if _armed:  # another thread armed meanwhile: its request must find us
                session._on_request = self._stand_in
        if (
            armed is not None
            and armed[1] is future.query
            and getattr(future, FUTURE_POLICY_ATTRIBUTE, None) is armed[0]
        ):
            self._handle(future, armed[0])
        self._listeners(session, future)

    def close(self) -> None:
        """Arm nothing more; the session runs the driver's ``_on_request`` again."""
        self._session.__dict__.pop(_ATTRIBUTE, None)


_arms: dict[Any, tuple[RequestArming, ...]] = {}
"""A policy -> the armings of the sessions whose tracking samples its requests (usually
one; a policy serves every session of its cluster)."""
_arms_lock = threading.Lock()


def _arm_every(armings: tuple[RequestArming, ...], policy: Any, statement: Any) -> None:
    for arming in armings:
        arming.arm(policy, statement)


def set_arm(policy: Any, arming: RequestArming | None, on: bool) -> None:
    """Let ``policy``'s plans arm requests for ``arming``'s session (``on``), or no longer;
    sets ``policy.arm`` to what its plans call (None: no session wants its requests)."""
    if arming is None:
        return
    with _arms_lock:
        armings = tuple(a for a in _arms.get(policy, ()) if a is not arming)
        if on:
            armings += (arming,)
        if not armings:
            _arms.pop(policy, None)
            policy.arm = None
        elif len(armings) == 1:
            _arms[policy] = armings
            policy.arm = armings[0].arm
        else:
            _arms[policy] = armings
            policy.arm = partial(_arm_every, armings)


def watch_new_profiles(session: Any, added: Callable[[], None]) -> None:
    """Call ``added()`` after each ``session.cluster.add_execution_profile`` (public API):
    a policy that only the new profile uses has no session arming its plans until then."""
    cluster: Any = getattr(session, "cluster", None)
    add = getattr(cluster, "add_execution_profile", None)
    if add is None:
        return

    def add_and_tell(*args: Any, **kwargs: Any) -> Any:
        try:
            return add(*args, **kwargs)
        finally:
            added()

    cluster.add_execution_profile = add_and_tell


def arming_problems(session: Any) -> list[str]:
    """What arming relies on in ``session``'s driver and does not find (empty: all there):
    ``execute_async`` calls ``self._on_request(future)`` after creating the future and
    before sending it, an instance attribute can stand in for it, and a ``ResponseFuture``
    makes its plan when it is created. Checked by running the driver's own code on
    stand-ins, without I/O."""
    cls = type(session)
    problems = []
    if not callable(getattr(cls, _ATTRIBUTE, None)):
        problems.append(f"{cls.__name__}._on_request is gone")
    elif not hasattr(session, "__dict__") or cls.__getattribute__ is not object.__getattribute__:
        problems.append(f"{cls.__name__} instances cannot override _on_request")
    else:
        problems += _execute_async_problems(cls)
    problems += _plan_problems()
    return problems


def _execute_async_problems(cls: type) -> list[str]:
    steps: list[str] = []

    class Future:
        _protocol_handler = None

        def send_request(self, *args: Any, **kwargs: Any) -> None:
            steps.append("send")

    future = Future()

    def create(*args: Any, **kwargs: Any) -> Any:
        steps.append("create")
        return future

    def on_request(seen: Any) -> None:
        steps.append("on_request" if seen is future else "on_request(other)")

    stand_in = types.SimpleNamespace(
        _create_response_future=create, client_protocol_handler=None, _on_request=on_request
    )
    try:
        cls.execute_async(stand_in, "SELECT release_version FROM system.local")  # type: ignore[attr-defined]
    except Exception as exc:
        return [f"{cls.__name__}.execute_async fails on a stand-in: {exc!r}"]
    if steps != ["create", "on_request", "send"]:
        return [f"{cls.__name__}.execute_async does {steps} (expected create, on_request, send)"]
    return []


def _plan_problems() -> list[str]:
    planned = []

    class Policy:
        def make_query_plan(self, working_keyspace: Any = None, query: Any = None) -> Any:
            planned.append(query)
            return iter(())

    cluster = types.SimpleNamespace(_default_load_balancing_policy=None)
    session = types.SimpleNamespace(row_factory=None, keyspace=None, cluster=cluster)
    statement = object()
    try:
        ResponseFuture(session, None, statement, None, load_balancer=Policy())
    except Exception as exc:
        return [f"ResponseFuture cannot be made on a stand-in: {exc!r}"]
    if planned != [statement]:
        return ["ResponseFuture does not make its plan when it is created"]
    return []
