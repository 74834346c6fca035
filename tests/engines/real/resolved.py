"""What pagedkv-sql resolved, read back in an engine's own terms, and a recorded step log
driven and replayed: shared by the tier's vLLM and SGLang tests (each engine's Engine
driver has schedule/decode/finish)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import numpy as np

import pagedkv_sql

T = TypeVar("T")
Token = tuple[str, int, int]  # (request id, token_pos, physical_address or slot)


def resolved_tokens(db: pagedkv_sql.Database, label: str = "engine_request") -> list[Token]:
    """Every resolved token as (request id, token_pos, physical_address), sorted; request
    ids from ``label``: ``engine_request`` after an import, ``pagedkv_request_label``
    after a replay."""
    rows = db.sql(
        f"SELECT l.request_id, a.token_pos, a.physical_address FROM resolved_kv_address a "
        f"JOIN {label} l USING (seq_id) ORDER BY ALL"
    ).fetchall()
    return [(str(r), int(p), int(a)) for r, p, a in rows]


def pool_addressing(db: pagedkv_sql.Database) -> tuple[int, int]:
    """Pool 0's base and block step: a block's address is base + block_id * step."""
    base, step = db.sql("SELECT base, block_step FROM engine_pool WHERE pool_id = 0").fetchall()[0]
    return int(base), int(step)


def as_slots(tokens: list[Token], base: int, step: int, block_size: int) -> list[Token]:
    """Each token's address turned back into the engine's slot: block_id * B + offset."""
    out = []
    for rid, pos, address in tokens:
        block, offset = divmod(address - base, step)
        out.append((rid, pos, block * block_size + offset))
    return out


def resolved_slots(
    db: pagedkv_sql.Database, block_size: int, *, offset_is_position: bool = False
) -> dict[str, np.ndarray]:
    """Each request's resolved tokens as engine slots, in token order, through the pool's
    addressing (base + block_id * block_step + offset). ``offset_is_position``: assert
    that each token sits at its position's place in its block (vLLM's slot_mapping)."""
    out: dict[str, list[int]] = {}
    for rid, pos, slot in as_slots(resolved_tokens(db), *pool_addressing(db), block_size):
        assert not offset_is_position or slot % block_size == pos % block_size, (rid, pos)
        out.setdefault(rid, []).append(slot)
    return {rid: np.array(s) for rid, s in out.items()}


def grow_then_finish(e: Any, rec: Any) -> int:
    """The recorded tail of both recorder tests: request b decodes 20 tokens, a step each
    (crossing a block boundary), then a finishes; the log is closed. Returns the last
    step, the one to replay back to."""
    for t in range(20):
        e.decode("b", 1000 + t)
        rec.step()
    e.finish("a")
    last = int(rec.step()) - 1
    rec.close()
    return last


def replayed(log: Path, step: int, path: Path, read: Callable[[pagedkv_sql.Database], T]) -> T:
    """Replay a recorded ``log`` into a database at ``path`` (no invariant may break),
    go back to ``step``, and ``read`` the state there."""
    with pagedkv_sql.connect(path) as db:
        report = db.replay(log)
        assert report.ok, report.findings[:3]
        db.replay_at(step)
        return read(db)
