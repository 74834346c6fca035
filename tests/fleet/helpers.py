"""What the fleet tests read from a fleet directory."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any


def lines(path: Path) -> list[Any]:
    return [json.loads(x) for x in path.read_text().splitlines() if x.strip()]


def batches(out: Path, replica: str) -> list[dict[str, Any]]:
    return lines(out / f"replica={replica}" / "events.jsonl")


def steps(out: Path, replica: str) -> list[dict[str, Any]]:
    return lines(out / f"replica={replica}" / "steps.jsonl")


def cached_hashes(out: Path, replica: str) -> set[int]:
    """Every hash the replica's step log says it cached a block under."""
    return {
        int(h, 16)
        for s in steps(out, replica)[1:]
        for op in s.get("ops", [])
        if op["op"] == "cache"
        for h in op["hashes"]
    }


def stored_hashes(out: Path, replica: str) -> set[int]:
    return {
        h
        for b in batches(out, replica)
        for e in b["events"]
        if e["type"] == "BlockStored"
        for h in e["block_hashes"]
    }


def held_after(out: Path, replica: str, step: int) -> dict[int, set[int]]:
    """The replica's truth after ``step``: hash -> the blocks holding it."""
    block_hash: dict[int, int] = {}
    for s in steps(out, replica)[1:]:
        if s["step"] > step:
            break
        for op in s.get("ops", []):
            if op["op"] == "cache":
                for b, h in zip(op["blocks"], op["hashes"], strict=True):
                    block_hash[b] = int(h, 16)
            elif op["op"] == "evict":
                for b in op["blocks"]:
                    block_hash.pop(b, None)
    held: dict[int, set[int]] = {}
    for b, h in block_hash.items():
        held.setdefault(h, set()).add(b)
    return held
