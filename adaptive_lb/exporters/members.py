"""The policies one exporter serves, and their ``policy`` label: shared by every attachment
that exports to the same Prometheus registry or OpenTelemetry meter provider.

Each :func:`~adaptive_lb.attach` (or ``start_prometheus_server`` / ``register_otel_metrics``
call) adds its policies and removes them when it closes, so one collector and one set of
instruments serve every live attachment of the process, and a closed one's series are
gone. A policy added again (two sessions of one cluster) is served once, under its first
name, until its last holder removes it.

Imports the standard library only.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from typing import Any

__all__ = ["Members", "policy_list"]


def policy_list(policies: Any) -> list[Any]:
    """The policies an exporter call was given: a policy (anything with ``snapshot()``), or
    a list, tuple or other iterable of them."""
    if isinstance(policies, (list, tuple)):
        return list(policies)
    if hasattr(policies, "snapshot"):
        return [policies]
    return list(policies)


class Members:
    """Policies and their distinct names, reference-counted per policy; thread-safe."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        # id(policy) -> [name, policy, holders]; insertion order is the export order.
        self._entries: dict[int, list[Any]] = {}

    def add(self, policies: Sequence[Any], names: Sequence[str] | None = None) -> list[str]:
        """Serve ``policies`` under ``names`` (default: the lowest free ``"0"``, ``"1"``,
        ...) and return the name each is served under. A policy already served keeps its
        name. Raises ``ValueError``, adding nothing, when the names do not match the
        policies or one is already another policy's."""
        policies = list(policies)
        if names and len(names) != len(policies):
            raise ValueError(f"{len(names)} names for {len(policies)} policies")
        if names and len(set(names)) != len(names):
            raise ValueError(f"policy names must be distinct: {list(names)}")
        with self._lock:
            taken = {entry[0]: key for key, entry in self._entries.items()}
            if names:
                for name, policy in zip(names, policies, strict=True):
                    owner = taken.get(name)
                    if owner is not None and owner != id(policy):
                        raise ValueError(
                            f"policy name {name!r} is already another policy's: close what "
                            "serves that one first, or choose another name"
                        )
            result = []
            for i, policy in enumerate(policies):
                entry = self._entries.get(id(policy))
                if entry is None:
                    name = names[i] if names else _lowest_free(taken)
                    entry = self._entries[id(policy)] = [name, policy, 0]
                    taken[name] = id(policy)
                entry[2] += 1
                result.append(entry[0])
            return result

    def remove(self, policies: Sequence[Any]) -> None:
        """Drop one hold on each of ``policies``; a policy with none left is no longer
        served (unknown policies are ignored)."""
        with self._lock:
            for policy in policies:
                entry = self._entries.get(id(policy))
                if entry is None:
                    continue
                entry[2] -= 1
                if entry[2] <= 0:
                    del self._entries[id(policy)]

    def clear(self) -> None:
        """Serve nothing (a forked child: the policies served are the parent's, and the
        lock may be held there)."""
        self._lock = threading.Lock()
        self._entries = {}

    def named(self) -> list[tuple[str, Any]]:
        """``(name, policy)`` of every policy served, in the order they were added."""
        with self._lock:
            return [(entry[0], entry[1]) for entry in self._entries.values()]

    def __len__(self) -> int:
        with self._lock:
            return len(self._entries)


def _lowest_free(taken: dict[str, int]) -> str:
    i = 0
    while str(i) in taken:
        i += 1
    return str(i)
