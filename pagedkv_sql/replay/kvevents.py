"""Prefix-cache events, the recorded-file API (docs/replay.md, "Prefix-cache events").

The decoding and the checks live in `pagedkv_sql.live`, shared with `watch`:
every layout (vLLM and SGLang msgpack, TensorRT-LLM JSON, Dynamo JSON Lines), streaming,
state bounded by the cache. This module keeps the older call shape: `read_kv_events(path)`
lists the events of a file, `check_kv_events(events)` checks them.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import IO, Any

from ..errors import InputError, UsageError
from ..live.checker import CHECKS, Checker, KVFinding
from ..live.decode import Batch, Engine, batches

__all__ = ["CHECKS", "KVEvent", "KVFinding", "KVReport", "check_kv_events", "read_kv_events"]


@dataclass(frozen=True)
class KVEvent:
    position: int  # 0-based, in the order read
    where: str  # file:line (JSON) or file@byte offset (msgpack)
    stream: str  # worker / data-parallel rank the sequence numbers belong to
    seq: int | None
    kind: str  # stored, removed, cleared, updated, created
    hashes: tuple[Any, ...]
    parent: Any
    medium: str | None
    group: int | None
    batch: Batch


@dataclass(frozen=True)
class KVReport:
    events: int
    stored: int
    removed: int
    cleared: int
    findings: list[KVFinding]

    @property
    def ok(self) -> bool:
        return not self.findings

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["findings"] = [f.to_dict() for f in self.findings]
        return d


def open_events(path: str | os.PathLike[str]) -> IO[bytes]:
    """A recorded stream opened for reading: a file, a FIFO, or `-` for stdin."""
    import sys

    if str(path) == "-":
        return sys.stdin.buffer
    p = check_events(path)
    try:
        return p.open("rb")
    except OSError as e:
        raise InputError(f"cannot read {p}: {e.strerror}") from None


def check_events(path: str | os.PathLike[str]) -> Path:
    """The path of a recorded stream, refused now if it is missing or a directory."""
    p = Path(path)
    try:
        mode = p.stat().st_mode
    except OSError:
        raise InputError(f"no KV event file at {p}") from None
    if stat.S_ISDIR(mode):
        raise InputError(f"{p} is a directory, not a KV event file")
    return p


def iter_batches(path: str | os.PathLike[str], engine: Engine = "auto") -> Iterator[Batch]:
    source = "<stdin>" if str(path) == "-" else str(path)
    stream = open_events(path)
    try:
        yield from batches(stream, source, engine)
    finally:
        if str(path) != "-":
            stream.close()


def read_kv_events(path: str | os.PathLike[str], engine: Engine = "auto") -> list[KVEvent]:
    """Every event of a recorded stream, in order; an unreadable stream is refused whole."""
    if engine not in ("auto", "vllm", "sglang"):
        raise UsageError(f"unknown engine {engine!r} (auto, vllm, sglang)")
    out: list[KVEvent] = []
    for b in iter_batches(path, engine):
        for e in b.events:
            out.append(
                KVEvent(
                    len(out),
                    b.where,
                    b.stream,
                    b.seq,
                    e.kind,
                    tuple(e.hashes),
                    e.parent,
                    e.medium,
                    e.group,
                    b,
                )
            )
    return out


def check_kv_events(events: list[KVEvent], source: str = "") -> KVReport:
    """Check listed events (batch by batch, as they were read); every finding is kept."""
    findings: list[KVFinding] = []
    checker = Checker(findings.append)
    last: Batch | None = None
    for e in events:
        if e.batch is not last:
            checker.feed(source, e.batch)
            last = e.batch
    c = checker.counts
    return KVReport(checker.events, c["stored"], c["removed"], c["cleared"], findings)
