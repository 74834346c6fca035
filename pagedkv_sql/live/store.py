"""Recorded events into DuckDB's `engine_kv_event` table, as Arrow batches.

Rows are gathered column-wise per batch of events (a Python list per column, never a Python
object per row) and appended in Arrow record batches of `ROWS` rows; the caller owns the
transaction, so a refused file leaves nothing behind. A recorded stream's load is one row of
`engine_kv_load` (the SHA-256 of its bytes: `Digest`), so the same bytes are never stored
twice; its COMMIT runs with SIGINT/SIGTERM held (`signals_held`), so a Ctrl-C comes before
it (nothing stored) or after it (all stored, and said), never in between.
"""

from __future__ import annotations

import contextlib
import hashlib
import signal
import threading
from collections.abc import Iterator
from typing import IO, Any

from ..sqlfiles import statements_in
from .checker import show
from .decode import Batch

ROWS = 1 << 17
KV_SQL = "kvevents.sql"
COLUMNS = (
    "source",
    "stream",
    "seq",
    "event",
    "ts",
    "kind",
    "block_hash",
    "parent_hash",
    "medium",
    "group_idx",
    "locality",
    "ownership",
    "window_size",
    "location",
)


def _sql(name: str) -> str:
    return next(s.sql for s in statements_in(KV_SQL) if s.name == name)


def create(con: Any) -> None:
    con.execute(_sql("create_engine_kv_event"))


class Recorder:
    """Gathers the rows of batches and appends them to `engine_kv_event` on `flush`."""

    def __init__(self, con: Any) -> None:
        import pyarrow as pa

        self._pa = pa
        self._con = con
        self._schema = pa.schema(
            [
                ("source", pa.string()),
                ("stream", pa.string()),
                ("seq", pa.int64()),
                ("event", pa.int64()),
                ("ts", pa.float64()),
                ("kind", pa.string()),
                ("block_hash", pa.string()),
                ("parent_hash", pa.string()),
                ("medium", pa.string()),
                ("group_idx", pa.int64()),
                ("locality", pa.string()),
                ("ownership", pa.string()),
                ("window_size", pa.int64()),
                ("location", pa.string()),
            ]
        )
        self._cols: list[list[Any]] = [[] for _ in COLUMNS]
        self.rows = 0
        create(con)

    def add(self, source: str, b: Batch, first_event: int) -> None:
        (c_src, c_stream, c_seq, c_event, c_ts, c_kind, c_hash, c_parent, c_medium, c_group,
         c_loc, c_own, c_win, c_where) = self._cols  # fmt: skip
        n0 = len(c_kind)
        pos = first_event
        for e in b.events:
            hashes = e.hashes
            k = len(hashes) or 1
            c_event.extend([pos] * k)
            c_kind.extend([e.kind] * k)
            if hashes:
                c_hash.extend([show(h) for h in hashes])
            else:
                c_hash.append(None)
            parent = e.parent
            c_parent.extend([None if parent is None else show(parent)] * k)
            c_medium.extend([e.medium] * k)
            c_group.extend([e.group] * k)
            c_loc.extend([e.locality] * k)
            c_own.extend([e.ownership] * k)
            c_win.extend([e.window] * k)
            pos += 1
        n = len(c_kind) - n0
        c_src.extend([source] * n)
        c_stream.extend([b.stream] * n)
        c_seq.extend([b.seq] * n)
        c_ts.extend([b.ts] * n)
        c_where.extend([b.where] * n)
        if len(c_kind) >= ROWS:
            self.flush()

    def flush(self) -> None:
        if not self._cols[0]:
            return
        pa = self._pa
        batch = pa.record_batch(
            [pa.array(col, type=f.type) for col, f in zip(self._cols, self._schema, strict=True)],
            schema=self._schema,
        )
        self.rows += batch.num_rows
        self._cols = [[] for _ in COLUMNS]
        self._con.register("_pagedkv_kv_batch", batch)
        try:
            self._con.execute(_sql("insert_engine_kv_event"))
        except BaseException:
            # after a failed insert (a full disk, an interrupt) the transaction is aborted
            # and unregister fails too: the insert's error is the one to tell
            with contextlib.suppress(Exception):
                self._con.unregister("_pagedkv_kv_batch")
            raise
        self._con.unregister("_pagedkv_kv_batch")


class Digest:
    """A binary stream read through, its bytes hashed (SHA-256) on the way."""

    def __init__(self, stream: IO[bytes] | Any) -> None:
        self._stream = stream
        self._hash = hashlib.sha256()

    def read(self, n: int = -1) -> bytes:
        data: bytes = self._stream.read(n)
        self._hash.update(data)
        return data

    def hexdigest(self) -> str:
        return self._hash.hexdigest()


def earlier_load(con: Any, sha256: str) -> tuple[str, int] | None:
    """The source and rows of the load of a stream with these bytes, if one was stored."""
    con.execute(_sql("create_engine_kv_load"))
    rows = con.execute(_sql("find_engine_kv_load"), [sha256]).fetchall()
    return (str(rows[0][0]), int(rows[0][1])) if rows else None


def record_load(con: Any, sha256: str, source: str, rows: int, events: int) -> None:
    con.execute(_sql("insert_engine_kv_load"), [sha256, source, rows, events])


@contextlib.contextmanager
def signals_held() -> Iterator[None]:
    """SIGINT and SIGTERM held while the block runs (a COMMIT: it happens whole), then
    delivered as they came (in the main thread; elsewhere the block just runs)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    came: list[int] = []
    old = {s: signal.signal(s, lambda signum, _: came.append(signum)) for s in _SIGNALS}
    try:
        yield
    finally:
        for s, handler in old.items():
            signal.signal(s, handler)
        for signum in came:
            signal.raise_signal(signum)


_SIGNALS = (signal.SIGINT, signal.SIGTERM)
