"""Hot reload: :class:`ConfigWatcher` polls the config file and applies each valid change;
an invalid one is reported and the last good config stays in force.

Imports the config's own modules and, of its row, the clock and the error counters only.
"""

from __future__ import annotations

import hashlib
import logging
import os
import threading
from collections.abc import Callable
from typing import Any

from adaptive_lb.config.errors import ConfigError
from adaptive_lb.config.loader import load_config
from adaptive_lb.config.model import Config
from adaptive_lb.config.safe_yaml import MAX_CONFIG_BYTES
from adaptive_lb.core.clock import SYSTEM_CLOCK
from adaptive_lb.core.errors import ErrorLog

__all__ = ["ConfigWatcher"]

_log = logging.getLogger("adaptive_lb.config")


class ConfigWatcher:
    """Polls a config file and calls ``on_change(config)`` when it changes to a valid
    config, or ``on_error(error)`` (and logs) when it changes to an invalid one -- the last
    good config (:attr:`config`) stays in force. A change is a different mtime, size or
    content hash. Runs on a daemon thread; :meth:`stop` returns promptly.

    Write the file atomically (write elsewhere, then rename) so that a poll never sees it
    half written; a half-written file is only reported as an error and the complete one is
    applied on the next poll.
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        on_change: Callable[[Config], None],
        on_error: Callable[[ConfigError], None] | None = None,
        interval: float = 1.0,
        report_error: Callable[[str, str], None] | None = None,
    ) -> None:
        if not interval > 0:
            raise ValueError(f"interval: must be > 0, got {interval!r}")
        if report_error is None:
            report_error = ErrorLog(SYSTEM_CLOCK, _log).record
        self.report_error = report_error
        """Where an exception inside the watcher (a failing ``on_change``, say) goes:
        ``report_error(stage, what)``, e.g. ``policy.record_error``; by default a counted
        log at most once a minute."""
        self.path = os.fspath(path)
        self.on_change = on_change
        self.on_error = on_error
        self.interval = interval
        self.config: Config | None = None
        """The last good config this watcher loaded (None until one was)."""
        self._stop = threading.Event()
        # One check at a time (the thread vs. a direct check()), callbacks included so that
        # they see the configs in order; reentrant so that a callback may call check().
        self._lock = threading.RLock()
        self._thread: threading.Thread | None = None
        self._seen: tuple[Any, ...] | None = None

    def _signature(self) -> tuple[Any, ...] | None:
        try:
            stat = os.stat(self.path)
            with open(self.path, "rb") as handle:
                digest = hashlib.sha256(handle.read(MAX_CONFIG_BYTES + 1)).hexdigest()
        except OSError:
            return None
        return (stat.st_mtime_ns, stat.st_size, digest)

    def check(self) -> bool:
        """Look once; True if the file changed (whatever the outcome). A file that
        disappears is not a change: the last good config stays."""
        with self._lock:
            signature = self._signature()
            if signature is None or signature == self._seen:
                return False
            self._seen = signature
            try:
                config = load_config(self.path)
            except ConfigError as exc:
                _log.error(
                    "adaptive-lb: config %s rejected, keeping the last good one: %s",
                    self.path,
                    exc,
                )
                if self.on_error is not None:
                    self.on_error(exc)
                return True
            self.config = config
            self.on_change(config)
            return True

    def start(self) -> ConfigWatcher:
        """Start polling; the file's current content counts as seen (load it yourself
        first). Calling it on a running watcher does nothing."""
        with self._lock:
            if self._thread is not None and self._thread.is_alive():
                return self
            self._seen = self._signature()
            self._stop.clear()
            self._thread = threading.Thread(
                target=self._run, name="adaptive-lb-config", daemon=True
            )
            self._thread.start()
        return self

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            try:
                self.check()
            except Exception:  # a failing callback must not end the watcher
                self.report_error("config_watch", "the config in force stays")

    def stop(self, timeout: float = 5.0) -> None:
        """Stop polling and wait for the thread (not when called from a callback)."""
        self._stop.set()
        thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout)

    @property
    def running(self) -> bool:
        """True while the polling thread is alive."""
        return self._thread is not None and self._thread.is_alive()

    @property
    def stopped(self) -> bool:
        """True once :meth:`stop` was called (its thread may still be ending), until the
        next :meth:`start`."""
        return self._stop.is_set()

    def __enter__(self) -> ConfigWatcher:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
