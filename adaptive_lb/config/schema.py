"""A JSON Schema (draft 2020-12) of the config file, generated from the settings classes,
and :func:`field_docs`, the documentation written under each field (read from the source,
so that the docstrings are the one place a key is described).

Imports attrs and the config's model, structure and validation only.
"""

from __future__ import annotations

import ast
import functools
import inspect
import itertools
import textwrap
from typing import Any

from attrs import Attribute
from attrs import fields as attrs_fields

from adaptive_lb.config.model import Config
from adaptive_lb.config.structure import config_to_mapping
from adaptive_lb.config.validation import DURATION_RE, kind, limits, nested_class, options

__all__ = ["DURATION_HELP", "field_docs", "json_schema"]

DURATION_HELP = "Duration: seconds, or a string such as 250ms, 10s, 2m, 500us."
"""What a duration field's description adds."""

_KEYWORDS = {">": "exclusiveMinimum", ">=": "minimum", "<=": "maximum"}


@functools.cache
def field_docs(cls: type) -> dict[str, str]:
    """The docstrings written under each field of an attrs class, white space folded
    (empty when the source is not available, e.g. in a zipped install)."""
    try:
        tree = ast.parse(textwrap.dedent(inspect.getsource(cls)))
    except (OSError, TypeError, SyntaxError):
        return {}
    docs: dict[str, str] = {}
    body = tree.body[0].body if tree.body and isinstance(tree.body[0], ast.ClassDef) else []
    for statement, following in itertools.pairwise(body):
        if (
            isinstance(statement, ast.AnnAssign)
            and isinstance(statement.target, ast.Name)
            and isinstance(following, ast.Expr)
            and isinstance(following.value, ast.Constant)
            and isinstance(following.value.value, str)
        ):
            docs[statement.target.id] = " ".join(following.value.value.split())
    return docs


def _value_schema(attribute: Attribute) -> dict[str, Any]:
    bounds = {_KEYWORDS[k]: bound for k, bound in limits(attribute)}
    field_kind = kind(attribute)
    if field_kind == "duration":
        return {
            "anyOf": [
                {"type": "number", **bounds},
                {"type": "string", "pattern": DURATION_RE.pattern},
            ]
        }
    kinds: dict[str, dict[str, Any]] = {
        "bool": {"type": "boolean"},
        "int": {"type": "integer"},
        "float": {"type": "number"},
        "str": {"type": "string"},
        "optional_str": {"type": ["string", "null"]},
        "str_map": {"type": ["object", "null"], "additionalProperties": {"type": "string"}},
    }
    schema = kinds[field_kind]
    schema.update(bounds)
    choices = options(attribute)
    if choices is not None:
        schema["enum"] = list(choices)
    return schema


def _object_schema(cls: type) -> dict[str, Any]:
    docs = field_docs(cls)
    defaults = config_to_mapping(cls())
    properties: dict[str, Any] = {}
    for attribute in attrs_fields(cls):
        nested = nested_class(attribute)
        if nested is not None:
            schema = _object_schema(nested)
        else:
            schema = _value_schema(attribute)
            schema["default"] = defaults[attribute.name]
        description = docs.get(attribute.name)
        if attribute.metadata.get("duration"):
            description = f"{description} {DURATION_HELP}" if description else DURATION_HELP
        if description and "description" not in schema:
            schema["description"] = description
        properties[attribute.name] = schema
    schema = {
        # null: a section written with nothing under it (all defaults).
        "type": ["object", "null"],
        "properties": properties,
        "additionalProperties": False,
    }
    if cls.__doc__:
        schema["description"] = " ".join(cls.__doc__.split())
    return schema


def json_schema() -> dict[str, Any]:
    """A JSON Schema (draft 2020-12) of the config file, generated from the attrs classes:
    types, defaults, bounds, enums and descriptions; unknown keys are not allowed."""
    return {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "title": "adaptive-lb configuration",
        **_object_schema(Config),
    }
