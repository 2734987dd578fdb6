"""Hardened YAML: a settings file -> plain data, the line of every key, its duplicate keys.

Any input of at most :data:`MAX_CONFIG_BYTES` is accepted or refused quickly and safely:
only plain YAML values (no tag builds a Python object), nesting, values and merge-key copies
bounded (:data:`MAX_NESTING`, :data:`MAX_NODES`: alias and merge-key bombs), long integers
and ``%`` directives refused before they cost quadratic time, duplicate keys reported (PyYAML
silently keeps the last). No message quotes the document (it may hold a secret): a line, a
column and the problem. Used for the config file and for the simulator's scenario files.

What a document means and why it is refused are decided here, not by the PyYAML installed:
merge keys (``<<``) follow the YAML merge-key rule whatever PyYAML does with them
(:meth:`_Rules.flatten_mapping`), and a document libyaml refuses as too deep gets our message
at our position. ``tests/unit/test_safe_yaml.py`` runs on both of PyYAML's parsers.

Imports PyYAML and the config's errors only.
"""

from __future__ import annotations

import os
import re
from collections.abc import Collection
from typing import Any

import yaml

from adaptive_lb.config.errors import ConfigError, is_secret, type_name

__all__ = ["MAX_CONFIG_BYTES", "MAX_NESTING", "MAX_NODES", "parse_yaml", "read_text"]

MAX_CONFIG_BYTES = 1024 * 1024
"""Config files larger than this are refused before parsing."""

MAX_NESTING = 16
"""Deepest nesting of values in a config file, counting the top mapping (a real file needs 4)."""

MAX_NODES = 10_000
"""Most values (scalars, mappings, lists) in a config file (the full file has about 70), each
key a merge key (``<<``) copies counted too (20 nested ``<<: [*a, *a]`` copy a million)."""


def read_text(path: str | os.PathLike[str]) -> str:
    """The text of a settings file; :class:`ConfigError` (its ``source`` the path) when it
    cannot be read, is over :data:`MAX_CONFIG_BYTES` (refused before reading) or not UTF-8."""
    source = os.fspath(path)
    try:
        size = os.path.getsize(source)
        if size > MAX_CONFIG_BYTES:
            raise ConfigError(
                f"file is {size} bytes, more than {MAX_CONFIG_BYTES // 1024} KiB: "
                "not a config file?",
                source=source,
            )
        with open(source, "rb") as handle:
            # Bounded even if the file grew since the stat (or is a device).
            raw = handle.read(MAX_CONFIG_BYTES + 1)
    except OSError as exc:
        raise ConfigError(f"cannot read: {exc.strerror or exc}", source=source) from None
    if len(raw) > MAX_CONFIG_BYTES:
        raise ConfigError(
            f"file is more than {MAX_CONFIG_BYTES // 1024} KiB: not a config file?", source=source
        )
    try:
        return raw.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise ConfigError(f"not UTF-8 text: {exc}", source=source) from None


def parse_yaml(
    text: str, source: str, secret_keys: Collection[str] = ()
) -> tuple[Any, dict[str, int], list[str]]:
    """``(data, lines, duplicates)`` of a YAML document: the plain data (None for an empty
    document), the line (1-based) of every key path (``a.b``, list items ``a[0]``) and the
    duplicate keys, one message each. Raises :class:`ConfigError` for anything that is not
    a plain YAML document within the limits. Keys under ``secret_keys`` (and secret-like
    keys) are not looked into, so that no message names them."""
    if not isinstance(text, str):
        raise ConfigError(f"expected text, got {type_name(text)}", source=source)
    # len(text) <= its UTF-8 size, so the cheap test settles most cases.
    if len(text) > MAX_CONFIG_BYTES or len(text.encode("utf-8", "surrogatepass")) > (
        MAX_CONFIG_BYTES
    ):
        raise ConfigError(
            f"larger than {MAX_CONFIG_BYTES // 1024} KiB: not a config file?", source=source
        )
    if text.count("\n%") + text.count("\r%") > 1000:  # libyaml reads %TAG in quadratic time
        problem = "more than 1000 directives (lines starting with %)"
        raise ConfigError(f"{problem}: not a config file?", source=source)
    try:
        try:
            return _load(_SafeLoader, text, secret_keys)
        except yaml.YAMLError as exc:
            if getattr(exc, "problem", None) != LIBYAML_TOO_DEEP:
                raise
        # Deeper than libyaml's bound, so deeper than ours: where it passes ours, and the
        # same message as where libyaml has no such bound. Our parser stops there, having
        # read at most 1 KiB beyond.
        return _load(_PurePythonLoader, text, secret_keys)
    except yaml.YAMLError as exc:
        raise ConfigError(_yaml_error(exc), source=source) from None
    except (ValueError, TypeError, RecursionError) as exc:  # deeper than the stack allows?
        raise ConfigError(f"not valid YAML ({type(exc).__name__})", source=source) from None


def _load(
    loader_class: Any, text: str, secret_keys: Collection[str]
) -> tuple[Any, dict[str, int], list[str]]:
    """:func:`parse_yaml` with one loader, YAML errors raised as they are."""
    loader = None
    try:
        loader = loader_class(text)  # already checks for unprintable characters
        node = loader.get_single_node()
        # Before merges are flattened into the nodes.
        lines, duplicates = _scan_keys(node, secret_keys)
        data = loader.construct_document(node) if node is not None else None
    finally:
        if loader is not None:
            loader.dispose()
    return data, lines, duplicates


def _scan_keys(
    root: yaml.Node | None, secret_keys: Collection[str]
) -> tuple[dict[str, int], list[str]]:
    """Line (1-based) of every key path in a composed YAML document, and the duplicate
    keys found (PyYAML silently keeps the last of duplicates; we refuse them)."""
    lines: dict[str, int] = {}
    duplicates: list[str] = []
    seen: set[int] = set()  # aliases may share nodes: visit each once (no alias bombs)

    def walk(node: yaml.Node, path: str) -> None:
        if id(node) in seen:
            return
        if isinstance(node, yaml.SequenceNode):
            seen.add(id(node))
            for index, item in enumerate(node.value):
                lines.setdefault(f"{path}[{index}]", item.start_mark.line + 1)
                walk(item, f"{path}[{index}]")
            return
        if not isinstance(node, yaml.MappingNode):
            return
        seen.add(id(node))
        here: dict[str, int] = {}
        for key_node, value_node in node.value:
            if not isinstance(key_node, yaml.ScalarNode):
                continue
            key = key_node.value
            key_path = f"{path}.{key}" if path else key
            line = key_node.start_mark.line + 1
            if key in here:
                # Two merge keys too: PyYAML 6.0.4 lets the first win, earlier ones the last.
                duplicates.append(
                    f"{key_path}: duplicate key (line {line}, first on line {here[key]})"
                )
            else:
                here[key] = line
                if key_node.tag == MERGE_TAG:
                    continue  # merged keys are found where the merged mapping is written
                lines[key_path] = line
            if not is_secret(key_path, secret_keys) or key_path in secret_keys:
                walk(value_node, key_path)  # no keys of a secret

    if root is not None:
        walk(root, "")
    return lines, duplicates


class _LimitError(yaml.MarkedYAMLError):
    """A document refused by our rules (over a limit, or a value PyYAML cannot build)."""


MERGE_TAG = "tag:yaml.org,2002:merge"
_VALUE_TAG = "tag:yaml.org,2002:value"  # the `=` key, a plain string in a config file


class _Rules:
    """Our rules over PyYAML's composer and safe constructor, whichever parser reads the
    text: the depth and size bounds, and merge keys decided here rather than by PyYAML
    (whose merge semantics changed in 6.0.4, see :meth:`flatten_mapping`)."""

    def _start_rules(self) -> None:
        self._depth = self._nodes = 0
        self._flattening: set[Any] = set()  # mappings being flattened (merged into)

    def compose_node(self, parent: Any, index: Any) -> Any:
        self._depth += 1
        self._nodes += 1
        try:
            problem = None
            if self._depth > MAX_NESTING:
                problem = f"nested deeper than {MAX_NESTING} levels"
            elif self._nodes > MAX_NODES:
                problem = f"more than {MAX_NODES} values: not a config file?"
            if problem is not None:
                event = self.peek_event()  # type: ignore[attr-defined]
                raise _LimitError(None, None, problem, event.start_mark if event else None)
            return super().compose_node(parent, index)  # type: ignore[misc]
        finally:
            self._depth -= 1

    def flatten_mapping(self, node: yaml.MappingNode) -> None:
        """Replace the merge keys (``<<``) of ``node`` by the pairs they merge, by the YAML
        merge-key rule (yaml.org/type/merge.html): a key written in the mapping beats a
        merged one, and of the mappings in a merge sequence the earlier beats the later.
        ``<<: [{a: 1}, {a: 2}]`` gives ``a: 1`` on every PyYAML (6.0.4 made it 2).

        The pairs are placed lowest priority first (the constructor keeps the last of equal
        keys); every merged pair is counted against :data:`MAX_NODES` before it is copied,
        so that nested merges (each copying the one below twice) are refused, not built. A
        mapping that merges itself, or a mapping around it, adds nothing the second time."""
        if node in self._flattening:
            return
        if len(self._flattening) >= MAX_NESTING:
            problem = f"merge keys (<<) nested deeper than {MAX_NESTING} levels"
            raise _LimitError(None, None, problem, node.start_mark)
        self._flattening.add(node)
        try:
            written: list[tuple[yaml.Node, yaml.Node]] = []
            merged: list[yaml.MappingNode] = []  # highest priority first
            for key, value in node.value:
                if key.tag != MERGE_TAG:
                    if key.tag == _VALUE_TAG:
                        key.tag = "tag:yaml.org,2002:str"
                    written.append((key, value))
                    continue
                for mapping in self._merge_sources(node, value):
                    if mapping in self._flattening:
                        continue
                    self.flatten_mapping(mapping)
                    self._nodes += len(mapping.value)
                    if self._nodes > MAX_NODES:
                        problem = f"merge keys (<<) make more than {MAX_NODES} values"
                        problem += ": not a config file?"
                        raise _LimitError(None, None, problem, key.start_mark)
                    merged.append(mapping)
            if len(written) < len(node.value):
                pairs = [pair for mapping in reversed(merged) for pair in mapping.value]
                node.value = pairs + written
        finally:
            self._flattening.discard(node)

    @staticmethod
    def _merge_sources(node: yaml.MappingNode, value: yaml.Node) -> list[yaml.MappingNode]:
        """The mappings a merge key's ``value`` names, in the order written."""
        sources = value.value if isinstance(value, yaml.SequenceNode) else [value]
        for source in sources:
            if not isinstance(source, yaml.MappingNode):
                raise yaml.constructor.ConstructorError(
                    "while constructing a mapping",
                    node.start_mark,
                    "expected a mapping or list of mappings for merging, but found "
                    + getattr(source, "id", "?"),
                    source.start_mark,
                )
        return sources  # type: ignore[return-value]

    def construct_object(self, node: Any, deep: bool = False) -> Any:
        # CPython converts long integers in quadratic time (hex, sexagesimal).
        if node.tag == "tag:yaml.org,2002:int" and len(node.value) > 1000:
            problem = "integer too long (over 1000 characters)"
            raise _LimitError(None, None, problem, node.start_mark)
        try:
            return super().construct_object(node, deep)  # type: ignore[misc]
        except (ArithmeticError, AttributeError, LookupError, TypeError, ValueError):
            # PyYAML quotes the value (!!int x: ValueError) or fails (!!bool x: KeyError).
            problem = f"not a valid !!{node.tag.rpartition(':')[2]} (value hidden)"
            raise _LimitError(None, None, problem, node.start_mark) from None


class _PurePythonLoader(_Rules, yaml.SafeLoader):
    """Our rules over PyYAML's own parser (about 1 s per MiB): where libyaml is missing,
    and to find where a document libyaml refused as too deep passes our bound."""

    def __init__(self, stream: str) -> None:
        yaml.SafeLoader.__init__(self, stream)
        self._start_rules()


# libyaml's parser reads 1 MiB in milliseconds. (yaml.cyaml imports CParser from this
# extension module, which exists only when PyYAML was built with libyaml;
# tests/reliability/test_hostile_config.py fails if it is not used.)
_Parser: Any
try:
    from yaml._yaml import CParser as _Parser
except ImportError:  # pragma: no cover - PyYAML built without libyaml
    _Parser = None

_SafeLoader: Any = _PurePythonLoader
if _Parser is not None:
    _BASES = (yaml.composer.Composer, yaml.constructor.SafeConstructor, yaml.resolver.Resolver)

    class _LibyamlLoader(_Rules, _Parser, *_BASES):  # type: ignore[misc]
        """Our rules over libyaml's parser."""

        get_single_node = yaml.composer.Composer.get_single_node  # not libyaml's: it counts

        def __init__(self, stream: str) -> None:
            _Parser.__init__(self, stream)
            for base in _BASES:
                base.__init__(self)
            self._start_rules()

    _SafeLoader = _LibyamlLoader

LIBYAML_TOO_DEEP = "exceeded maximum nesting depth"
"""libyaml's own nesting bound (0.2.6, bundled since PyYAML 6.0.4: 1,000 levels, checked
while scanning ahead, before our composer sees a node)."""


def _yaml_error(exc: yaml.YAMLError) -> str:
    """Line, column, problem: no source snippet, no quoted alias name or tag (user text)."""
    mark = getattr(exc, "problem_mark", None) or getattr(exc, "context_mark", None)
    where = f"line {mark.line + 1}, column {mark.column + 1}: " if mark else ""
    problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
    if problem.startswith("but ") and getattr(exc, "context", None):
        problem = f"{exc.context}, {problem}"  # type: ignore[attr-defined]
    if isinstance(exc, (yaml.composer.ComposerError, yaml.constructor.ConstructorError)):
        problem = re.sub(r"""\s*('.*'|".*")""", "", problem, flags=re.DOTALL)
    if isinstance(exc, _LimitError):
        return f"{where}{problem}"
    if isinstance(exc, yaml.constructor.ConstructorError):
        return f"{where}{problem} (only plain YAML values are accepted)"
    return f"not valid YAML: {where}{problem}"
