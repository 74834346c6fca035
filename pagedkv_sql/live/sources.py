"""`watch`'s sources, each a thread handing what it reads to the watch.

- `ZmqSource` (live/subscriber.py): a SUB socket on an engine's KV-event publisher.
- `StreamSource`: a recorded stream from stdin or a file, read once; a step log's lines are
  numbered, and a last line without its newline is marked (cut off while written, if it
  cannot be read).
- `FollowSource`: a growing file, like `tail -F`: reopened when it is replaced (rotation),
  read from the start again when it shrinks or is rewritten (truncation, even when a longer
  write follows at once: the bytes before the offset read are checked before reading on);
  either starts a new log (`restart`). Only complete lines are read; a file that does not
  exist yet is waited for, said after `QUIET_NOTE_S`, and a problem if it never came.
"""

from __future__ import annotations

import os
import stat
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import IO, Any, Protocol

from ..errors import InputError, PagedKVError, UsageError
from ..limits import MAX_LINE_BYTES, LineTooLong, split_lines
from .decode import Batch, Engine, batches, json_batch, json_value
from .events import Malformed

POLL_MS = 50
QUIET_NOTE_S = 5.0  # a source that has read nothing yet is said after this
TAIL_BYTES = 4096  # the bytes before a followed file's offset, checked before reading on


class Sink(Protocol):
    def put(self, item: Item) -> None: ...


@dataclass(slots=True)
class Item:
    """What a source hands over: a batch, a step-log line, a problem, a note, or its end."""

    source: str
    kind: str  # batch, line, reset(-events), restart, problem, note, partial, end, error
    batch: Batch | None = None
    line: bytes | None = None
    message: str = ""
    received: float = 0.0
    error: PagedKVError | None = None
    number: int = 0  # a line's number in its file
    last: bool = False  # a line the source ended after, without a newline


class Source(threading.Thread):
    def __init__(self, name: str, out: Sink, stop: threading.Event) -> None:
        super().__init__(name=f"pagedkv-watch {name}", daemon=True)
        self.source = name
        self.out = out
        self.stop_event = stop

    def put(self, kind: str, **kw: Any) -> None:
        self.out.put(Item(self.source, kind, received=time.time(), **kw))

    def run(self) -> None:
        try:
            self.produce()
        except InputError as e:  # a stream that cannot be read on: a problem, not the end
            detail = f" ({e.details[0]})" if e.details else ""
            self.put("problem", message=f"{e.message}{detail}; nothing more is read from it")
        except PagedKVError as e:
            self.put("error", error=e)
        except LineTooLong as e:
            self.put("error", error=PagedKVError(f"{self.source}: {e}; nothing more is read"))
        except Exception as e:  # a bug or the OS: named, never a silent dead thread
            self.put("error", error=PagedKVError(f"{self.source}: {type(e).__name__}: {e}"))
        finally:
            self.put("end")

    def produce(self) -> None:
        raise NotImplementedError


class StreamSource(Source):
    """A recorded stream (stdin or a file, KV events or a step log), read to its end."""

    def __init__(
        self,
        name: str,
        out: Sink,
        stop: threading.Event,
        stream: IO[bytes] | str,
        engine: Engine = "auto",
    ) -> None:
        super().__init__(name, out, stop)
        self.stream = stream  # a stream, or the path of a file opened (and closed) here
        self.engine = engine

    def produce(self) -> None:
        from .. import compression  # gzip or zstd told by their first bytes

        if isinstance(self.stream, str):
            with compression.open_input(self.stream) as f:
                self._read(f)
        else:
            self._read(compression.reader(self.stream, self.source))

    def _read(self, stream: IO[bytes]) -> None:
        first = _read_ahead(stream)
        if is_step_log(first):
            ended: list[bytes] = []  # the last byte read: a newline or not
            held: tuple[int, bytes] | None = None  # each line is put when the next comes
            for number, line in enumerate(_split_lines(first, stream, self.stop_event, ended), 1):
                if held is not None:
                    self.put("line", line=held[1], number=held[0])
                held = (number, line)
            if held is not None:
                self.put("line", line=held[1], number=held[0], last=ended != [b"\n"])
            return
        for b in batches(_Prefixed(first, stream), self.source, self.engine):
            if self.stop_event.is_set():
                return
            self.put("batch", batch=b)


class FollowSource(Source):
    """A growing file of lines (a step log or JSON Lines of KV events), like `tail -F`."""

    def __init__(self, name: str, out: Sink, stop: threading.Event, path: str) -> None:
        super().__init__(name, out, stop)
        self.path = path
        self.kind: str | None = None  # "steps" or "events", from the file's first line
        self.number = 0
        self.opened = False  # the file was ever opened

    def produce(self) -> None:
        files: list[IO[bytes]] = []  # the file open now, closed however the loop ends
        pending: list[bytes] = []  # the unfinished line's pieces: joined once, when it ends
        try:
            self._follow(files, pending)
        finally:
            for f in files:
                f.close()
        unfinished = sum(len(p) for p in pending)
        if unfinished:
            self.put(
                "note",
                message=f"the last line of {self.path} is unfinished ({unfinished:,} bytes "
                "without a newline yet): not read",
            )
        if not self.opened:
            self.put(
                "problem", message=f"{self.path} never existed while watched: nothing was read"
            )

    def _open(self, files: list[IO[bytes]]) -> bool:
        try:
            f = open(self.path, "rb")  # noqa: SIM115 (closed by produce)
        except (FileNotFoundError, NotADirectoryError):
            return False
        except IsADirectoryError:
            raise _is_a_directory(self.path) from None
        files.append(f)
        if stat.S_ISDIR(os.fstat(f.fileno()).st_mode):
            raise _is_a_directory(self.path)
        self.opened = True
        return True

    def _follow(self, files: list[IO[bytes]], pending: list[bytes]) -> None:
        ino = None
        tail = b""  # the last bytes read (up to TAIL_BYTES): still there, or rewritten
        started = time.monotonic()
        noted = False
        while not self.stop_event.is_set():
            if not files:
                if not self._open(files):
                    if not noted and time.monotonic() - started > QUIET_NOTE_S:
                        noted = True
                        self.put(
                            "note",
                            message=f"{self.path} does not exist after {QUIET_NOTE_S:.0f} s; "
                            "waiting for it",
                        )
                    time.sleep(POLL_MS / 1000)
                    continue
                ino = os.fstat(files[0].fileno()).st_ino
                pending.clear()
                tail = b""
            f = files[0]
            offset = f.tell()
            size = os.fstat(f.fileno()).st_size
            if size < offset or (size > offset and not _unchanged(f, tail, offset)):
                what = "truncated" if size < offset else "rewritten"
                self._restart(f"{self.path} was {what}; reading it from the start")
                f.seek(0)
                pending.clear()
                tail = b""
                continue
            chunk = f.read(1 << 20)
            if chunk:
                tail = (tail + chunk)[-TAIL_BYTES:]
                self._chunk(chunk, pending)
                continue
            try:
                st = os.stat(self.path)
            except FileNotFoundError:
                st = None
            if st is not None and st.st_ino != ino:  # rotated: the old file is read out
                files.pop().close()
                if pending:
                    self.put(
                        "note",
                        message=f"the last line of the replaced {self.path} was unfinished "
                        f"({sum(len(p) for p in pending):,} bytes): not read",
                    )
                self._restart(f"{self.path} was replaced; reading the new file")
                continue
            time.sleep(POLL_MS / 1000)

    def _chunk(self, chunk: bytes, pending: list[bytes]) -> None:
        if b"\n" in chunk:
            *lines, rest = b"".join([*pending, chunk]).split(b"\n")
            for line in lines:
                self._line(line)
            pending[:] = [rest] if rest else []
        else:
            pending.append(chunk)
        if sum(len(p) for p in pending) > MAX_LINE_BYTES:  # a line that never ends
            raise LineTooLong(self.number + 1, MAX_LINE_BYTES)

    def _restart(self, why: str) -> None:
        """The file was truncated, rewritten or replaced: its lines are a new log."""
        kind, self.number, self.kind = self.kind, 0, None
        self.put("reset" if kind == "steps" else "reset-events", message=why)

    def _line(self, line: bytes) -> None:
        self.number += 1
        if not line.strip():
            return
        if self.kind is None:
            self.kind = "steps" if is_step_log(line) else "events"
        if self.kind == "steps":
            self.put("line", line=line, number=self.number)
            return
        import msgspec

        where = f"{self.path}:{self.number}"
        try:
            b = json_batch(json_value(line), where)
        except (msgspec.DecodeError, RecursionError, ValueError) as e:
            self.put("problem", message=f"{where}: malformed JSON: {e}")
            return
        except Malformed as e:
            self.put("problem", message=f"{where}: {e}")
            return
        self.put("batch", batch=b)


def _unchanged(f: IO[bytes], tail: bytes, offset: int) -> bool:
    """Whether the bytes before ``offset`` are still ``tail`` (not a rewritten file)."""
    if not tail:
        return True
    return os.pread(f.fileno(), len(tail), offset - len(tail)) == tail


def _is_a_directory(path: str) -> UsageError:
    return UsageError(
        f"{path} is a directory, not a file to follow",
        hint="give the log file itself (e.g. DIR/vllm-1234.jsonl); several are several sources",
    )


def is_step_log(first: bytes) -> bool:
    """A step log's lines are objects with a "step" (or its header, "pagedkv_step_log")."""
    head = first.lstrip()[:200]
    return head.startswith(b"{") and (b'"step"' in head or b'"pagedkv_step_log"' in head)


def _read_ahead(stream: IO[bytes]) -> bytes:
    data = b""
    while len(data) < 256:
        chunk = stream.read(1 << 16)
        if not chunk:
            break
        data += chunk
        if data.strip():
            break
    return data


class _Prefixed:
    def __init__(self, first: bytes, stream: IO[bytes]) -> None:
        self.first = first
        self.stream = stream

    def read(self, n: int = -1) -> bytes:
        if self.first:
            out, self.first = self.first, b""
            return out
        return self.stream.read(n)


def _split_lines(
    first: bytes, stream: IO[bytes], stop: threading.Event, ended: list[bytes]
) -> Iterator[bytes]:
    def chunks() -> Iterator[bytes]:
        chunk = first
        while chunk and not stop.is_set():
            ended[:] = [chunk[-1:]]
            yield chunk
            chunk = stream.read(1 << 16)

    yield from split_lines(chunks())  # LineTooLong ends the source, named (Source.run)
