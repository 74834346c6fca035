"""What `watch`'s SOURCE arguments name, opened as sources (live/sources.py,
live/subscriber.py): `zmq://HOST:PORT` a subscriber, `-` stdin, a FILE read once or, with
`--follow`, followed. Refused before any is started: a source given twice, more replay
endpoints than zmq:// sources, a missing file, a directory, a zmq:// source without pyzmq."""

from __future__ import annotations

import os
import stat
import sys
import threading
from typing import IO, Any

from ..errors import UsageError
from .decode import Engine
from .sources import FollowSource, Sink, Source, StreamSource, is_step_log


def open_sources(
    names: list[str],
    sink: Sink,
    stop: threading.Event,
    *,
    replays: list[str],
    topic: str = "",
    engine: Engine = "auto",
    bind: bool = False,
    follow: bool = False,
    stdin: IO[bytes] | None = None,
) -> tuple[list[Source], list[str]]:
    """The sources (not started), and the FILEs read once that are step logs."""
    replays = list(replays)
    zmqs = [s for s in names if s.startswith(("zmq://", "tcp://"))]
    if len(replays) > len(zmqs):
        raise UsageError(
            f"{len(replays)} --replay-endpoint(s) for {len(zmqs)} zmq:// source(s)",
            hint="give one --replay-endpoint per zmq:// source, in the same order",
        )
    sources: list[Source] = []
    step_logs: list[str] = []
    seen = set()
    for s in names:
        if s in seen:
            raise UsageError(f"{s} is given twice")
        seen.add(s)
        if s.startswith(("zmq://", "tcp://")):
            try:
                import zmq  # noqa: F401
            except ImportError:
                raise UsageError(
                    "watching a zmq:// source needs pyzmq", hint="pip install 'pagedkv-sql[live]'"
                ) from None
            from .subscriber import ZmqSource

            replay = replays.pop(0) if replays else None
            sources.append(
                ZmqSource(s, sink, stop, replay=replay, topic=topic, engine=engine, bind=bind)
            )
        elif s == "-":
            stream = stdin if stdin is not None else sys.stdin.buffer
            sources.append(StreamSource("<stdin>", sink, stop, stream, engine))
        elif follow:
            if os.path.isdir(s):
                raise UsageError(
                    f"{s} is a directory, not a file to follow",
                    hint="give the log file itself (e.g. DIR/vllm-1234.jsonl); several files "
                    "are several sources",
                )
            sources.append(FollowSource(s, sink, stop, s))
        else:
            from .recorded import check_events

            if _is_step_log_file(check_events(s)):
                step_logs.append(s)
            sources.append(StreamSource(s, sink, stop, s, engine))
    return sources, step_logs


def _is_step_log_file(path: Any) -> bool:
    """A regular file's first bytes say it is a step log (a FIFO is never read ahead: its
    bytes are the source's)."""
    try:
        if not stat.S_ISREG(os.stat(path).st_mode):
            return False
        with open(path, "rb") as f:
            return is_step_log(f.read(256))
    except OSError:
        return False
