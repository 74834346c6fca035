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

import importlib as _importlib
from typing import TYPE_CHECKING, Any

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
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(_importlib.import_module(f".{module}", __name__), name)


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
