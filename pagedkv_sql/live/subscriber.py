"""`watch`'s ZeroMQ source: a SUB socket on an engine's KV-event publisher (vLLM / SGLang /
TensorRT-LLM's `ZmqEventPublisher`: multipart `topic, 8-byte big-endian seq, msgpack
KVEventBatch`). A skipped sequence number is asked again on the publisher's ROUTER socket
(`replay`, a DEALER here: `b"", start-seq` out; `b"", [topic,] seq, payload` back, until
seq -1).

Bounded: a message over `MAX_MESSAGE_BYTES` is refused by ZeroMQ itself (ZMQ_MAXMSGSIZE,
never held whole), which drops that connection: the drop is seen on the socket's monitor
(no reconnect follows a refused message), said, counted as a problem, and the connection is
made again. A replay holds at most `REPLAY_MAX_BYTES` and lasts at most `REPLAY_TIMEOUT_S`.
The receive loop looks at the stop flag between messages, so a watch of busy publishers
stops at once. Connections are followed on the monitor too: a publisher nothing connected
to after `QUIET_NOTE_S` is said, and one never connected is a problem at the end.
"""

from __future__ import annotations

import contextlib
import threading
import time
from typing import Any

from ..errors import UsageError
from .decode import MAX_SEQ, Batch, Engine, PayloadDecoder, seq_number
from .events import Malformed
from .sources import POLL_MS, QUIET_NOTE_S, Sink, Source

REPLAY_TIMEOUT_S = 2.0
END_SEQ = -1
MAX_MESSAGE_BYTES = 64 << 20  # a batch of KV events is kilobytes; ZMQ_MAXMSGSIZE
REPLAY_MAX_BYTES = 256 << 20  # what one replay may hold
REFUSED_AFTER_S = 0.5  # a drop with no reconnect by then: ZeroMQ refused a message
BURST = 256  # messages read between looks at the stop flag and the monitor


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
        self.connected = False  # ever connected (or, with --bind, connected to)
        self.refused = 0  # messages ZeroMQ refused (over MAX_MESSAGE_BYTES or not ZMTP)

    def produce(self) -> None:
        import zmq

        ctx: Any = zmq.Context.instance()
        sub = ctx.socket(zmq.SUB)
        sub.setsockopt(zmq.LINGER, 0)
        sub.setsockopt(zmq.RCVHWM, 0)  # keep up, never drop on our side
        sub.setsockopt(zmq.MAXMSGSIZE, MAX_MESSAGE_BYTES)
        sub.setsockopt(zmq.SUBSCRIBE, self.topic)
        monitor = sub.get_monitor_socket()
        try:
            if self.bind:  # a publisher given a plain host:port connects to its subscriber
                try:
                    sub.bind(self.endpoint)
                except zmq.ZMQError as e:
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
            self._receive(sub, monitor)
        finally:
            sub.disable_monitor()
            monitor.close(0)
            sub.close(0)
        if not self.connected:
            what = "nothing connected to it" if self.bind else "no connection was made"
            self.put(
                "problem",
                message=f"{what}: nothing was read (is the publisher running, on this port?)",
            )

    def _receive(self, sub: Any, monitor: Any) -> None:
        import zmq

        poller = zmq.Poller()
        poller.register(sub, zmq.POLLIN)
        poller.register(monitor, zmq.POLLIN)
        started = time.monotonic()
        dropped: float | None = None  # when a connection dropped, no reconnect seen yet
        noted = False
        while not self.stop_event.is_set():
            ready = dict(poller.poll(POLL_MS))
            if monitor in ready:
                dropped = self._monitor(monitor, dropped)
            if dropped is not None and time.monotonic() - dropped > REFUSED_AFTER_S:
                dropped = None
                self._refused(sub)
            if not self.connected and not noted and time.monotonic() - started > QUIET_NOTE_S:
                noted = True
                what = "nothing has connected to it" if self.bind else "no connection yet"
                self.put("note", message=f"{what} after {QUIET_NOTE_S:.0f} s; still waiting")
            if sub not in ready:
                continue
            for _ in range(BURST):
                if self.stop_event.is_set():
                    return
                try:
                    frames = sub.recv_multipart(zmq.NOBLOCK, copy=True)
                except zmq.Again:
                    break
                self._message(frames)

    def _monitor(self, monitor: Any, dropped: float | None) -> float | None:
        import zmq
        from zmq.utils.monitor import recv_monitor_message

        while monitor.poll(0):
            event = recv_monitor_message(monitor)["event"]
            if event in (zmq.EVENT_CONNECTED, zmq.EVENT_ACCEPTED):
                self.connected = True
                dropped = None
            elif event == zmq.EVENT_CONNECT_RETRIED:
                dropped = None  # ZeroMQ reconnects by itself: the publisher went away
            elif event == zmq.EVENT_DISCONNECTED:
                if self.bind:  # the publisher connects again by itself
                    self.put(
                        "note",
                        message="a publisher's connection dropped (it went away, or sent a "
                        f"message over {MAX_MESSAGE_BYTES:,} bytes, which is refused)",
                    )
                else:
                    dropped = time.monotonic()
        return dropped

    def _refused(self, sub: Any) -> None:
        """ZeroMQ dropped the connection without reconnecting: it refused a message (over
        MAX_MESSAGE_BYTES, or not ZMTP). Said, counted, and connected again."""
        self.refused += 1
        self.put(
            "problem",
            message=f"a message over {MAX_MESSAGE_BYTES:,} bytes (or not ZeroMQ's protocol) was "
            "refused and dropped the connection; connecting again (what it held is a gap)",
        )
        with contextlib.suppress(Exception):  # the session ended with the refusal
            sub.disconnect(self.endpoint)
        sub.connect(self.endpoint)

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
        """Ask the publisher's ROUTER for batches start..upto-1: those it still has, in
        order; at most REPLAY_TIMEOUT_S and REPLAY_MAX_BYTES, and never past a stop."""
        import zmq

        assert self.replay is not None
        dealer: Any = zmq.Context.instance().socket(zmq.DEALER)
        dealer.setsockopt(zmq.LINGER, 0)
        dealer.setsockopt(zmq.MAXMSGSIZE, MAX_MESSAGE_BYTES)
        dealer.connect(self.replay)
        got: dict[int, bytes] = {}
        held = 0
        try:
            dealer.send_multipart([b"", start.to_bytes(8, "big")])
            deadline = time.monotonic() + REPLAY_TIMEOUT_S
            while not self.stop_event.is_set():
                if time.monotonic() > deadline:
                    self.put("note", message=f"replay from {self.replay} timed out")
                    break
                if held > REPLAY_MAX_BYTES:
                    self.put(
                        "note",
                        message=f"replay from {self.replay} passed {REPLAY_MAX_BYTES:,} bytes; "
                        "the rest is not read",
                    )
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
                if start <= seq < upto and seq not in got:
                    got[seq] = frames[1]
                    held += len(frames[1])
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
