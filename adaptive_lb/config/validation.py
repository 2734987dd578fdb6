"""The validators of settings fields, and the strict conversion of YAML values to them.

A settings class is a frozen attrs class whose fields carry these validators, so that an
object that exists is valid however it was made. A validator raises ``TypeError`` or
``ValueError`` with the message ``"<field>: <reason>"``; a validator of a mapping or a list
may name a place inside it, ``"<field>.<key>: <reason>"`` or ``"<field>[<i>]: <reason>"``,
and the loader puts the full key path and the line in front. The bound and choice
validators keep their ``kind``/``bound`` and ``options`` readable, so that the JSON Schema
(:mod:`.schema`) and the commented default file (:mod:`.defaults`) state them.

A field's *kind* (:func:`kind`, from its annotation) says how a YAML value is converted
before the validators see it (:func:`convert`): ``bool``, ``int``, ``float``, ``str``,
``str_map`` and ``duration`` strictly (no "8" for 8, no 1 for true), each also ``optional_``
(null allowed); any other annotation (``raw``) is passed as YAML gave it. A field whose
default is a factory of an attrs class is a *section* (:func:`nested_class`), a field with
metadata ``list_of`` a list of sections.

Imports attrs and the config's errors only.
"""

from __future__ import annotations

import math
import operator
import re
from collections.abc import Callable, Collection, Mapping
from typing import Any

from attrs import Attribute, field
from attrs import fields as attrs_fields
from attrs import has as attrs_has

from adaptive_lb.config.errors import show, type_name

__all__ = [
    "DURATION_RE",
    "boolean",
    "checks",
    "convert",
    "duration",
    "flagged_paths",
    "ge",
    "gt",
    "integer",
    "kind",
    "le",
    "limits",
    "nested_class",
    "number",
    "one_of",
    "optional",
    "optional_string",
    "options",
    "parse_duration",
    "split_path",
    "string",
    "string_map",
    "string_map_problem",
]

Validator = Callable[[Any, Attribute, Any], None]


def _bound(kind: str, bound: float) -> Validator:
    """A validator ``value <kind> bound``; ``kind`` and ``bound`` stay readable on the
    function so that the JSON Schema can state them."""
    compare = {">": operator.gt, ">=": operator.ge, "<=": operator.le}[kind]

    def check(instance: Any, attribute: Attribute, value: Any) -> None:
        # Compared as given (no float()): Python compares huge ints with floats exactly.
        if not compare(value, bound):
            raise ValueError(f"{attribute.name}: must be {kind} {show(bound)}, got {show(value)}")

    check.kind = kind  # type: ignore[attr-defined]
    check.bound = bound  # type: ignore[attr-defined]
    return check


def gt(bound: float) -> Validator:
    """``value > bound``."""
    return _bound(">", bound)


def ge(bound: float) -> Validator:
    """``value >= bound``."""
    return _bound(">=", bound)


def le(bound: float) -> Validator:
    """``value <= bound``."""
    return _bound("<=", bound)


def number(instance: Any, attribute: Attribute, value: Any) -> None:
    """A finite int or float (not a boolean)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"{attribute.name}: must be a number, got {show(value)}")
    try:
        finite = math.isfinite(value)
    except OverflowError:
        finite = False
    if not finite:
        raise ValueError(f"{attribute.name}: must be a finite number, got {show(value)}")


def integer(instance: Any, attribute: Attribute, value: Any) -> None:
    """An int (not a boolean)."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{attribute.name}: must be an integer, got {show(value)}")


def boolean(instance: Any, attribute: Attribute, value: Any) -> None:
    """True or False."""
    if not isinstance(value, bool):
        raise TypeError(f"{attribute.name}: must be true or false, got {show(value)}")


def string(instance: Any, attribute: Attribute, value: Any) -> None:
    """A str."""
    if not isinstance(value, str):
        raise TypeError(f"{attribute.name}: must be a string, got {show(value)}")


def optional_string(instance: Any, attribute: Attribute, value: Any) -> None:
    """A str or None."""
    if value is not None and not isinstance(value, str):
        raise TypeError(f"{attribute.name}: must be a string or null, got {show(value)}")


def optional(*validators: Validator) -> Validator:
    """None, or a value the ``validators`` accept (their bounds stay readable)."""

    def check(instance: Any, attribute: Attribute, value: Any) -> None:
        if value is not None:
            for validator in validators:
                validator(instance, attribute, value)

    check.validators = validators  # type: ignore[attr-defined]
    return check


def string_map_problem(value: Any) -> str | None:
    """Why ``value`` is not a mapping of strings to strings (None if it is): the bad entries'
    names and value types, never a value (header values are credentials)."""
    if not isinstance(value, Mapping):
        return f"got {type_name(value)} (value hidden)"
    bad = [f"{show(k)}: {type_name(v)}" for k, v in value.items() if not isinstance(v, str)]
    bad += [f"{show(k)} (a name)" for k in value if not isinstance(k, str)]
    return f"got {', '.join(bad[:4])}{' ...' if bad[4:] else ''} (value hidden)" if bad else None


def string_map(instance: Any, attribute: Attribute, value: Any) -> None:
    """A mapping of strings to strings; a message names no value."""
    problem = string_map_problem(value)
    if problem is not None:
        raise TypeError(f"{attribute.name}: must be a mapping of strings to strings, {problem}")


def one_of(*options: str) -> Validator:
    """A validator ``value in options`` (``options`` readable for the JSON Schema)."""

    def check(instance: Any, attribute: Attribute, value: Any) -> None:
        if not isinstance(value, str) or value not in options:
            choices = ", ".join(options)
            raise ValueError(f"{attribute.name}: must be one of {choices}, got {show(value)}")

    check.options = options  # type: ignore[attr-defined]
    return check


def duration(default: float, *bounds: Validator) -> Any:
    """A field holding seconds; in YAML also written ``250ms``, ``10s``, ``2m``..."""
    return field(default=default, validator=[number, *bounds], metadata={"duration": True})


DURATION_UNITS = {"us": 1e-6, "µs": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0}
"""Seconds per unit of a duration string."""
DURATION_RE = re.compile(r"^\s*([0-9]+(?:\.[0-9]+)?)\s*(us|µs|ms|s|m|h)\s*$")
"""A duration string: a number and a unit of :data:`DURATION_UNITS`."""


def parse_duration(value: Any) -> float:
    """Seconds from a number (seconds) or a string such as ``250ms``, ``10s``, ``2m``,
    ``1.5s``, ``500us``, ``1h``. Raises :class:`ValueError` for anything else."""
    if isinstance(value, bool):
        raise ValueError(f"must be a duration (e.g. 250ms, 10s, 2m), got {show(value)}")
    if isinstance(value, (int, float)):
        try:
            seconds = float(value)
        except OverflowError:
            raise ValueError(f"must be a finite duration, got {show(value)}") from None
        if not seconds >= 0:  # also rejects NaN
            raise ValueError(f"must be a non-negative duration, got {show(value)}")
        return seconds
    if isinstance(value, str):
        match = DURATION_RE.match(value)
        if match:
            return float(match.group(1)) * DURATION_UNITS[match.group(2)]
    raise ValueError(f"must be a duration (e.g. 250ms, 10s, 2m), got {show(value)}")


# --------------------------------------------------------------------------- field kinds

_KINDS = {"bool": "bool", "int": "int", "float": "float", "str": "str", "dict[str, str]": "str_map"}


def kind(attribute: Attribute) -> str:
    """How a value field is converted: ``duration``, ``bool``, ``int``, ``float``, ``str``,
    ``str_map``, each possibly ``optional_`` (``X | None``), or ``raw`` (as YAML gave it)."""
    if attribute.metadata.get("duration"):
        return "duration"
    annotation = str(attribute.type)
    base = annotation.removesuffix(" | None")
    found = _KINDS.get(base)
    if found is None:
        return "raw"
    return found if base == annotation else f"optional_{found}"


def convert(kind: str, raw: Any) -> Any:
    """YAML value -> field value of ``kind``, strict about types (no "8" for 8, no 1 for
    true). Raises TypeError/ValueError with a message naming the value."""
    if kind.startswith("optional_"):
        if raw is None:
            return None
        try:
            return convert(kind.removeprefix("optional_"), raw)
        except TypeError as exc:  # "must be a string, got ..." -> "must be a string or null, ..."
            must, got, value = str(exc).partition(", got ")
            raise TypeError(f"{must} or null{got}{value}") from None
    got = f"{type_name(raw)} ({show(raw)})"
    if kind == "raw":
        return raw
    if kind == "duration":
        return parse_duration(raw)
    if kind == "bool":
        if not isinstance(raw, bool):
            raise TypeError(f"must be true or false, got {got}")
        return raw
    if kind == "int":
        if isinstance(raw, float) and not isinstance(raw, bool):
            # 1.0e+4 is accepted as 10000; 8.5 is not an integer.
            if math.isfinite(raw) and raw.is_integer():
                return int(raw)
            raise TypeError(f"must be an integer, got a number with a fraction ({show(raw)})")
        if isinstance(raw, bool) or not isinstance(raw, int):
            raise TypeError(f"must be an integer, got {got}")
        return raw
    if kind == "float":
        if isinstance(raw, bool) or not isinstance(raw, (int, float)):
            raise TypeError(f"must be a number, got {got}")
        try:
            return float(raw)
        except OverflowError:
            raise ValueError(f"must be a finite number, got {show(raw)}") from None
    if kind == "str":
        if not isinstance(raw, str):
            raise TypeError(f"must be a string, got {got}")
        return raw
    if kind == "str_map":
        problem = None if raw is None else string_map_problem(raw)
        if problem is not None:
            raise TypeError(f"must be a mapping of strings to strings, {problem}")
        return dict(raw or {})
    raise AssertionError(f"unhandled field kind {kind}")


def checks(attribute: Attribute) -> list[Any]:
    """The individual validators of a field (attrs wraps a list in an ``and_``; those
    under :func:`optional` included)."""
    validator = attribute.validator
    if validator is None:
        return []
    found: list[Any] = []
    for check in getattr(validator, "_validators", [validator]):
        found += getattr(check, "validators", [check])
    return found


def limits(attribute: Attribute) -> list[tuple[str, float]]:
    """The bounds of a field as ``(kind, bound)`` pairs, e.g. ``[(">=", 1), ("<=", 64)]``."""
    return [(check.kind, check.bound) for check in checks(attribute) if hasattr(check, "kind")]


def options(attribute: Attribute) -> tuple[str, ...] | None:
    """The values a field may take (:func:`one_of`), or None."""
    return next((c.options for c in checks(attribute) if hasattr(c, "options")), None)


def nested_class(attribute: Attribute) -> type | None:
    """The attrs class of a section field (its default factory), or None for a value."""
    factory = getattr(attribute.default, "factory", None)  # an attrs Factory's callable
    if isinstance(factory, type) and attrs_has(factory):
        return factory
    return None


def flagged_paths(cls: type, flag: str, prefix: str = "") -> frozenset[str]:
    """Key paths of the fields of ``cls`` (sections included) whose metadata has ``flag``."""
    paths: set[str] = set()
    for attribute in attrs_fields(cls):
        path = f"{prefix}{attribute.name}"
        nested = nested_class(attribute)
        if nested is not None:
            paths |= flagged_paths(nested, flag, f"{path}.")
        elif attribute.metadata.get(flag):
            paths.add(path)
    return frozenset(paths)


def split_path(message: str, names: Collection[str]) -> tuple[str | None, str]:
    """``(place, reason)`` of a validator message ``"<place>: <reason>"`` whose place is one
    of ``names``, or below one (``name.key``, ``name[0]``); ``(None, message)`` otherwise."""
    head, separator, reason = message.partition(": ")
    if separator:
        name = re.split(r"[.\[]", head, maxsplit=1)[0]
        if name in names:
            return head, reason
    return None, message
