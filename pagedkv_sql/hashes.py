"""One block hash: vLLM's published integer (docs/replay.md, "Block hashes").

vLLM hashes a block to a digest (SHA-256 by default, 32 bytes) and publishes it in its KV
events as the LAST 8 bytes of the digest read big-endian, an unsigned 64-bit integer
(``VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES``, on by default; Dynamo and llm-d read it the same
way). That integer is the canonical hash everywhere here: files write it unsigned (as vLLM
and Dynamo do), DuckDB tables and Spark keep the same 64 bits as a signed BIGINT (two's
complement). Step logs written before this fold kept the FIRST 8 bytes (``first8``); a log's
header says which fold it used (``"hash": "vllm_last8"``; absent: ``first8``)."""

from __future__ import annotations

CANONICAL = "vllm_last8"  # the fold a step log's header names: vLLM's published integer
FIRST8 = "first8"  # the fold of a log without the key: the digest's leading 8 bytes
FOLDS = (CANONICAL, FIRST8)


def canonical(digest: bytes) -> int:  # vLLM's published integer
    return int.from_bytes(digest[-8:], "big")


def first8(digest: bytes) -> int:
    """The digest's leading 8 bytes, big-endian: the fold of step logs written before."""
    return int.from_bytes(digest[:8], "big")


def to_signed(u: int) -> int:
    return u - (1 << 64) if u >= (1 << 63) else u


def from_signed(s: int) -> int:
    return s + (1 << 64) if s < 0 else s
