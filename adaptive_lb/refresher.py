"""The background thread that refreshes a policy's health (so health stays current when
no request arrives to notice the refresh deadline)."""

from __future__ import annotations

import threading
import weakref
from typing import Any

__all__ = ["HealthRefresher"]


class HealthRefresher(threading.Thread):
    """Daemon thread calling ``policy.maybe_refresh_health()`` every
    ``policy.config.health.refresh_interval`` (read each time: a reload applies) until
    :meth:`stop`, or until the policy is garbage-collected."""

    def __init__(self, policy: Any) -> None:
        super().__init__(name="adaptive-lb-health", daemon=True)
        # A weak reference: an unused policy must not be kept alive by its own thread.
        self._policy = weakref.ref(policy)
        self._stop_event = threading.Event()

    def run(self) -> None:
        while True:
            policy = self._policy()
            if policy is None:
                return
            interval = policy.config.health.refresh_interval
            try:
                policy.maybe_refresh_health()
            except Exception:
                policy.record_error("health_refresh", "the last health verdicts stay")
            del policy
            if self._stop_event.wait(interval):
                return

    def stop(self) -> None:
        """Ask the thread to end and wait for it."""
        self._stop_event.set()
        if self is not threading.current_thread():
            self.join(timeout=5)
