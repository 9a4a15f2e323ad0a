"""Progress on long grading runs: one line per lab, redrawn in place on a terminal.

Written to stderr, so stdout stays the grade (tables, TODOs) and CI logs stay readable: where
stderr is not a terminal, each lab prints one line when it starts and one when it ends.
"""

from __future__ import annotations

import sys
import time
from typing import TextIO

BAR_WIDTH = 24


class Progress:
    """Receives :mod:`reference.grader.runner` events and draws them."""

    def __init__(self, stream: TextIO | None = None, *, live: bool | None = None) -> None:
        """Args:
            stream: where to draw (default stderr).
            live: redraw one line in place; default: when the stream is a terminal.
        """
        self.stream = stream or sys.stderr
        self.live = self.stream.isatty() if live is None else live
        self._started: dict[str, float] = {}

    def start(self, lab: str) -> None:
        """A lab's test process starts."""
        self._started[lab] = time.monotonic()
        if not self.live:
            self._write(f"grading {lab} ...\n")

    def update(self, lab: str, done: int, total: int) -> None:
        """``done`` of the lab's ``total`` tests have a result."""
        if not self.live:
            return
        total = max(total, done, 1)
        filled = BAR_WIDTH * done // total
        bar = "█" * filled + "·" * (BAR_WIDTH - filled)
        self._write(f"\r  {lab:<28} {bar} {done}/{total} {self._elapsed(lab)}\x1b[K")

    def end(self, lab: str, records: list) -> None:
        """A lab is graded: one summary line (``records``: its TestResults)."""
        passed = sum(r.passed for r in records)
        line = f"  {lab:<28} {passed}/{len(records)} passed in {self._elapsed(lab)}"
        self._write(("\r" + line + "\x1b[K\n") if self.live else (line + "\n"))

    def _elapsed(self, lab: str) -> str:
        return f"{time.monotonic() - self._started.get(lab, time.monotonic()):.1f}s"

    def _write(self, text: str) -> None:
        self.stream.write(text)
        self.stream.flush()
