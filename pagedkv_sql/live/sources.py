"""`watch`'s sources, each a thread handing what it reads to the watch.

- `ZmqSource`: a SUB socket on an engine's publisher (vLLM / SGLang / TensorRT-LLM's
  `ZmqEventPublisher`: multipart `topic, 8-byte big-endian seq, msgpack KVEventBatch`). A
  skipped sequence number is asked again on the publisher's ROUTER socket (`replay_endpoint`,
  a DEALER here: `b"", start-seq` out; `b"", [topic,] seq, payload` back, until seq -1).
- `StreamSource`: a recorded stream from stdin or a file, read once.
- `FollowSource`: a growing file, like `tail -F`: reopened when it is replaced (rotation),
  read from the start again when it shrinks (truncation); only complete lines are read.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import IO, Any, Protocol

from ..errors import PagedKVError, UsageError
from ..limits import MAX_LINE_BYTES, LineTooLong, split_lines
from .decode import (
    MAX_SEQ,
    Batch,
    Engine,
    PayloadDecoder,
    batches,
    json_batch,
    json_value,
    seq_number,
)
from .events import Malformed

POLL_MS = 50
REPLAY_TIMEOUT_S = 2.0
END_SEQ = -1


class Sink(Protocol):
    def put(self, item: Item) -> None: ...


@dataclass(slots=True)
class Item:
    """What a source hands over: a batch, a step-log line, a problem, a note, or its end."""

    source: str
    kind: str  # batch, line, problem, note, end, error
    batch: Batch | None = None
    line: bytes | None = None
    message: str = ""
    received: float = 0.0
    error: PagedKVError | None = None


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


def zmq_endpoint(url: str) -> str:
    """`zmq://HOST:PORT` (or `tcp://HOST:PORT`) as ZeroMQ's `tcp://HOST:PORT`."""
    for prefix in ("zmq://", "tcp://"):
        if url.startswith(prefix):
            rest = url[len(prefix) :]
            host, sep, port = rest.rpartition(":")
            if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
                raise UsageError(
                    f"{url}: not HOST:PORT", hint="e.g. zmq://127.0.0.1:5557 (vLLM's default)"
                )
            return f"tcp://{host}:{port}"
    raise UsageError(f"{url}: not a zmq:// endpoint")


class ZmqSource(Source):
    def __init__(
        self,
        name: str,
        out: Sink,
        stop: threading.Event,
        *,
        replay: str | None = None,
        topic: str = "",
        engine: Engine = "auto",
        bind: bool = False,
    ) -> None:
        super().__init__(name, out, stop)
        self.endpoint = zmq_endpoint(name)
        self.bind = bind
        self.replay = zmq_endpoint(replay) if replay else None
        self.topic = topic.encode()
        self.decoder = PayloadDecoder(engine)
        self.last: int | None = None
        self.stream = "dp 0"  # the data-parallel rank the publisher's batches name
        self.replayed: int | None = None  # the last sequence number the first replay gave
        self.ready = threading.Event()

    def produce(self) -> None:
        import zmq

        ctx: Any = zmq.Context.instance()
        sub = ctx.socket(zmq.SUB)
        sub.setsockopt(zmq.LINGER, 0)
        sub.setsockopt(zmq.RCVHWM, 0)  # keep up, never drop on our side
        sub.setsockopt(zmq.SUBSCRIBE, self.topic)
        if self.bind:  # a publisher given a plain host:port connects to its subscriber
            try:
                sub.bind(self.endpoint)
            except zmq.ZMQError as e:
                sub.close(0)
                raise UsageError(f"{self.source}: cannot bind: {e}") from None
        else:
            sub.connect(self.endpoint)
        if self.replay is not None:
            # what was published before we subscribed: ZeroMQ's SUB never sees it, and a
            # quiet publisher would not show a gap for a long time
            got = self._recover(0, MAX_SEQ + 1)
            if got and got[0][0] != 0:
                self.put("partial", message=f"joined at sequence number {got[0][0]}")
            for s, payload in got:
                self._deliver(s, payload)
            self.replayed = self.last
        self.ready.set()
        try:
            while not self.stop_event.is_set():
                if not sub.poll(POLL_MS):
                    continue
                while True:
                    try:
                        frames = sub.recv_multipart(zmq.NOBLOCK, copy=True)
                    except zmq.Again:
                        break
                    self._message(frames)
        finally:
            sub.close(0)

    def _message(self, frames: list[bytes]) -> None:
        if len(frames) != 3:
            self.put("problem", message=f"a message of {len(frames)} frame(s), not 3")
            return
        try:
            seq = seq_number(frames[1])
        except Malformed as e:
            self.put("problem", message=str(e))
            return
        if self.replayed is not None:  # the first messages may repeat the initial replay
            if seq <= self.replayed:
                return
            self.replayed = None
        if self.last is None and seq > 0:  # joined late: ask for what came before
            got = self._recover(0, seq) if self.replay is not None else []
            if not got or got[0][0] != 0:
                first = got[0][0] if got else seq
                self.put("partial", message=f"joined at sequence number {first}")
            for s, payload in got:
                self._deliver(s, payload)
        elif self.last is not None and seq > self.last + 1 and self.replay is not None:
            for s, payload in self._recover(self.last + 1, seq):
                self._deliver(s, payload)
        if self.last is not None and seq < self.last:  # the publisher started again
            self.put("restart", message=f"sequence number {seq} after {self.last}")
        elif self.last is not None and seq == self.last:
            self.put("problem", message=f"sequence number {seq} twice")
            return
        self._deliver(seq, frames[2])

    def _deliver(self, seq: int, payload: bytes) -> None:
        where = f"{self.source}#{seq}"
        self.last = seq
        try:
            ts, events, rank = self.decoder.decode(payload)
        except Malformed as e:
            self.put("problem", message=f"seq {seq}: {e}")
            # received, if unreadable: its number counts, so it is no gap
            self.put("batch", batch=Batch(self.stream, seq, None, where, []))
            return
        self.stream = f"dp {rank or 0}"
        self.put("batch", batch=Batch(self.stream, seq, ts, where, events))

    def _recover(self, start: int, upto: int) -> list[tuple[int, bytes]]:
        """Ask the publisher's ROUTER for batches start..upto-1: those it still has, in order."""
        import zmq

        assert self.replay is not None
        dealer: Any = zmq.Context.instance().socket(zmq.DEALER)
        dealer.setsockopt(zmq.LINGER, 0)
        dealer.connect(self.replay)
        got: dict[int, bytes] = {}
        try:
            dealer.send_multipart([b"", start.to_bytes(8, "big")])
            deadline = time.monotonic() + REPLAY_TIMEOUT_S
            while True:
                if time.monotonic() > deadline:
                    self.put("note", message=f"replay from {self.replay} timed out")
                    break
                if not dealer.poll(POLL_MS):
                    continue
                frames = dealer.recv_multipart()
                if frames and frames[0] == b"":
                    frames = frames[1:]  # the delimiter
                if len(frames) == 3:  # vLLM: topic, seq, payload (SGLang: seq, payload)
                    frames = frames[1:]
                if len(frames) != 2:
                    continue
                try:
                    seq = seq_number(frames[0])
                except Malformed:
                    continue
                if seq == END_SEQ:
                    break
                if start <= seq < upto:
                    got[seq] = frames[1]
        finally:
            dealer.close(0)
        if upto > MAX_SEQ:  # the first replay: whatever the publisher kept
            if got:
                first, last = min(got), max(got)
                self.put("note", message=f"replay from {self.replay}: {first}..{last} read")
            return sorted(got.items())
        missing = upto - start - len(got)
        self.put(
            "note",
            message=f"replay of {start}..{upto - 1} from {self.replay}: {len(got)} recovered"
            + (f", {missing} no longer kept by the publisher" if missing else ""),
        )
        return sorted(got.items())


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
        if isinstance(self.stream, str):
            with open(self.stream, "rb") as f:
                self._read(f)
        else:
            self._read(self.stream)

    def _read(self, stream: IO[bytes]) -> None:
        first = _read_ahead(stream)
        if _is_step_log(first):
            for line in _split_lines(first, stream, self.stop_event):
                self.put("line", line=line)
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
        self.kind: str | None = None  # "steps" or "events", from the first line
        self.number = 0

    def produce(self) -> None:
        files: list[IO[bytes]] = []  # the file open now, closed however the loop ends
        try:
            self._follow(files)
        finally:
            for f in files:
                f.close()

    def _follow(self, files: list[IO[bytes]]) -> None:
        ino = None
        pending: list[bytes] = []  # the unfinished line's pieces: joined once, when it ends
        held = 0
        while not self.stop_event.is_set():
            if not files:
                try:
                    files.append(open(self.path, "rb"))  # noqa: SIM115 (closed by produce)
                    ino = os.fstat(files[0].fileno()).st_ino
                    pending, held = [], 0
                except FileNotFoundError:
                    time.sleep(POLL_MS / 1000)
                    continue
            f = files[0]
            chunk = f.read(1 << 20)
            if chunk:
                if b"\n" in chunk:
                    *lines, rest = b"".join([*pending, chunk]).split(b"\n")
                    for line in lines:
                        self._line(line)
                    pending, held = [rest], len(rest)
                else:
                    pending.append(chunk)
                    held += len(chunk)
                if held > MAX_LINE_BYTES:  # a line that never ends is not followed
                    raise LineTooLong(self.number + 1, MAX_LINE_BYTES)
                continue
            try:
                st = os.stat(self.path)
            except FileNotFoundError:
                st = None
            if st is not None and st.st_ino != ino:  # rotated: the old file is read out
                files.pop().close()
                self.put("note", message=f"{self.path} was replaced; reading the new file")
                continue
            if st is not None and st.st_size < f.tell():  # truncated: read it again
                f.seek(0)
                pending, held = [], 0
                self.put("note", message=f"{self.path} was truncated; reading it from the start")
                continue
            time.sleep(POLL_MS / 1000)

    def _line(self, line: bytes) -> None:
        self.number += 1
        if not line.strip():
            return
        if self.kind is None:
            self.kind = "steps" if _is_step_log(line) else "events"
        if self.kind == "steps":
            self.put("line", line=line)
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


def _is_step_log(first: bytes) -> bool:
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


def _split_lines(first: bytes, stream: IO[bytes], stop: threading.Event) -> Iterator[bytes]:
    def chunks() -> Iterator[bytes]:
        chunk = first
        while chunk and not stop.is_set():
            yield chunk
            chunk = stream.read(1 << 16)

    yield from split_lines(chunks())  # LineTooLong ends the source, named (Source.run)
