"""A plain-Python evaluation of the spec's two rules: the oracle for property tests."""

from __future__ import annotations

from collections.abc import Iterable

Fact = tuple[int, ...]


def wrap64(value: int) -> int:
    """Two's complement wrap-around, as a 64-bit Soufflé build computes Base + Offset."""
    return (value + 2**63) % 2**64 - 2**63


def resolve(
    root_table: Iterable[Fact],
    block_table_entry: Iterable[Fact],
    virtual_token: Iterable[Fact],
    swapped_block: Iterable[Fact],
) -> list[tuple[int, int, int]]:
    roots = set(root_table)
    entries = set(block_table_entry)
    swapped = set(swapped_block)
    out: set[tuple[int, int, int]] = set()
    for seq, pos, block, offset in set(virtual_token):
        for root_seq, table in roots:
            if root_seq != seq:
                continue
            for table_id, index, base, _refcount in entries:
                if (table_id, index) == (table, block):
                    out.add((seq, pos, wrap64(base + offset)))
            for table_id, index, cpu in swapped:
                if (table_id, index) == (table, block):
                    out.add((seq, pos, wrap64(cpu + offset)))
    return sorted(out)
