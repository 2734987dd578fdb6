"""``config/default.yaml``, generated: every key at its default, documented.

The file is written from the settings classes (:mod:`.model`), the one source of truth:
each key's comment is the docstring under its field, followed by its type, bounds and
choices (read from its validators); each section's comment is its class docstring;
durations are written with a unit. To change the file, change :mod:`.model` and run::

    adaptive-lb config default > config/default.yaml

``tests/unit/test_config.py`` fails when the committed file differs from
:func:`render_default_yaml`.

Imports attrs, PyYAML and the config's model, schema, validation and errors only.
"""

from __future__ import annotations

import textwrap
from typing import Any

import yaml
from attrs import Attribute
from attrs import fields as attrs_fields

from adaptive_lb.config.errors import show
from adaptive_lb.config.model import Config
from adaptive_lb.config.schema import field_docs
from adaptive_lb.config.validation import (
    DURATION_UNITS,
    kind,
    limits,
    nested_class,
    options,
    parse_duration,
)

__all__ = ["COMMAND", "render_default_yaml"]

COMMAND = "adaptive-lb config default > config/default.yaml"
"""How ``config/default.yaml`` is regenerated."""

_WIDTH = 96
"""Longest comment line."""

_HEADER = f"""\
adaptive-lb configuration: every key, at its default value.
Generated from adaptive_lb/config/model.py: edit the docstrings there, then run
`{COMMAND}`.
A key left out keeps its default; unknown or duplicate keys are errors. Sections may be empty.
Durations: a number of seconds, or a string with a unit: 500us, 250ms, 10s, 1.5s, 2m, 1h.
Integers: whole numbers (1.0e+4 is read as 10000; 8.5 is refused). Booleans: true / false.
Load it with adaptive_lb.config.load_config(PATH), or name it in $ADAPTIVE_LB_CONFIG.
Validate a file with `adaptive-lb config validate FILE`; see the effective config with
`adaptive-lb config show FILE`; a JSON Schema for editors: `adaptive-lb config schema`."""

_TYPES = {
    "bool": "Boolean",
    "int": "Integer",
    "float": "Number",
    "str": "String",
    "optional_str": "String or null",
    "str_map": "Mapping of names to strings",
    "duration": "Duration",
}


def render_default_yaml() -> str:
    """The text of ``config/default.yaml``: a header, then every section and key of
    :class:`Config` at its default, each with its documentation as a comment."""
    lines = [f"# {line}" if line else "#" for line in _HEADER.splitlines()]
    _section(Config(), "", lines)
    return "\n".join(lines) + "\n"


def _section(settings: Any, indent: str, lines: list[str]) -> None:
    cls: type = type(settings)
    docs = field_docs(cls)
    for attribute in attrs_fields(cls):
        value = getattr(settings, attribute.name)
        nested = nested_class(attribute)
        if nested is not None:
            if not indent:
                lines.append("")
            lines += _comment(nested.__doc__ or "", indent)
            lines.append(f"{indent}{attribute.name}:")
            _section(value, indent + "  ", lines)
            continue
        doc = docs.get(attribute.name, "")
        if attribute.metadata.get("secret"):
            doc += " Secret: no message shows the values, `adaptive-lb config show` masks them."
        lines += _comment(doc, indent, _constraints(attribute))
        lines.append(f"{indent}{attribute.name}: {_value(attribute, value)}")
    for name, reason in getattr(cls, "REMOVED", {}).items():
        lines += _comment(f"`{name}`: {reason} (a file that sets it is refused).", indent)


def _comment(text: str, indent: str, tail: str = "") -> list[str]:
    """``text`` (reStructuredText literals as `x`) and ``tail`` (kept on one line, if it
    fits) wrapped into comment lines."""
    words = text.replace("``", "`").split()
    if tail:
        words.append(tail.replace(" ", "\N{NO-BREAK SPACE}"))  # textwrap breaks only at ASCII
    prefix = f"{indent}# "
    wrapped = textwrap.wrap(
        " ".join(words),
        _WIDTH,
        initial_indent=prefix,
        subsequent_indent=prefix,
        break_on_hyphens=False,
        break_long_words=False,
    )
    return [line.replace("\N{NO-BREAK SPACE}", " ") for line in wrapped]


def _constraints(attribute: Attribute) -> str:
    """``Integer, 1..64.``, ``Duration, > 0, <= 1h.``, ``One of: grpc, http.``..."""
    field_kind = kind(attribute)
    choices = options(attribute)
    if choices is not None:
        return f"One of: {', '.join(choices)}."
    words = _TYPES[field_kind]
    bounds = dict(limits(attribute))
    shown = {k: _duration(b) if field_kind == "duration" else show(b) for k, b in bounds.items()}
    if set(bounds) == {">=", "<="}:
        words += f", {shown['>=']}..{shown['<=']}"
    elif len(bounds) == 1:
        ((relation, bound),) = shown.items()
        words += f" {relation} {bound}"
    elif bounds:
        words += "".join(f", {relation} {bound}" for relation, bound in shown.items())
    return words + "."


def _duration(seconds: float) -> str:
    """``seconds`` with the largest unit that writes it exactly (``10s``, ``200ms``)."""
    for unit, factor in sorted(DURATION_UNITS.items(), key=lambda item: -item[1]):
        count = round(seconds / factor, 3)
        text = f"{count:g}{unit}"
        if count >= 1 and "e" not in text and parse_duration(text) == seconds:
            return text
    return show(seconds)


def _value(attribute: Attribute, value: Any) -> str:
    """The YAML of a default value (a duration with its unit)."""
    if kind(attribute) == "duration":
        return _duration(float(value))
    text = yaml.safe_dump(value, default_flow_style=True, allow_unicode=True)
    return text.removesuffix("\n...\n").strip()
