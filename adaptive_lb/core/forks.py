"""What a process inherits across ``fork()`` after adaptive-lb started: found and said.

A pre-fork server that builds the driver's ``Cluster`` (and so the policy) in its master
and forks workers afterwards gives every worker a copy of objects whose connections,
threads and locks stayed behind: the driver answers nothing there, the health refresh
thread does not exist, a lock held by another thread at the fork is held forever. Objects
registered here are told in the child, right after the fork (``os.register_at_fork``), so
that they stop claiming to be live (a policy: tracking detached, refresh stopped, in-flight
counts of the parent's requests dropped, ``forked_from_pid`` set) and module state shared
by new attachments is made fresh (the Prometheus endpoints the parent serves). One WARNING
per forked process says what to do instead: connect and attach after the fork
(docs/deployment.md). Imports nothing of adaptive-lb's.
"""

from __future__ import annotations

import logging
import os
import weakref
from collections.abc import Callable
from typing import Any

__all__ = ["on_fork_in_child", "parent_pid", "watch"]

log = logging.getLogger("adaptive_lb.forks")

_watched: weakref.WeakSet[Any] = weakref.WeakSet()
_resets: list[Callable[[], None]] = []
_pid = os.getpid()
_parent: int | None = None


def watch(obj: Any) -> None:
    """Call ``obj.inherited_across_fork(parent_pid)`` in a child forked while ``obj``
    lives (held weakly)."""
    _watched.add(obj)


def on_fork_in_child(reset: Callable[[], None]) -> None:
    """Call ``reset()`` in every forked child (module state: registries, locks)."""
    _resets.append(reset)


def parent_pid() -> int | None:
    """The pid of the process this one was forked from after adaptive-lb was imported
    (None: not forked since)."""
    return _parent


def _after_fork_in_child() -> None:
    global _pid, _parent
    _parent, _pid = _pid, os.getpid()
    for reset in _resets:
        try:
            reset()
        except Exception:  # pragma: no cover - a child must start whatever happens
            log.exception("adaptive-lb: resetting state after fork")
    inherited = list(_watched)
    for obj in inherited:
        try:
            obj.inherited_across_fork(_parent)
        except Exception:  # pragma: no cover
            log.exception("adaptive-lb: marking an object inherited across fork")
    if inherited:
        log.warning(
            "adaptive-lb: this process (pid %d) was forked from pid %d after %d adaptive "
            "policies were made there: their driver connections and threads stayed in the "
            "parent, so they track nothing here. Create the Cluster and attach after the "
            "fork (gunicorn post_fork, uwsgi @postfork; docs/deployment.md).",
            _pid,
            _parent,
            len(inherited),
        )


if hasattr(os, "register_at_fork"):  # POSIX
    os.register_at_fork(after_in_child=_after_fork_in_child)
