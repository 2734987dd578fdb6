"""The config file in and out: YAML text or file -> :class:`Config`, and back.

:func:`load_document` is the one way a settings document is read -- the config file here,
the simulator's scenario files too (:mod:`adaptive_lb.tools.sim.scenario`): hardened YAML
(:mod:`.safe_yaml`), then every problem at once with its key path and line
(:mod:`.structure`), duplicate keys first.

Imports PyYAML and the config's errors, model, safe_yaml and structure only.
"""

from __future__ import annotations

import functools
import operator
import os
from collections.abc import Collection, Mapping
from typing import Any

import yaml

from adaptive_lb.config.errors import ConfigError
from adaptive_lb.config.model import SECRET_KEYS, Config
from adaptive_lb.config.safe_yaml import parse_yaml, read_text
from adaptive_lb.config.structure import Check, config_to_mapping, structure

__all__ = [
    "ENV_VAR",
    "config_from_mapping",
    "dump_config",
    "load_config",
    "load_document",
    "parse_config",
]

ENV_VAR = "ADAPTIVE_LB_CONFIG"
"""Names the config file when :func:`load_config` is given none."""


def load_document(
    cls: type,
    text: str,
    source: str,
    *,
    secret_keys: Collection[str] = (),
    check: Check | None = None,
) -> Any:
    """An instance of settings class ``cls`` from a YAML document (an empty one gives the
    defaults), checked by ``check`` too; :class:`ConfigError` lists every problem."""
    data, lines, duplicates = parse_yaml(text, source, secret_keys)
    try:
        built = structure(cls, data, source, lines=lines, secret_keys=secret_keys, check=check)
    except ConfigError as exc:
        raise ConfigError(
            duplicates + exc.errors, source=source, total=len(duplicates) + exc.total
        ) from None
    if duplicates:
        raise ConfigError(duplicates, source=source)
    return built


def config_from_mapping(
    data: Any, source: str | None = None, *, lines: Mapping[str, int] | None = None
) -> Config:
    """Build a :class:`Config` from plain data (as YAML gives it: mappings, lists, scalars).
    ``None`` gives the defaults. Every problem is reported at once in one
    :class:`ConfigError`; ``lines`` maps key paths to line numbers for the messages."""
    return structure(Config, data, source, lines=lines, secret_keys=SECRET_KEYS)


def parse_config(text: str, source: str = "<string>") -> Config:
    """Parse a YAML document into a :class:`Config` (an empty document gives defaults).
    Only plain YAML is accepted (no tags that build Python objects)."""
    return load_document(Config, text, source, secret_keys=SECRET_KEYS)


def load_config(path: str | os.PathLike[str] | None = None) -> Config:
    """Load the config file at ``path``, or the one ``$ADAPTIVE_LB_CONFIG`` names, or the
    defaults when neither is given. Files over 1 MiB are refused before parsing."""
    if path is None:
        path = os.environ.get(ENV_VAR) or None
        if path is None:
            return Config()
    return parse_config(read_text(path), os.fspath(path))


def dump_config(config: Config, *, reveal_secrets: bool = False) -> str:
    """The config as YAML, secrets (:data:`SECRET_KEYS`: header values) written ``'***'``
    unless ``reveal_secrets`` (then it round-trips through :func:`parse_config`)."""
    data = config_to_mapping(config)
    for path in () if reveal_secrets else SECRET_KEYS:
        *parents, name = path.split(".")
        section = functools.reduce(operator.getitem, parents, data)
        value = section[name]  # a mapping keeps its keys (header names)
        section[name] = dict.fromkeys(value, "***") if isinstance(value, dict) else value and "***"
    text = yaml.safe_dump(data, sort_keys=False, allow_unicode=True)
    if yaml.safe_load(text) != data:
        # PyYAML mangles a few characters (NEL) when writing unicode as is; escaped, they
        # survive.
        text = yaml.safe_dump(data, sort_keys=False, allow_unicode=False)
    return text
