"""The step log's reader core (docs/replay.md): a Builder turns steps (JSON objects) into
block-level events, column by column, keeping each request's block table only as far as it
needs to number block indices and to expand request-level operations (free, fork, swap).

One module with what the Builder is told, since each calls back into it: the step shapes
of vLLM's SchedulerOutput a log may carry (a new request's whole block tables, a running
request's new blocks, one list of block ids per KV-cache group), and the witness a version 2
log carries beyond the block tables ("The witness": the hashes the engine caches blocks
under and the hashes a prefix hit asked for, the blocks a free gave back, the free list and
the engine's counts observed), which replay cannot derive and its checks read
(prefix_hash, leak, double_free, held_free_block, free_list_duplicate); and
``short_hash``, an engine's hash as a log writes it."""

from __future__ import annotations

import hashlib
import json
from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa

from ..hashes import canonical
from ..kv_groups import WINDOW_KEYS
from ..limits import MAX_POOL_TOKENS
from ..numbers import INT64_MAX
from .header import (
    EVENT_SCHEMA,
    FORMAT_VERSION,
    HEADER_KEY,
    STEP_KEYS,
    STEP_OPS,
    V2_FIELDS,
    V2_OPS,
    Header,
    LogLineError,
    as_block_ids,
    as_block_slots,
    as_count,
    as_hash,
    as_int,
    as_ints,
    as_list,
    as_object,
    as_request_id,
    request_of,
)

Entry = tuple[str, int] | None


@dataclass
class Request:
    """What the reader knows of one request: its entries by block index, ``("gpu", id)``,
    ``("cpu", address)`` or None (a hole), of group 0 (``entries``) and of each further
    KV-cache group (``others``), and how many tokens it holds (every group's tokens)."""

    entries: list[Entry] = field(default_factory=list)
    tokens: int = 0
    alive: bool = True
    others: dict[int, list[Entry]] = field(default_factory=dict)

    def table(self, group: int) -> list[Entry]:
        """Group ``group``'s entries."""
        return self.entries if group == 0 else self.others.setdefault(group, [])

    def tables(self) -> list[tuple[int, list[Entry]]]:
        """Every group's entries, group 0 first."""
        return [(0, self.entries), *sorted(self.others.items())]

    def clear(self) -> None:
        self.entries = []
        self.others = {}
        self.tokens = 0


class Builder:
    """Turns steps into block-level events, column by column, for a log of format
    ``version`` (a version 1 log may not carry what version 2 added)."""

    def __init__(
        self,
        header: Header,
        requests: dict[str, Request] | None = None,
        first_event: int = 0,
        version: int = FORMAT_VERSION,
    ) -> None:
        self.header = header
        self.version = version
        self.requests: dict[str, Request] = requests if requests is not None else {}
        self.next_event = first_event
        self.last_step: int | None = None
        self.columns: dict[str, list[Any]] = {name: [] for name in EVENT_SCHEMA.names}
        self._step = 0
        self.max_block = max(
            (
                e[1]
                for r in self.requests.values()
                for _, table in r.tables()
                for e in table
                if e and e[0] == "gpu"
            ),
            default=-1,
        )
        self._grown: set[str] = set()
        # the KV-cache groups whose tables the log keeps (one: every log without groups)
        self.groups = range(max(1, len(header.groups)))

    # -- output ------------------------------------------------------------------------
    def emit(
        self,
        op: str,
        request: str | None = None,
        *,
        block_index: int | None = None,
        block_id: int | None = None,
        cpu_address: int | None = None,
        token_from: int | None = None,
        token_to: int | None = None,
        value: int | None = None,
        parent: str | None = None,
        group: int = 0,
    ) -> None:
        c = self.columns
        c["event"].append(self.next_event)
        c["step"].append(self._step)
        c["op"].append(op)
        c["request"].append(request)
        c["block_index"].append(block_index)
        c["block_id"].append(block_id)
        c["cpu_address"].append(cpu_address)
        c["token_from"].append(token_from)
        c["token_to"].append(token_to)
        c["value"].append(value)
        c["parent"].append(parent)
        c["group_id"].append(group)
        self.next_event += 1

    def table(self) -> pa.Table:
        return pa.table(self.columns, schema=EVENT_SCHEMA).replace_schema_metadata(
            {HEADER_KEY: self.header.to_json()}
        )

    # -- one step ----------------------------------------------------------------------
    def step(self, obj: Any) -> None:
        """Apply one step object. On LogLineError the builder is left part-way through the
        step: the log is refused anyway, and reading on only finds more bad lines."""
        self._apply_step(obj)

    def _apply_step(self, obj: Any) -> None:
        step_obj = as_object(obj, "a step")
        unknown = sorted(set(step_obj) - set(STEP_KEYS))
        if unknown:
            raise LogLineError(
                f"unknown key(s) {', '.join(unknown)}; a step has: {', '.join(STEP_KEYS)}"
            )
        if "step" not in step_obj:
            raise LogLineError("a step needs a 'step' number")
        step = as_count(step_obj["step"], "'step'")
        if self.last_step is not None and step <= self.last_step:
            raise LogLineError(
                f"step {step} is out of order: it follows step {self.last_step} "
                "(steps must strictly increase)"
            )
        self._step = step
        scheduled = step_obj.get("num_scheduled_tokens", {})
        scheduled = as_object(scheduled, "'num_scheduled_tokens'")
        for key in ("finished", "finished_req_ids"):
            for i, req in enumerate(as_list(step_obj.get(key, []), f"'{key}'")):
                self.free(as_request_id(req, f"{key}[{i}]"))
        for key in ("preempted", "preempted_req_ids"):
            for i, req in enumerate(as_list(step_obj.get(key, []), f"'{key}'")):
                self.preempt(as_request_id(req, f"{key}[{i}]"))
        for key in ("new_requests", "scheduled_new_reqs"):
            for i, new in enumerate(as_list(step_obj.get(key, []), f"'{key}'")):
                new_request(self, as_object(new, f"{key}[{i}]"), scheduled, f"{key}[{i}]")
        for i, run in enumerate(as_list(step_obj.get("running", []), "'running'")):
            run = as_object(run, f"running[{i}]")
            running_request(
                self,
                request_of(run, f"running[{i}]"),
                run.get("new_block_ids"),
                run.get("num_computed_tokens"),
                run.get("num_scheduled_tokens", scheduled.get(request_of(run, "running"), 0)),
                run.get("resumed_from_preemption", False),
                f"running[{i}]",
            )
        if "scheduled_cached_reqs" in step_obj:
            cached_columns(self, as_object(step_obj["scheduled_cached_reqs"], "cached"), scheduled)
        for i, op in enumerate(as_list(step_obj.get("ops", []), "'ops'")):
            self._op(as_object(op, f"ops[{i}]"), f"ops[{i}]")
        if "observed" in step_obj:
            observed = as_object(step_obj["observed"], "'observed'")
            refuse_v2(self.version, observed, "'observed'")
            observed_counts(self, observed, "'observed'")
        self.bound_tokens()
        self.last_step = step

    def capacity(self, req: str) -> tuple[int, str]:
        """The most tokens request ``req`` may hold, and why: the header's pool
        (num_gpu_blocks x block_size); else its own blocks and the highest block id the
        log has named (+ 1), x block_size; never more than MAX_POOL_TOKENS."""
        bs = self.header.block_size
        if self.header.num_gpu_blocks:
            blocks = self.header.num_gpu_blocks
            why = f"the pool's {blocks:,} blocks x {bs} tokens"
        elif self.max_block >= 0:
            blocks = len(self.requests[req].entries) + self.max_block + 1
            why = f"its blocks and the {self.max_block + 1:,} the log has named, x {bs} tokens"
        else:
            return MAX_POOL_TOKENS, "what a real engine's pool holds"
        if blocks * bs > MAX_POOL_TOKENS:
            return MAX_POOL_TOKENS, "what a real engine's pool holds"
        return blocks * bs, why

    def bound_tokens(self) -> None:
        """Refuse a request that holds, at the end of the step, more tokens than the pool
        could: no engine holds them, and replay would make each one (a 150-byte line asking
        for 3e9 tokens ran for minutes). Fewer past the request's own blocks are a finding
        (unresolved_token)."""
        grown, self._grown = self._grown, set()
        for req in sorted(grown):
            held = self.requests[req].tokens
            limit, why = self.capacity(req)
            if held > limit:
                raise LogLineError(
                    f"request {req} would hold {held:,} tokens, more than {limit:,} ({why})"
                )

    def block_size(self, group: int) -> int:
        return self.header.group(group).block_size

    def group_of(self, obj: Mapping[str, Any], what: str) -> int:
        """An op's ``group`` (default 0), one of the header's groups."""
        g = as_count(obj.get("group", 0), f"{what}.group")
        if g not in self.groups:
            raise LogLineError(
                f"{what}.group {g} is not a KV-cache group of the log (the header has "
                f"{len(self.groups)})"
            )
        return g

    def _op(self, op: Mapping[str, Any], what: str) -> None:
        name = op.get("op")
        if name not in STEP_OPS:
            raise LogLineError(
                f"{what}: unknown operation {json.dumps(name)}; known: {', '.join(STEP_OPS)}"
            )
        what = f"{what} ({name})"
        refuse_v2(self.version, op, what)
        if name == "cache":
            cache_op(self, op, what)
            return
        if name == "evict":
            for b in as_block_ids(op.get("blocks", []), f"{what}.blocks"):
                self.emit("evict", block_id=b)
            return
        if name == "observe":
            observed_counts(self, op, what)
            return
        req = request_of(op, what)
        if name in ("allocate", "share"):
            self.create(req, existing_ok=True)
            g = self.group_of(op, what)
            slots = as_block_slots(op.get("blocks", []), f"{what}.blocks")
            asked = asked_hashes(op, len(slots), what) if name == "share" else None
            if name == "share" and len(self.groups) > 1 and self.requests[req].alive:
                # the hit's length in this group, compared across the groups of the lookup
                hit = len(slots) * self.block_size(g)
                self.emit("hit", req, token_from=0, token_to=hit, group=g)
            self.acquire(name, req, slots, asked, group=g)
        elif name == "append":
            self.known(req)
            tokens = as_count(op.get("tokens"), f"{what}.tokens")
            self.append(req, self.requests[req].tokens + tokens)
        elif name == "fork":
            if "parent" not in op:
                raise LogLineError(f"{what} needs a 'parent' request id")
            self.fork(req, as_request_id(op["parent"], f"{what}.parent"))
        elif name == "free":
            self.free(req, handed_blocks(op, what))
        elif name == "preempt":
            self.preempt(req, handed_blocks(op, what))
        elif name == "release":
            self.known(req)
            g = self.group_of(op, what)
            self.release(req, as_block_ids(op.get("blocks", []), f"{what}.blocks"), g)
        elif name == "window_free":
            self.window_free(req, op, what)
        elif name == "swap_out":
            self.known(req)
            cpu = as_ints(op.get("cpu"), f"{what}.cpu")
            listed = op.get("blocks")
            self.swap_out(
                req, None if listed is None else as_block_ids(listed, f"{what}.blocks"), cpu
            )
        else:  # swap_in
            self.known(req)
            blocks = as_block_ids(op.get("blocks"), f"{what}.blocks")
            indices = op.get("indices")
            self.swap_in(
                req, blocks, None if indices is None else as_ints(indices, f"{what}.indices")
            )

    # -- operations (also used by Database.apply and the synthesizer) ----------------------
    def known(self, req: str) -> Request:
        if req not in self.requests:
            raise LogLineError(
                f"request {req} never existed (it was never allocated, shared, "
                "forked or listed in new_requests)"
            )
        return self.requests[req]

    def create(self, req: str, *, existing_ok: bool = False) -> None:
        r = self.requests.get(req)
        if r is None:
            self.requests[req] = Request()
            for g in self.groups:
                self.emit("arrive", req, group=g)
        elif not r.alive:
            for g in self.groups:  # a freed request named again: a finding, not an error
                self.emit("arrive", req, group=g)
        elif not existing_ok:
            raise LogLineError(f"request {req} already exists")

    def addressable(self, block: int) -> None:
        """A GPU block's address (gpu_base + block * block_bytes) fits 64 bits: else the
        line is refused naming the block, not --at's "Overflow in multiplication" later."""
        if self.header.base(block) > INT64_MAX:
            h = self.header
            raise LogLineError(
                f"block {block} has no address: gpu_base {h.gpu_base} + {block} x block_bytes "
                f"{h.block_bytes} passes 2^63 - 1"
            )

    def acquire(
        self,
        op: str,
        req: str,
        blocks: Iterable[int | None],
        hashes: list[int | None] | None = None,
        *,
        group: int = 0,
    ) -> None:
        """``blocks`` appended to the request's table of ``group`` (None: a placeholder
        entry, no block held, no event); a share's ``hashes``: the hash each block was
        asked for (the event's value)."""
        r = self.requests[req]
        table = r.table(group)
        for k, b in enumerate(blocks):
            if b is None:
                if r.alive:
                    table.append(None)
                continue
            self.addressable(b)
            asked = hashes[k] if hashes is not None else None
            if not r.alive:
                self.emit(op, req, block_id=b, value=asked, group=group)
                continue
            self.emit(op, req, block_index=len(table), block_id=b, value=asked, group=group)
            table.append(("gpu", b))
            self.max_block = max(self.max_block, b)

    def append(self, req: str, total: int) -> None:
        r = self.requests[req]
        if not r.alive:
            for g in self.groups:
                self.emit("append", req, group=g)
            return
        if total > r.tokens:
            for g in self.groups:
                self.emit("append", req, token_from=r.tokens, token_to=total, group=g)
            r.tokens = total
            self._grown.add(req)

    def fork(self, child: str, parent: str) -> None:
        p = self.known(parent)
        self.create(child)
        c = self.requests[child]
        if not p.alive or not c.alive:
            for g in self.groups:
                self.emit("fork", child, parent=parent, group=g)
            return
        for g, entries in p.tables():
            table = c.table(g)
            for i, entry in enumerate(entries):
                table.append(entry)
                if entry is None:
                    continue
                tier, where = entry
                if tier == "gpu":
                    self.emit("fork", child, block_index=i, block_id=where, parent=parent, group=g)
                else:
                    self.emit(
                        "fork", child, block_index=i, cpu_address=where, parent=parent, group=g
                    )
        if p.tokens:
            for g in self.groups:
                self.emit("append", child, token_from=0, token_to=p.tokens, group=g)
            c.tokens = p.tokens
            self._grown.add(child)

    def _drop_all(self, op: str, req: str, handed: list[int] | None = None) -> None:
        """Every entry of the request released, then the request-level row. With
        ``handed`` (what the engine's free gave back): a GPU entry whose block was not
        handed ends as ``kept``; a block handed more often than held is a row of ``op``
        that names the block but no block index (a block the request does not hold)."""
        r = self.known(req)
        left = Counter(handed or ())
        if r.alive:
            for g, entries in r.tables():
                for i, entry in enumerate(entries):
                    if entry is None:
                        continue
                    tier, where = entry
                    if tier == "cpu":
                        self.emit(op, req, block_index=i, cpu_address=where, group=g)
                    elif handed is None or left[where] > 0:
                        left[where] -= 1
                        self.emit(op, req, block_index=i, block_id=where, group=g)
                    else:
                        self.emit("kept", req, block_index=i, block_id=where, group=g)
            r.clear()
        for b in handed or ():
            if left[b] > 0:
                left[b] -= 1
                self.emit(op, req, block_id=b)
        for g in self.groups:
            self.emit(op, req, group=g)

    def free(self, req: str, handed: list[int] | None = None) -> None:
        self._drop_all("free", req, handed)
        self.requests[req].alive = False

    def preempt(self, req: str, handed: list[int] | None = None) -> None:
        self._drop_all("preempt", req, handed)

    def _find(self, r: Request, entry: tuple[str, int], group: int = 0) -> int | None:
        if not r.alive:
            return None
        try:
            return r.table(group).index(entry)
        except ValueError:
            return None

    def release(self, req: str, blocks: Iterable[int], group: int = 0, **window: Any) -> None:
        """Each block's entry in the table of ``group`` ends (a placeholder now): a
        ``release`` event (a window free's: ``value``, its token count, and ``token_to``, the
        tokens the request holds then, what the free is judged at)."""
        r = self.requests[req]
        for b in blocks:
            i = self._find(r, ("gpu", b), group)
            self.emit("release", req, block_index=i, block_id=b, group=group, **window)
            if i is not None:
                r.table(group)[i] = None

    def window_free(self, req: str, op: Mapping[str, Any], what: str) -> None:
        """Entries that left the request's sliding window, measured at ``tokens`` processed
        tokens: each a ``release`` whose value is that count (their tokens are no longer
        required: sql/replay.sql's unresolved_token), the entry a placeholder."""
        g = self.group_of(op, what)
        if self.header.group(g).kind not in WINDOW_KEYS:
            raise LogLineError(
                f"{what}: a window_free needs a sliding_window or chunked_local_attention "
                f"group (the header's group {g} is {self.header.group(g).kind})"
            )
        r = self.known(req)
        blocks = as_block_ids(op.get("blocks", []), f"{what}.blocks")
        measured = as_count(op.get("tokens"), f"{what}.tokens")
        self.release(req, blocks, g, value=measured, token_to=r.tokens if r.alive else None)

    def swap_out(self, req: str, blocks: list[int] | None, cpu: list[int]) -> None:
        r = self.requests[req]
        if blocks is None:
            blocks = [e[1] for e in r.entries if e is not None and e[0] == "gpu"] if r.alive else []
        if len(blocks) != len(cpu):
            raise LogLineError(
                f"swap_out of request {req}: {len(blocks)} block(s) but {len(cpu)} cpu address(es)"
            )
        for b, address in zip(blocks, cpu, strict=True):
            i = self._find(r, ("gpu", b))
            self.emit("swap_out", req, block_index=i, block_id=b, cpu_address=address)
            if i is not None:
                r.entries[i] = ("cpu", address)

    def swap_in(self, req: str, blocks: list[int], indices: list[int] | None) -> None:
        r = self.requests[req]
        if indices is None:
            indices = [i for i, e in enumerate(r.entries) if e is not None and e[0] == "cpu"]
            if not r.alive:
                indices = []
        if len(blocks) != len(indices):
            raise LogLineError(
                f"swap_in of request {req}: {len(blocks)} block(s) for {len(indices)} "
                "swapped block index(es)"
            )
        for b, i in zip(blocks, indices, strict=True):
            self.addressable(b)
            entry = r.entries[i] if r.alive and i < len(r.entries) else None
            if entry is None or entry[0] != "cpu":
                self.emit("swap_in", req, block_id=b)
                continue
            self.emit("swap_in", req, block_index=i, block_id=b, cpu_address=entry[1])
            r.entries[i] = ("gpu", b)
            self.max_block = max(self.max_block, b)


# -- the step shapes of vLLM's SchedulerOutput, told to the Builder as its operations


def group_blocks(b: Builder, value: Any, what: str) -> list[list[int | None]]:
    """Block ids of each KV-cache group: a list of one group's ids, or vLLM's tuple of
    one list per group (``null``: a placeholder entry)."""
    if len(b.groups) == 1:
        return [list(as_block_ids(value, what))]
    lists = as_list(value, what)
    if len(lists) != len(b.groups):
        raise LogLineError(
            f"{what} must be one list of block ids per KV-cache group ({len(b.groups)} "
            f"in the header), not {json.dumps(value)[:60]}"
        )
    return [as_block_slots(v, f"{what}[{g}]") for g, v in enumerate(lists)]


def prefix_hit(
    b: Builder, req: str, computed: int, per_group: list[list[int | None]], asked: Any
) -> None:
    """A new or resumed request's tables: in each group, the entries that hold its
    ``computed`` tokens shared (a prefix hit), the rest allocated."""
    for g, blocks in enumerate(per_group):
        hits = min(computed // b.block_size(g), len(blocks))
        hashes = asked(hits) if g == 0 and asked is not None else None
        b.acquire("share", req, blocks[:hits], hashes, group=g)
        b.acquire("allocate", req, blocks[hits:], group=g)


def new_request(
    b: Builder, new: Mapping[str, Any], scheduled: Mapping[str, Any], what: str
) -> None:
    req = request_of(new, what)
    per_group = group_blocks(b, new.get("block_ids", []), f"{what}.block_ids")
    computed = as_count(new.get("num_computed_tokens", 0), f"{what}.num_computed_tokens")
    now = as_count(
        new.get("num_scheduled_tokens", scheduled.get(req, 0)),
        f"{what}.num_scheduled_tokens",
    )
    refuse_v2(b.version, new, what)
    b.create(req)
    prefix_hit(b, req, computed, per_group, lambda hits: asked_hashes(new, hits, what))
    b.append(req, computed + now)


def running_request(
    b: Builder, req: str, new_blocks: Any, computed: Any, now: Any, resumed: Any, what: str
) -> None:
    per_group = group_blocks(
        b,
        new_blocks if new_blocks is not None else [[] for _ in b.groups],
        f"{what}.new_block_ids",
    )
    if computed is None:
        raise LogLineError(f"{what} needs 'num_computed_tokens'")
    total = as_count(computed, f"{what}.num_computed_tokens") + as_count(
        now, f"{what}.num_scheduled_tokens"
    )
    b.known(req)
    if not isinstance(resumed, bool):
        raise LogLineError(f"{what}.resumed_from_preemption must be true or false")
    if resumed:
        b.preempt(req)
        prefix_hit(b, req, as_count(computed, "num_computed_tokens"), per_group, None)
        b.append(req, total)
        return
    for g, blocks in enumerate(per_group):
        b.acquire("allocate", req, blocks, group=g)
    held = b.requests[req].tokens
    if b.requests[req].alive and total < held:
        raise LogLineError(f"{what}: request {req} would hold {total} tokens, fewer than {held}")
    b.append(req, total)


def cached_columns(b: Builder, cached: Mapping[str, Any], scheduled: Mapping[str, Any]) -> None:
    ids = as_list(cached.get("req_ids", []), "scheduled_cached_reqs.req_ids")
    n = len(ids)
    new_blocks = cached.get("new_block_ids") or [None] * n
    computed = cached.get("num_computed_tokens") or [None] * n
    resumed = cached.get("resumed_from_preemption") or [False] * n
    for name, col in (
        ("new_block_ids", new_blocks),
        ("num_computed_tokens", computed),
        ("resumed_from_preemption", resumed),
    ):
        if len(as_list(col, f"scheduled_cached_reqs.{name}")) != n:
            raise LogLineError(f"scheduled_cached_reqs.{name} has not {n} entries (req_ids)")
    for i, req in enumerate(ids):
        req = as_request_id(req, f"scheduled_cached_reqs.req_ids[{i}]")
        running_request(
            b,
            req,
            new_blocks[i],
            computed[i],
            scheduled.get(req, 0),
            resumed[i],
            f"scheduled_cached_reqs[{i}]",
        )


# -- the witness of a version 2 log, and the engine's observed counts


def refuse_v2(version: int, obj: Mapping[str, Any], what: str) -> None:
    """A version 1 log may not carry what version 2 added (its header promised without)."""
    if version >= 2:
        return
    name = obj.get("op")
    found = [f"operation '{name}'"] if name in V2_OPS else []
    found += [f"'{key}'" for key in V2_FIELDS if key in obj]
    if found:
        raise LogLineError(
            f"{what}: {', '.join(found)} {'is' if len(found) == 1 else 'are'} format version 2, "
            'but the header says version 1 (write "pagedkv_step_log": 2)'
        )


def asked_hashes(obj: Mapping[str, Any], count: int, what: str) -> list[int | None] | None:
    """The ``hashes`` of a share (or of a new request's prefix hits): per block, the hash
    the request asked for (null: not known); None when the field is absent."""
    if "hashes" not in obj:
        return None
    given = as_list(obj["hashes"], f"{what}.hashes")
    if len(given) != count:
        raise LogLineError(
            f"{what}.hashes has {len(given)} hash(es) for {count} shared block(s); give one "
            "a block (null where it is not known)"
        )
    return [None if h is None else as_hash(h, f"{what}.hashes[{i}]") for i, h in enumerate(given)]


def handed_blocks(obj: Mapping[str, Any], what: str) -> list[int] | None:
    """The ``handed`` of a free or a preemption: the blocks the engine's free gave back to
    the pool, each once per time (None: the request's table, once each)."""
    if "handed" not in obj:
        return None
    return as_block_ids(obj["handed"], f"{what}.handed")


def cache_op(builder: Builder, op: Mapping[str, Any], what: str) -> None:
    """``cache``: the engine's prefix cache now hands out these blocks for these hashes."""
    blocks = as_block_ids(op.get("blocks", []), f"{what}.blocks")
    if "hashes" not in op:
        raise LogLineError(f"{what} needs 'hashes', one a block")
    given = asked_hashes(op, len(blocks), what) or []
    for i, (block, h) in enumerate(zip(blocks, given, strict=True)):
        if h is None:
            raise LogLineError(f"{what}.hashes[{i}]: a cached block's hash cannot be null")
        builder.emit("cache", block_id=block, value=h)


def observed_counts(builder: Builder, obs: Mapping[str, Any], what: str) -> None:
    """The engine's own counts (an ``observe`` op or a step's ``observed``): each block's
    ref_cnt, the blocks its free list holds (a block once an entry), its free count."""
    unknown = sorted(set(obs) - {"op", "ref_cnt", "num_free_blocks", "free_list"})
    if unknown:
        raise LogLineError(f"{what}: unknown key(s) {', '.join(unknown)}")
    refs = as_object(obs.get("ref_cnt", {}), f"{what}.ref_cnt")
    for key, value in refs.items():
        try:
            block = int(key)
        except ValueError:
            raise LogLineError(f"{what}.ref_cnt: block id {key!r} is not a number") from None
        builder.emit("observe_ref", block_id=block, value=as_int(value, f"{what}.ref_cnt[{key}]"))
    if "free_list" in obs:
        listed = Counter(as_block_ids(obs["free_list"], f"{what}.free_list"))
        for block, times in listed.items():
            builder.emit("observe_free_list", block_id=block, value=times)
    if obs.get("num_free_blocks") is not None:
        free = as_count(obs["num_free_blocks"], f"{what}.num_free_blocks")
        builder.emit("observe_free", value=free)


def short_hash(value: Any) -> str | None:
    """An engine's block hash as a log writes it: vLLM's published integer (the digest's
    last 8 bytes, big-endian: ``hashes.canonical``) of a byte string, the low 64 bits of an
    integer, as 16 hex digits; None for no hash."""
    if value is None:
        return None
    if isinstance(value, bytes | bytearray):
        return f"{canonical(bytes(value)):016x}"
    if isinstance(value, int) and not isinstance(value, bool):
        return f"{value & ((1 << 64) - 1):016x}"
    return hashlib.blake2b(repr(value).encode(), digest_size=8).hexdigest()
