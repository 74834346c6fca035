"""A synthetic KV-event publisher on 127.0.0.1, wire-compatible with vLLM's
`ZmqEventPublisher` (PUB: `topic, 8-byte big-endian seq, msgpack KVEventBatch`; ROUTER:
replay of buffered batches from a start sequence number, ended by seq -1). For tests and
the benchmark (bench/watch.py): bounded by what the caller publishes, closed by `close()`.
"""

from __future__ import annotations

import collections
import threading
import time
from typing import Any

import msgspec


# vLLM 0.32's wire structs (vllm/distributed/kv_events.py): same names, order and options
class EventBatch(msgspec.Struct, array_like=True, omit_defaults=True, gc=False):
    ts: float
    events: list[Any]
    data_parallel_rank: int | None = None


class KVCacheEvent(msgspec.Struct, omit_defaults=True, gc=False, tag=True):
    pass


class BlockStored(KVCacheEvent):
    block_hashes: list[int | bytes]
    parent_block_hash: int | bytes | None
    token_ids: list[int]
    block_size: int
    lora_id: int | None
    medium: str | None
    lora_name: str | None
    extra_keys: list[Any] | None = None
    group_idx: int | None = None


class BlockRemoved(KVCacheEvent):
    block_hashes: list[int | bytes]
    medium: str | None
    group_idx: int | None = None


class AllBlocksCleared(KVCacheEvent):
    pass


class Publisher:
    """PUB + ROUTER on 127.0.0.1 (random ports unless given)."""

    END_SEQ = (-1).to_bytes(8, "big", signed=True)

    def __init__(
        self, *, port: int = 0, replay: bool = True, buffer_steps: int = 10_000, topic: str = ""
    ) -> None:
        import zmq

        self._zmq = zmq
        self._ctx: Any = zmq.Context.instance()
        self._pub = self._ctx.socket(zmq.PUB)
        self._pub.setsockopt(zmq.SNDHWM, 0)
        self._pub.setsockopt(zmq.LINGER, 0)
        if port:
            self._pub.bind(f"tcp://127.0.0.1:{port}")
        else:
            port = self._pub.bind_to_random_port("tcp://127.0.0.1")
        self.endpoint = f"zmq://127.0.0.1:{port}"
        self._topic = topic.encode()
        self._buffer: collections.deque[tuple[int, bytes]] = collections.deque(maxlen=buffer_steps)
        self._lock = threading.Lock()
        self._encoder = msgspec.msgpack.Encoder()
        self.seq = 0
        self.replay_endpoint: str | None = None
        self._stop = threading.Event()
        self.asked = threading.Event()  # a replay request was served (a subscriber is up)
        self._thread: threading.Thread | None = None
        if replay:
            self._router = self._ctx.socket(zmq.ROUTER)
            self._router.setsockopt(zmq.LINGER, 0)
            rport = self._router.bind_to_random_port("tcp://127.0.0.1")
            self.replay_endpoint = f"zmq://127.0.0.1:{rport}"
            self._thread = threading.Thread(target=self._serve, daemon=True)
            self._thread.start()

    def wait_for_subscriber(self, timeout: float = 5.0) -> None:
        """Let a just-connected SUB socket's subscription arrive (ZeroMQ's slow joiner)."""
        time.sleep(0.3 if timeout > 0.3 else timeout)

    def publish(
        self, events: list[Any], *, send: bool = True, keep: bool = True, rank: int = 0
    ) -> int:
        """Publish one batch; `send=False` skips the wire (a gap), `keep=False` the buffer too
        (a gap replay cannot fill). Returns its sequence number."""
        seq = self.seq
        self.seq += 1
        payload = self._encoder.encode(EventBatch(time.time(), events, rank))
        if keep:
            with self._lock:
                self._buffer.append((seq, payload))
        if send:
            self._pub.send_multipart((self._topic, seq.to_bytes(8, "big"), payload), copy=False)
        return seq

    def publish_raw(self, frames: list[bytes]) -> None:
        self._pub.send_multipart(frames)

    def _serve(self) -> None:
        zmq = self._zmq
        while not self._stop.is_set():
            if not self._router.poll(50):
                continue
            frames = self._router.recv_multipart()
            if len(frames) != 3:
                continue
            client, _, start = frames
            first = int.from_bytes(start, "big")
            with self._lock:
                kept = list(self._buffer)
            for seq, buf in kept:
                if seq >= first:
                    self._router.send_multipart(
                        (client, b"", self._topic, seq.to_bytes(8, "big"), buf)
                    )
            self._router.send_multipart((client, b"", b"", self.END_SEQ, b""))
            self.asked.set()
        del zmq

    def close(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=2.0)
            self._router.close(0)
        self._pub.close(0)
