"""A tiny progress bar on stderr (one line per step when stderr is not a terminal).

``adaptive-lb demo`` shows two in turn: one step per (scenario, policy) run, then one per
scenario plotted (titled ``plots``).

Imports the standard library only.
"""

from __future__ import annotations

import sys
import time
from typing import TextIO

__all__ = ["ProgressBar"]


class ProgressBar:
    """``[#####.....] 12/45 local-one/adaptive 8.1s``; with a ``title``, the line starts
    with it: ``plots [###.......] 1/9 local-one (2 PNGs) 0.8s``."""

    def __init__(
        self, total: int, *, stream: TextIO | None = None, width: int = 30, title: str = ""
    ) -> None:
        self.total = max(1, total)
        self.title = title
        self.done = 0
        self.width = width
        self.stream = stream if stream is not None else sys.stderr
        self.started = time.perf_counter()
        self._tty = bool(getattr(self.stream, "isatty", lambda: False)())
        self._last_len = 0

    def step(self, label: str = "") -> None:
        """One more unit done."""
        self.done += 1
        filled = round(self.width * self.done / self.total)
        elapsed = time.perf_counter() - self.started
        prefix = f"{self.title} " if self.title else ""
        text = (
            f"{prefix}[{'#' * filled}{'.' * (self.width - filled)}] {self.done}/{self.total} "
            f"{label} {elapsed:.1f}s"
        )
        if self._tty:
            pad = " " * max(0, self._last_len - len(text))
            self.stream.write("\r" + text + pad)
            self._last_len = len(text)
            if self.done >= self.total:
                self.stream.write("\n")
        else:
            self.stream.write(text + "\n")
        self.stream.flush()
