"""Stand-ins for what :class:`adaptive_lb.runtime.prober.Prober` talks to, shared by the probe and
server-load tests: a session whose ``execute_async`` records its calls and hands out a new
future each time (``session.future`` is the latest), the future's ``add_callbacks``, and the
parts of a policy the prober uses. No driver object exists without a server here."""

from __future__ import annotations

from typing import Any

from adaptive_lb.config import HealthConfig
from adaptive_lb.core.clock import ManualClock
from adaptive_lb.stats.fleet import FleetEstimate


class StandInFuture:
    """Keeps the callbacks the prober adds."""

    def __init__(self) -> None:
        self.callbacks: Any = None

    def add_callbacks(self, callback, errback, callback_args=(), errback_args=()):
        self.callbacks = (callback, errback, callback_args, errback_args)


class StandInSession:
    """Records ``(statement, timeout, host)`` per ``execute_async`` call."""

    def __init__(self) -> None:
        self.calls: list[tuple[Any, Any, Any]] = []
        self.future = StandInFuture()

    def execute_async(self, statement, timeout=None, host=None):
        self.calls.append((statement, timeout, host))
        self.future = StandInFuture()
        return self.future


class StandInPolicy:
    """A manual clock, the health config, the prober's senders, the fleet estimate and its
    error reports."""

    def __init__(self) -> None:
        self.clock = ManualClock(0)
        self.now_ns = self.clock.now_ns
        self.config = type("C", (), {"health": HealthConfig()})()
        self.sender: Any = None
        self.read_load: Any = None
        self.read_clients: Any = None
        self.fleet = FleetEstimate()
        self.errors: list[str] = []

    def use_prober(self, send, replacing=None, read_load=None, read_clients=None):
        if replacing is None or self.sender is replacing:
            self.sender = send
            self.read_load = read_load if send is not None else None
            self.read_clients = read_clients if send is not None else None

    def record_error(self, stage, what):
        self.errors.append(stage)
