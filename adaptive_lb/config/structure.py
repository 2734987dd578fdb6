"""Plain data (as YAML gives it) <-> settings objects.

:func:`structure` builds an attrs settings class from mappings, lists and scalars and
reports *every* problem at once in one :class:`ConfigError`, each as ``path.to.key: reason
(line N)``: unknown keys (with the closest valid key; a key a class lists in its
``REMOVED`` mapping, with the reason given there), missing required keys, values of
the wrong type or out of bounds (:mod:`.validation`), checks across keys (a class's
``__attrs_post_init__``, or a ``check`` given by the caller). Secret values are never shown
(:func:`.errors.is_secret`). :func:`config_to_mapping` is the way back, to plain data.

Imports attrs and the config's errors and validation only.
"""

from __future__ import annotations

import difflib
from collections.abc import Callable, Collection, Iterable, Mapping
from typing import Any

from attrs import NOTHING, Attribute
from attrs import fields as attrs_fields

from adaptive_lb.config.errors import ConfigError, is_secret, type_name
from adaptive_lb.config.validation import convert, kind, nested_class, split_path

__all__ = ["MAX_ERRORS", "Check", "Structurer", "config_to_mapping", "structure"]

MAX_ERRORS = 100
"""Most errors listed in one :class:`ConfigError` (then a count of the rest)."""

Check = Callable[[Any], Iterable[tuple[str, str]]]
"""A check across keys of a built object: yields ``(key path, reason)`` per problem."""


def _key_text(key: Any) -> str:
    """A mapping key as YAML spells it (null, true), for key paths."""
    if key is None:
        return "null"
    if isinstance(key, bool):
        return "true" if key else "false"
    return str(key)


def _join(path: str, place: str) -> str:
    return f"{path}.{place}" if path and not place.startswith("[") else f"{path}{place}"


class Structurer:
    """Turns plain YAML data into attrs classes, collecting every error.

    ``lines`` maps key paths (``a.b``, ``a[0].b``) to line numbers for the messages;
    ``secret_keys`` are the key paths whose values (and keys below) are secret."""

    def __init__(self, lines: Mapping[str, int], secret_keys: Collection[str] = ()) -> None:
        self.errors: list[str] = []
        self.count = 0
        self.lines = lines
        self.secret_keys = secret_keys

    def error(self, path: str, message: str, *, line_of: str | None = None) -> None:
        """Record ``path: message (line N)``, N the line of ``line_of`` (default ``path``)."""
        self.count += 1
        if self.count <= MAX_ERRORS:
            line = self.lines.get(path if line_of is None else line_of)
            where = f" (line {line})" if line is not None else ""
            self.errors.append(f"{path}: {message}{where}")

    def report(self) -> list[str]:
        """The errors, the ones over :data:`MAX_ERRORS` counted in a last entry."""
        more = self.count - len(self.errors)
        return self.errors + ([f"... and {more} more"] if more > 0 else [])

    def build(self, cls: type, data: Any, path: str) -> Any:
        """An instance of ``cls`` from ``data``, or None after recording the errors."""
        if data is None:  # `policy:` with nothing under it: all defaults
            data = {}
        if not isinstance(data, Mapping):
            self.error(path or "<top level>", f"must be a mapping, got {type_name(data)}")
            return None
        known = {a.name: a for a in attrs_fields(cls)}
        values: dict[str, Any] = {}
        ok = True
        for key, raw in data.items():
            key_path = _join(path, _key_text(key))
            attribute = known.get(key) if isinstance(key, str) else None
            removed = getattr(cls, "REMOVED", {}).get(key) if isinstance(key, str) else None
            if attribute is None and removed is not None:
                self.error(key_path, removed)
                ok = False
                continue
            if attribute is None:
                # Only for a listed error; no name is close to a key over 51 characters.
                listed = self.count < MAX_ERRORS
                close = listed and difflib.get_close_matches(str(key)[:60], list(known), 1, 0.6)
                hint = f"; did you mean '{close[0]}'?" if close else ""
                valid = ", ".join(sorted(known))
                self.error(key_path, f"unknown key{hint} (valid keys: {valid})")
                ok = False
                continue
            converted, good = self.value(attribute, raw, key_path)
            if good:
                values[key] = converted
            ok = ok and good
        for name, attribute in known.items():
            if attribute.default is NOTHING and name not in data:
                self.error(_join(path, name), "required", line_of=path)
                ok = False
        if not ok:
            return None
        try:
            return cls(**values)
        except (TypeError, ValueError) as exc:  # checks across fields (__attrs_post_init__)
            place, reason = split_path(str(exc), known)
            self.error(_join(path, place) if place else path or "<top level>", reason)
            return None

    def value(self, attribute: Attribute, raw: Any, path: str) -> tuple[Any, bool]:
        """(converted value, True), or (None, False) after recording the error."""
        nested = nested_class(attribute)
        if nested is not None:
            built = self.build(nested, raw, path)
            return built, built is not None
        item_class = attribute.metadata.get("list_of")
        if item_class is not None:
            return self.items(item_class, raw, path)
        try:
            value = convert(kind(attribute), raw)
            if attribute.validator is not None:
                attribute.validator(None, attribute, value)
        except (TypeError, ValueError) as exc:
            place, message = split_path(str(exc), (attribute.name,))
            if place is not None:  # the field's own name, or a place inside its value
                path = path[: len(path) - len(attribute.name)] + place
            if is_secret(path, self.secret_keys) and not message.endswith("hidden)"):
                # What is wrong, not the value.
                message = f"{message.partition(', got ')[0]}, got {type_name(raw)} (value hidden)"
            self.error(path, message)
            return None, False
        return value, True

    def items(self, cls: type, raw: Any, path: str) -> tuple[Any, bool]:
        """A list of ``cls`` instances, each built from an item of ``raw``."""
        if raw is None:
            return [], True
        if not isinstance(raw, list):
            self.error(path, f"must be a list, got {type_name(raw)}")
            return None, False
        built = [self.build(cls, item, f"{path}[{index}]") for index, item in enumerate(raw)]
        return built, all(item is not None for item in built)


def structure(
    cls: type,
    data: Any,
    source: str | None = None,
    *,
    lines: Mapping[str, int] | None = None,
    secret_keys: Collection[str] = (),
    check: Check | None = None,
) -> Any:
    """An instance of attrs class ``cls`` from plain data (``None``: the defaults), checked
    by ``check`` too; every problem is reported at once in one :class:`ConfigError`."""
    structurer = Structurer(lines or {}, secret_keys)
    built = structurer.build(cls, data, "")
    if built is not None and check is not None:
        for path, reason in check(built):
            structurer.error(path, reason)
    if structurer.errors or built is None:
        raise ConfigError(
            structurer.report() or ["invalid configuration"],
            source=source,
            total=structurer.count or None,
        )
    return built


def config_to_mapping(settings: Any) -> dict[str, Any]:
    """Plain data (YAML- and JSON-able) with every value, defaults included; durations
    as numbers of seconds. Works on any settings object made of value fields and sections."""
    result: dict[str, Any] = {}
    for attribute in attrs_fields(type(settings)):
        value = getattr(settings, attribute.name)
        if nested_class(attribute) is not None:
            result[attribute.name] = config_to_mapping(value)
        elif attribute.metadata.get("duration") or str(attribute.type) == "float":
            # 4 and 4.0 are equal configs: one spelling, so one hash.
            result[attribute.name] = float(value)
        elif isinstance(value, Mapping):
            result[attribute.name] = dict(value)
        else:
            result[attribute.name] = value
    return result
