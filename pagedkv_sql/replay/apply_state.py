"""What one applied step touches, read from the stored state (replay/apply.py's first
half): the log's header, the requests the step names and the holders of the blocks it
hands out, releases or evicts, as the events that made their current state (a
``Builder`` the step's own events are added to and checked in a scratch database)."""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from typing import Any

import duckdb
import pyarrow as pa

from ..dbutil import run, scalar
from ..errors import UsageError
from .engine import sql
from .log import Builder, Header, Request


def stored_header(con: duckdb.DuckDBPyConnection) -> Header:
    """The stored log's header (a loaded database's block size), refused (UsageError) when
    the log had several KV-cache groups: the spec's tables keep one group, so a step
    applied there could not be checked for ownership across the groups (a block another
    group holds handed out fresh), nor could the log's own next lines name their group."""
    if scalar(con, sql("apply_has_log")):
        row = run(con, sql("apply_log_header"))
        if row:
            r = row[0]
            groups = json.loads(r[11]) if len(r) > 11 and r[11] else []
            if len(groups) > 1:
                kinds = ", ".join(f"{g.get('kind')} (group {i})" for i, g in enumerate(groups))
                raise UsageError(
                    f"apply: the stored state was replayed from a log of {len(groups)} KV-cache "
                    f"groups ({kinds}); the database keeps one group's block tables, so a step "
                    "applied to it could not be checked against the others' holdings",
                    hint="append the steps to the log and replay it whole (replay checks "
                    "every group), or replay --at the step to look at",
                )
            return Header(r[0], r[1], r[2], r[3], r[4], tuple(r[5]))
    block_size = scalar(con, sql("apply_block_size"))
    return Header("live", int(block_size or 16))


_REQUEST_KEYS = (
    "req",
    "req_id",
    "request_id",
    "parent",
    "req_ids",
    "finished",
    "preempted",
    "finished_req_ids",
    "preempted_req_ids",
)


def named_requests(obj: Mapping[str, Any]) -> set[str]:
    """Every request id a step names (a superset is harmless: unknown ones load nothing)."""
    names: set[str] = set()

    def visit(value: Any, key: str | None = None) -> None:
        if isinstance(value, dict):
            for k, v in value.items():
                visit(v, k)
        elif isinstance(value, list):
            for v in value:
                visit(v, key)
        elif key in _REQUEST_KEYS and isinstance(value, str | int) and not isinstance(value, bool):
            names.add(str(value))

    visit(obj)
    names.update(str(k) for k in obj.get("num_scheduled_tokens", {}) or {})
    return names


def _ids_list(values: Iterable[int]) -> str:
    return "[" + ", ".join(str(int(v)) for v in values) + "]"


class State:
    """The touched part of the stored state, read by key."""

    def __init__(self, con: duckdb.DuckDBPyConnection, header: Header) -> None:
        self.con = con
        self.header = header
        self.seq: dict[str, int] = {}
        self.freed: set[str] = set()
        self.entries: dict[str, dict[int, tuple[str, int]]] = {}
        self.tokens: dict[str, int] = {}
        self.refcount: dict[int, int] = {}  # stored refcounts of the loaded GPU blocks

    def requests(self, ids: Iterable[str]) -> None:
        ids = [i for i in ids if i not in self.seq]
        if not ids:
            return
        rows = run(self.con, sql("apply_requests_by_id"), [ids])
        for rid, seq, freed in rows:
            self.seq[rid] = int(seq)
            if freed is not None:
                self.freed.add(rid)
        self._entries([self.seq[r] for r, *_ in rows if r not in self.freed])

    def _entries(self, seqs: list[int]) -> None:
        if not seqs:
            return
        h = self.header
        by_seq = {s: r for r, s in self.seq.items()}
        where = f"IN (SELECT unnest({_ids_list(seqs)}::BIGINT[]))"
        for bt, idx, base, refcount in run(
            self.con,
            "SELECT block_table_id, block_index, physical_block_base, refcount "
            f"FROM block_table_entry WHERE block_table_id {where}",
        ):
            block = (base - h.gpu_base) // h.block_bytes
            self.entries.setdefault(by_seq[bt], {})[idx] = ("gpu", block)
            self.refcount[block] = int(refcount)
        for bt, idx, cpu in run(
            self.con,
            f"SELECT block_table_id, block_index, cpu_base_address FROM swapped_block "
            f"WHERE block_table_id {where}",
        ):
            self.entries.setdefault(by_seq[bt], {})[idx] = ("cpu", cpu)
        for seq, n in run(
            self.con,
            f"SELECT seq_id, max(token_pos) + 1 FROM virtual_token WHERE seq_id {where} "
            "GROUP BY seq_id",
        ):
            self.tokens[by_seq[seq]] = int(n)
        for s in seqs:
            self.entries.setdefault(by_seq[s], {})
            self.tokens.setdefault(by_seq[s], 0)

    def holders(self, blocks: set[int]) -> bool:
        """Load the requests holding any of ``blocks``; whether there were any not loaded."""
        if not blocks:
            return False
        h = self.header
        bases = [h.base(b) for b in blocks]
        seqs = [
            int(s)
            for (s,) in run(
                self.con,
                "SELECT DISTINCT block_table_id FROM block_table_entry WHERE physical_block_base "
                f"IN (SELECT unnest({_ids_list(bases)}::BIGINT[]))",
            )
        ]
        loaded = set(self.seq.values())
        missing = [s for s in seqs if s not in loaded]
        if not missing:
            return False
        rows = run(
            self.con,
            "SELECT request_id, seq_id FROM replay_request "
            f"WHERE seq_id IN (SELECT unnest({_ids_list(missing)}::BIGINT[]))",
        )
        known = {int(s) for _, s in rows}
        for rid, seq in rows:
            self.seq[rid] = int(seq)
        for s in missing:  # block tables of no known request (loaded facts): name by seq_id
            if s not in known:
                self.seq[f"seq:{s}"] = s
        self._entries(missing)
        return True

    def builder(self, step: int) -> Builder:
        """A builder whose log so far recreates the loaded state at ``step - 1``: per request
        an arrive, a share (GPU) or fork (CPU) row for each entry, one append of its tokens
        (a free for a freed one). Written column by column, not one emit a row: a step's
        requests may hold tens of thousands of entries."""
        b = Builder(self.header)
        b._step = step - 1
        ops: list[str] = []
        reqs: list[str] = []
        index: list[int | None] = []
        block: list[int | None] = []
        cpu: list[int | None] = []
        upto: list[int | None] = []
        for rid in sorted(self.seq, key=lambda r: self.seq[r]):
            if rid in self.freed:
                ops += ("arrive", "free")
                reqs += (rid, rid)
                index += (None, None)
                block += (None, None)
                cpu += (None, None)
                upto += (None, None)
                b.requests[rid] = Request(alive=False)
                continue
            entries = sorted(self.entries.get(rid, {}).items())
            size = entries[-1][0] + 1 if entries else 0
            table: list[tuple[str, int] | None] = [None] * size
            tokens = self.tokens.get(rid, 0)
            n = 1 + len(entries) + (1 if tokens else 0)
            ops.append("arrive")
            ops += ["share" if tier == "gpu" else "fork" for _, (tier, _) in entries]
            reqs += [rid] * n
            index.append(None)
            index += [idx for idx, _ in entries]
            block.append(None)
            block += [where if tier == "gpu" else None for _, (tier, where) in entries]
            cpu.append(None)
            cpu += [where if tier == "cpu" else None for _, (tier, where) in entries]
            upto += [None] * (1 + len(entries))
            for idx, entry in entries:
                table[idx] = entry
            if tokens:
                ops.append("append")
                index.append(None)
                block.append(None)
                cpu.append(None)
                upto.append(tokens)
            b.requests[rid] = Request(table, tokens, True)
        rows = len(ops)
        c = b.columns
        c["event"] += range(b.next_event, b.next_event + rows)
        c["step"] += [step - 1] * rows
        c["op"] += ops
        c["request"] += reqs
        c["block_index"] += index
        c["block_id"] += block
        c["cpu_address"] += cpu
        c["token_from"] += [None if t is None else 0 for t in upto]
        c["token_to"] += upto
        c["value"] += [None] * rows
        c["parent"] += [None] * rows
        c["group_id"] += [0] * rows
        b.next_event += rows
        b.last_step = step - 1
        return b


def touched_blocks(events: pa.Table) -> set[int]:
    ops = events.column("op").to_pylist()
    blocks = events.column("block_id").to_pylist()
    return {b for o, b in zip(ops, blocks, strict=True) if b is not None and o != "observe_ref"}
