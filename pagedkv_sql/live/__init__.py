"""KV-cache event streams, recorded or live: every engine's layout decoded, checked
incrementally, stored in `engine_kv_event` (docs/replay.md, "Prefix-cache events").

The doors, loaded on first use (PEP 562: msgspec, the `events` extra, is imported only
then):

- `check_stream(stream, source, db=...)`: a recorded stream checked as it is read; with a
  Database, its events stored too, all or nothing (`pagedkv-sql kv-events`);
- `read_kv_events(path)` and `check_kv_events(events)`: a recorded file as a list of
  events, and such a list checked;
- `Watch(options, out, err, db=...).run()`: running engines followed, each finding written
  at once (`pagedkv-sql watch`).

A check gives a `KVReport`, a watch a `WatchSummary`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ..lazy import attribute

if TYPE_CHECKING:
    from .checker import KVFinding
    from .recorded import (
        KVEvent,
        KVReport,
        check_kv_events,
        check_stream,
        open_events,
        read_kv_events,
    )
    from .watch import Watch, WatchOptions, WatchSummary

# each door -> the module that defines it
_LAZY = {
    "KVFinding": "checker",
    **dict.fromkeys(
        [
            "KVEvent",
            "KVReport",
            "check_kv_events",
            "check_stream",
            "open_events",
            "read_kv_events",
        ],
        "recorded",
    ),
    **dict.fromkeys(["Watch", "WatchOptions", "WatchSummary"], "watch"),
}


def __getattr__(name: str) -> Any:
    return attribute(__name__, _LAZY, name)


__all__ = [
    "KVEvent",
    "KVFinding",
    "KVReport",
    "Watch",
    "WatchOptions",
    "WatchSummary",
    "check_kv_events",
    "check_stream",
    "open_events",
    "read_kv_events",
]
