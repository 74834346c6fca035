"""A growing step log checked as it grows (`watch --follow LOG`).

Every replay invariant (docs/replay.md) is checked by the replay engine itself over the log
read so far, in a scratch in-memory database, each time complete lines have arrived; only
findings not reported before are new. A step's findings depend only on the steps up to it,
so a finding, once reported, stays. The cost of a check grows with the log: checks are
spaced by at least twice the time the last one took (docs/decisions.md).
"""

from __future__ import annotations

import io
import time
from dataclasses import dataclass, field
from typing import Any

from ..errors import PagedKVError

MIN_INTERVAL_S = 0.05


@dataclass
class StepFinding:
    source: str
    invariant: str
    step: int
    event: int
    request: str | None
    block_id: int | None
    message: str

    def to_dict(self) -> dict[str, Any]:
        return {
            "check": self.invariant,
            "source": self.source,
            "step": self.step,
            "event": self.event,
            "request": self.request,
            "block_id": self.block_id,
            "message": self.message,
        }


@dataclass
class StepLog:
    source: str
    lines: list[bytes] = field(default_factory=list)
    checked_lines: int = 0
    seen: set[tuple[Any, ...]] = field(default_factory=set)
    next_check: float = 0.0
    broken: str | None = None  # the reason checking stopped (a malformed line)
    mark: str | None = None  # a recorder's mark (a gap, a stop): where checking ends
    mark_said: bool = False
    steps: int = 0
    findings: int = 0
    counts: dict[str, int] = field(default_factory=dict)

    def add(self, line: bytes) -> None:
        if line.strip():
            self.lines.append(line)

    def due(self, now: float) -> bool:
        return (
            self.broken is None and len(self.lines) > self.checked_lines and now >= self.next_check
        )

    def data(self) -> bytes:
        return b"\n".join(self.lines) + b"\n"

    def check(self) -> list[StepFinding]:
        """Replay the log so far; the findings not reported before."""
        from ..database import connect
        from ..replay import run

        started = time.monotonic()
        self.checked_lines = len(self.lines)
        try:
            with connect(":memory:") as db:
                report = run(db, io.BytesIO(self.data()), keep_going=True, limit=None)
        except PagedKVError as e:
            self.broken = f"{e.message}" + (f" ({e.details[0]})" if e.details else "")
            return []
        finally:
            took = time.monotonic() - started
            self.next_check = time.monotonic() + max(MIN_INTERVAL_S, 2 * took)
        self.steps = report.steps
        if report.mark is not None:
            self.mark = report.mark.text()
        new: list[StepFinding] = []
        for f in report.findings:
            key = (f.check, f.event, f.step, f.request, f.block_id)
            if key in self.seen:
                continue
            self.seen.add(key)
            self.counts[f.check] = self.counts.get(f.check, 0) + 1
            new.append(
                StepFinding(self.source, f.check, f.step, f.event, f.request, f.block_id, f.message)
            )
        self.findings += len(new)
        return new
