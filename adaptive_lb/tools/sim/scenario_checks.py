"""What a scenario file needs checked beyond the config toolkit's validators.

Field validators for the shapes the toolkit has no validator for (datacenters -> zones ->
node counts, a replication factor or a mapping of them, the zone latency matrix, lists of
names); the checks across keys (zones unique, faults on nodes that exist...) are
:func:`adaptive_lb.tools.sim.scenario.cross_checks`, beside the scenario they read.
Their messages name the place inside the value (``datacenters.dc1.A: ...``) or the key path,
so that the loader (:mod:`adaptive_lb.config.structure`) reports the full path and its line.

Imports attrs and the config's errors only; never :mod:`~adaptive_lb.tools.sim.scenario`,
which imports it.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from attrs import Attribute

from adaptive_lb.config.errors import show, type_name

__all__ = [
    "REFERENCE_KEYS",
    "datacenters",
    "latency_matrix",
    "names",
    "reference",
    "replication",
]

REFERENCE_KEYS = ("seed", "requests", "p50_ms", "p95_ms", "p99_ms")
"""The keys of a scenario's ``reference``: the run it was measured in, and adaptive-lb's
figures then."""


def _got(value: Any) -> str:
    """What a value is, an empty mapping or list said so."""
    if isinstance(value, (Mapping, list)) and not value:
        return f"an empty {'mapping' if isinstance(value, Mapping) else 'list'}"
    return type_name(value)


def _counts(place: str, counts: Mapping[Any, Any]) -> None:
    """Every value of ``counts`` an integer >= 1 (the message names the first that is not)."""
    for key, count in counts.items():
        if isinstance(count, bool) or not isinstance(count, int) or count < 1:
            raise ValueError(f"{place}.{key}: must be an integer >= 1, got {show(count)}")


def datacenters(instance: Any, attribute: Attribute, value: Any) -> None:
    """``{dc: {zone: nodes}}``, each count an integer >= 1."""
    name = attribute.name
    if not isinstance(value, Mapping) or not value:
        raise TypeError(f"{name}: must map datacenter names to {{zone: nodes}}, got {_got(value)}")
    for dc, zones in value.items():
        if not isinstance(zones, Mapping) or not zones:
            raise TypeError(f"{name}.{dc}: must map zone names to node counts, got {_got(zones)}")
        _counts(f"{name}.{dc}", zones)


def replication(instance: Any, attribute: Attribute, value: Any) -> None:
    """An RF >= 1, or ``{dc: RF}``."""
    name = attribute.name
    if isinstance(value, int) and not isinstance(value, bool):
        if value < 1:
            raise ValueError(f"{name}: must be >= 1, got {show(value)}")
    elif isinstance(value, Mapping):
        _counts(name, value)
    else:
        raise TypeError(f"{name}: must be an RF or a {{datacenter: RF}} mapping, got {_got(value)}")


def latency_matrix(instance: Any, attribute: Attribute, value: Any) -> None:
    """None, or ``{from_zone: {to_zone: microseconds >= 0}}``."""
    name = attribute.name
    if value is None:
        return
    if not isinstance(value, Mapping):
        raise TypeError(f"{name}: must map zone -> zone -> microseconds, got {_got(value)}")
    for src, row in value.items():
        if not isinstance(row, Mapping):
            raise TypeError(f"{name}.{src}: must map zone -> microseconds, got {_got(row)}")
        for dst, us in row.items():
            if isinstance(us, bool) or not isinstance(us, (int, float)) or not us >= 0:
                raise ValueError(f"{name}.{src}.{dst}: must be a number >= 0, got {show(us)}")


def reference(instance: Any, attribute: Attribute, value: Any) -> None:
    """None, or ``{seed, requests, p50_ms, p95_ms, p99_ms}``: integers, then numbers > 0."""
    name = attribute.name
    if value is None:
        return
    if not isinstance(value, Mapping):
        raise TypeError(f"{name}: must map {', '.join(REFERENCE_KEYS)}, got {_got(value)}")
    for key in value:
        if key not in REFERENCE_KEYS:
            raise ValueError(f"{name}.{key}: unknown key (valid: {', '.join(REFERENCE_KEYS)})")
    for key in REFERENCE_KEYS:
        if key not in value:
            raise ValueError(f"{name}.{key}: required")
        number = value[key]
        integral = key in ("seed", "requests")
        if (
            isinstance(number, bool)
            or not isinstance(number, int if integral else (int, float))
            or (not integral and not number > 0)
        ):
            kind = "an integer" if integral else "a number > 0"
            raise ValueError(f"{name}.{key}: must be {kind}, got {show(number)}")


def names(choices: tuple[str, ...] | None = None) -> Any:
    """A validator: a non-empty list of distinct strings (of ``choices``, if given)."""

    def check(instance: Any, attribute: Attribute, value: Any) -> None:
        name = attribute.name
        if value is None:
            return
        if not isinstance(value, list) or not value:
            raise TypeError(f"{name}: must be a non-empty list of names, got {_got(value)}")
        for index, item in enumerate(value):
            if choices is not None and item not in choices:
                raise ValueError(
                    f"{name}[{index}]: must be one of {', '.join(choices)}, got {show(item)}"
                )
            if not isinstance(item, str):
                raise TypeError(f"{name}[{index}]: must be a string, got {show(item)}")
            if item in value[:index]:
                raise ValueError(f"{name}[{index}]: {show(item)} is listed twice")

    return check
