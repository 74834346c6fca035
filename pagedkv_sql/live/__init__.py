"""Live and recorded KV-cache event streams: decoding every engine's layout,
checking incrementally, recording into `engine_kv_event`, and `watch`'s sources.

`kv-events` and `watch` share this machinery: `check_stream` reads a recorded stream;
`watch.Watch` follows live sources (ZMQ, stdin, files, a growing step log).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import IO, TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .checker import KVFinding
    from .decode import Engine

__all__ = ["KVReport", "check_stream"]  # msgspec is imported when a stream is checked


@dataclass
class KVReport:
    events: int
    batches: int
    counts: dict[str, int]
    findings_by_check: dict[str, int]
    findings: list[KVFinding] = field(default_factory=list)  # the first `keep` of them
    rows: int = 0  # rows written to engine_kv_event

    @property
    def total(self) -> int:
        return sum(self.findings_by_check.values())

    @property
    def ok(self) -> bool:
        return self.total == 0

    def to_dict(self) -> dict[str, Any]:
        return {
            "events": self.events,
            "batches": self.batches,
            **self.counts,
            "findings_by_check": self.findings_by_check,
            "total_findings": self.total,
            "findings": [f.to_dict() for f in self.findings],
        }


def check_stream(
    stream: IO[bytes],
    source: str,
    *,
    engine: Engine = "auto",
    con: Any = None,
    keep: int | None = 1000,
    on_finding: Callable[[KVFinding], None] | None = None,
) -> KVReport:
    """Check a recorded stream (JSON or msgpack, told by content); with `con`, append its
    events to `engine_kv_event` (the caller's transaction: a refused stream stores nothing).
    Memory is bounded by the cache the events describe, not by the stream's length."""
    from .checker import Checker
    from .decode import batches

    kept: list[KVFinding] = []

    def found(f: KVFinding) -> None:
        if keep is None or len(kept) < keep:
            kept.append(f)
        if on_finding is not None:
            on_finding(f)

    checker = Checker(found)
    recorder = None
    if con is not None:
        from .store import Recorder

        recorder = Recorder(con)
    for b in batches(stream, source, engine):
        if recorder is not None:
            recorder.add(source, b, checker.events)
        checker.feed(source, b)
    if recorder is not None:
        recorder.flush()
    return KVReport(
        checker.events,
        checker.batches,
        dict(checker.counts),
        dict(checker.findings),
        kept,
        recorder.rows if recorder is not None else 0,
    )
