"""How every ``adaptive-lb`` command formats its help and its closing lines: imported by
the top-level CLI (:mod:`adaptive_lb.tools.cli`) and by each subcommand and benchmark, so that
none of them imports the CLI that imports them.

Imports the standard library only.
"""

from __future__ import annotations

import argparse
import textwrap
from collections.abc import Sequence
from pathlib import Path

__all__ = ["HelpFormatter", "doc_description", "format_written"]


class HelpFormatter(argparse.ArgumentDefaultsHelpFormatter):
    """The help formatter of every ``adaptive-lb`` parser: each option's help ends with
    ``(default: X)``; an option whose default is ``None`` (or whose help already says
    ``(default: ...)``) explains its default in its own words, e.g. ``(default: one per
    CPU)``. A description of one paragraph is wrapped to the terminal; one written on
    several lines (a module docstring with examples) is shown as written."""

    def _fill_text(self, text: str, width: int, indent: str) -> str:
        if "\n" in text.strip("\n"):
            return "".join(indent + line for line in text.splitlines(keepends=True))
        text = " ".join(text.split())
        return textwrap.fill(
            text, width, initial_indent=indent, subsequent_indent=indent, break_on_hyphens=False
        )

    def _split_lines(self, text: str, width: int) -> list[str]:
        # Never split names such as local-quorum or adaptive-lb-demo at their hyphens.
        return textwrap.wrap(" ".join(text.split()), width, break_on_hyphens=False)

    def _get_help_string(self, action: argparse.Action) -> str | None:
        text = action.help or ""
        if action.default is None or "(default" in text or "%(default)" in text:
            return action.help
        return super()._get_help_string(action)


def doc_description(doc: str | None) -> str:
    """A module's docstring as its command's description: all but the closing paragraph, which
    says what the module may import (for the code's readers, not the command's users)."""
    return (doc or "").strip().rsplit("\n\n", 1)[0] + "\n"


def format_written(paths: Sequence[Path | str]) -> str:
    """The closing listing of a command that writes files: ``wrote N file(s):`` and one
    indented path per line, in the order given."""
    lines = [f"wrote {len(paths)} file{'s' if len(paths) != 1 else ''}:"]
    lines.extend(f"  {path}" for path in paths)
    return "\n".join(lines)
