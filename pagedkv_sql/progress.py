"""A plain progress bar for a terminal: one labelled line, redrawn in place, that never
goes backwards, and erased when the work is done."""

from __future__ import annotations

import time
from typing import TextIO

WIDTH = 30


class Bar:
    """``with Bar("loading", sys.stderr) as bar: bar.update(percent)``; a percentage
    below the one shown (a new statement started) leaves the bar where it is."""

    def __init__(self, label: str, stream: TextIO) -> None:
        self.label = label
        self.stream = stream
        self.done = 0.0
        self.start = time.monotonic()
        self.drawn = False

    def __enter__(self) -> Bar:
        self.start = time.monotonic()
        self.draw()
        return self

    def __exit__(self, *exc: object) -> None:
        if self.drawn:
            self.stream.write("\r\x1b[2K")
            self.stream.flush()

    def update(self, percent: float) -> None:
        """Show ``percent`` if it is further than what is shown (negative: unknown)."""
        if percent > self.done:
            self.done = min(percent, 100.0)
        self.draw()

    def draw(self) -> None:
        filled = int(WIDTH * self.done / 100)
        elapsed = time.monotonic() - self.start
        bar = "#" * filled + "." * (WIDTH - filled)
        self.stream.write(f"\r{self.label} [{bar}] {self.done:3.0f}% {elapsed:.1f}s")
        self.stream.flush()
        self.drawn = True
