"""The prefix-cache checks, incremental: one batch at a time, state bounded by the cache.

The checker keeps, per stream (a source and its data-parallel rank or worker) and scope
(medium, KV-cache group, locality, ownership, attention window), the set of stored hashes,
and names each event that does not fit them:

- `unknown_removal`: a BlockRemoved (or TensorRT-LLM `updated`) names a hash not stored;
- `unknown_parent`: a BlockStored's parent hash is not stored (full-attention groups only:
  a sliding-window, chunked-local or Mamba group keeps only some of a chain's blocks, so its
  stored chain is no contiguous prefix, llm-d-router #2362);
- `sequence_gap`: sequence numbers of a stream skip or step back;
- `after_clear`: an event names a hash that AllBlocksCleared dropped.

A hash carries no group (vLLM stores the same hash in each group, and twice in one group when
two blocks hold the same tokens): stores are counted per scope and hash, and a removal takes
one of them in its own group. A group's kind (vLLM's `kv_cache_spec_kind`) is learned from
its BlockStored events and named, with the group, in each finding.

`feed` returns the findings of the batch it is given; each is also counted per check
(`findings`), so the caller keeps as many as it shows and still knows how many there were.

Memory is bounded by the cache for a publisher that reports its evictions; one that stores
and never removes (what this tool hunts) is bounded by `max_hashes`: past it, the stream's
hashes are forgotten (counted in `forgotten`, said once in `notes`), and its removals and
parents of hashes not seen since are counted `unverifiable`, not findings, until its next
AllBlocksCleared, as for a watch that joined late.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from operator import attrgetter
from typing import Any

from .. import findings, invariants
from ..invariants import LIVE
from ..kv_groups import GAPPED_CHAINS
from .decode import Batch, Event

# the live checks, each described by its idea in the catalogue (pagedkv_sql/invariants.py)
CHECKS = tuple(name for name, _ in invariants.checks(LIVE))
KINDS = ("stored", "removed", "cleared", "updated", "created")
# the kinds of group whose stored chain has gaps (kv_groups.py): no unknown_parent there
WINDOWED = GAPPED_CHAINS
MAX_HASHES = 1 << 22  # stored hashes held at once (about 70 bytes each: ~300 MB)


def show(h: Any) -> str:
    """A hash as text: bytes in hex, integers in decimal (engine_block.block_hash's form)."""
    if isinstance(h, bytes | bytearray | memoryview):
        return bytes(h).hex()
    return str(h)


@dataclass(frozen=True, slots=True)
class KVFinding:
    check: str
    source: str
    stream: str
    seq: int | None
    position: int  # 0-based position of the event in its source
    where: str  # the event's place in its source, for people
    message: str
    group: int | None = None  # the KV-cache group (vLLM's group_idx)
    group_kind: str | None = None  # its kind and window, as its BlockStored events say
    group_window: int | None = None

    model = LIVE  # the prefix-cache events' checks (``findings.Finding``)
    cause = None

    @property
    def request_ids(self) -> tuple[str, ...]:
        return ()  # hash-level events name no request or block

    @property
    def block_ids(self) -> tuple[int, ...]:
        return ()

    def extra(self) -> dict[str, Any]:
        return {"source": self.source, "stream": self.stream, "seq": self.seq}

    def to_dict(self) -> dict[str, Any]:
        return {**findings.as_dict(self), **asdict(self)}


class _Scope:
    __slots__ = ("clear_pos", "cleared", "extra", "group", "kind", "spec_window", "stored")

    def __init__(self, group: Any = None) -> None:
        self.group = group
        self.kind: str | None = None  # the group's spec kind, once a BlockStored says it
        self.spec_window: int | None = None
        self.stored: set[Any] = set()
        self.extra: dict[Any, int] = {}  # a hash stored n > 1 times: n - 1
        self.cleared: set[Any] = set()  # the hashes the last AllBlocksCleared dropped
        self.clear_pos = -1  # ... and that clear's event position


_SCOPE = attrgetter("medium", "group", "locality", "ownership", "window")


class Checker:
    """Feed it batches (`feed`): each call returns the findings of its batch."""

    def __init__(self, max_hashes: int = MAX_HASHES) -> None:
        self.max_hashes = max_hashes
        self.held = 0  # stored hashes held, every stream
        self.forgotten = 0  # hashes forgotten past max_hashes
        self.notes: list[str] = []  # said once each: take_notes()
        self.counts = dict.fromkeys(KINDS, 0)
        self.findings = dict.fromkeys(CHECKS, 0)
        self.events = 0
        self.batches = 0
        self.gaps = 0
        self._scopes: dict[tuple[str, str], dict[tuple[Any, ...], _Scope]] = {}
        self._last_seq: dict[tuple[str, str], int] = {}
        self._partial: set[str] = set()
        self.unverifiable = 0  # removals / parents not checked: before the watch joined

    def take_notes(self) -> list[str]:
        notes, self.notes = self.notes, []
        return notes

    def restart(self, source: str) -> None:
        """The publisher of `source` started again: a new, empty cache, numbered anew."""
        for skey in [k for k in self._scopes if k[0] == source]:
            self.held -= sum(len(sc.stored) for sc in self._scopes[skey].values())
            del self._scopes[skey]
        for skey in [k for k in self._last_seq if k[0] == source]:
            del self._last_seq[skey]
        self._partial.discard(source)

    def joined_late(self, source: str) -> None:
        """What `source` stored before we joined is unknown: removals and parents not seen
        are not findings until its first AllBlocksCleared."""
        self._partial.add(source)

    def _found(
        self,
        out: list[KVFinding],
        check: str,
        source: str,
        b: Batch,
        pos: int,
        message: str,
        sc: _Scope | None = None,
    ) -> None:
        if source in self._partial and check in ("unknown_removal", "unknown_parent"):
            self.unverifiable += 1
            return
        self.findings[check] += 1
        if sc is None or sc.group is None:
            out.append(KVFinding(check, source, b.stream, b.seq, pos, b.where, message))
            return
        label = f"group {sc.group}"
        if sc.kind is not None:
            label += f" ({sc.kind}" + (f" {sc.spec_window})" if sc.spec_window else ")")
        out.append(
            KVFinding(
                check,
                source,
                b.stream,
                b.seq,
                pos,
                b.where,
                f"{label}: {message}",
                sc.group,
                sc.kind,
                sc.spec_window,
            )
        )

    def expected_seq(self, source: str, stream: str) -> int | None:
        last = self._last_seq.get((source, stream))
        return None if last is None else last + 1

    def feed(self, source: str, b: Batch) -> list[KVFinding]:
        """Check one batch of `source`: its findings, in the order of its events."""
        out: list[KVFinding] = []
        self.batches += 1
        skey = (source, b.stream)
        if b.seq is not None:
            prev = self._last_seq.get(skey)
            if prev is not None and b.seq != prev + 1:
                self.gaps += 1
                missing = b.seq - prev - 1
                what = (
                    f"skips: {missing} batch(es) missing"
                    if missing > 0
                    else f"steps back: {-missing or 1} batch(es) repeated"
                )
                self._found(
                    out,
                    "sequence_gap",
                    source,
                    b,
                    self.events,
                    f"sequence number {b.seq} follows {prev} in {source} {b.stream} ({what})",
                )
            self._last_seq[skey] = b.seq
        scopes = self._scopes.get(skey)
        if scopes is None:
            scopes = self._scopes[skey] = {}
        if not self._fast(scopes, b.events):
            self._slow(out, source, b, scopes)
        self.events += len(b.events)
        if self.held > self.max_hashes:
            self._forget(source, b.stream, scopes)
        return out

    def _forget(self, source: str, stream: str, scopes: dict[tuple[Any, ...], _Scope]) -> None:
        """Past max_hashes: forget the stream's hashes, and check what names them no more
        until its next AllBlocksCleared."""
        n = sum(len(sc.stored) for sc in scopes.values())
        for sc in scopes.values():
            sc.stored = set()
            sc.extra = {}
            sc.cleared = set()
        self.held -= n
        self.forgotten += n
        if source not in self._partial:
            self.notes.append(
                f"{stream}: more than {self.max_hashes:,} hashes stored and not removed: "
                f"{n:,} forgotten (memory is bounded); its removals and parents of hashes not "
                "seen since are counted unverifiable, not findings, until its next "
                "AllBlocksCleared"
            )
        self._partial.add(source)

    def _fast(self, scopes: dict[tuple[Any, ...], _Scope], events: list[Event]) -> bool:
        """A batch of stores and removals in one scope that breaks nothing, applied with set
        operations; False (nothing changed) when it needs the event-by-event walk."""
        if not events:
            return True
        e = events[0]
        key = _SCOPE(e)
        medium, group, locality, ownership, window = key
        sc = scopes.get(key)
        known = None if sc is None else sc.kind
        stored_hashes: list[Any] = []
        removed: list[Any] = []
        parents: list[Any] = []  # list.append is the interpreter's own (set.add a call)
        n_removed = 0
        # one loop, no object an event (a scope tuple an event cost more than all of this);
        # each kind its own attribute loads, so each site stays the interpreter's
        # specialised load of a slot (one site for both kinds is the generic lookup);
        # `is not` first: the scope is mostly None, and identity skips the rich comparison
        for e in events:
            kind = e.kind  # every layout's classes say it (live/decode.py)
            if kind == "stored":
                if (
                    e.medium != medium
                    or (e.group is not group and e.group != group)
                    or (e.locality is not locality and e.locality != locality)
                    or (e.ownership is not ownership and e.ownership != ownership)
                    or (e.window is not window and e.window != window)
                ):
                    return False
                if e.spec_kind is not None and e.spec_kind != known:
                    return False  # a group's kind to learn: the walk learns it
                stored_hashes += e.hashes
                if e.parent is not None:
                    parents.append(e.parent)
            elif kind == "removed":
                if (
                    e.medium != medium
                    or (e.group is not group and e.group != group)
                    or (e.locality is not locality and e.locality != locality)
                    or (e.ownership is not ownership and e.ownership != ownership)
                    or (e.window is not window and e.window != window)
                ):
                    return False
                removed += e.hashes
                n_removed += 1
            else:
                return False
        if sc is None:
            sc = scopes[key] = _Scope(group)
        stored = sc.stored
        if not stored.isdisjoint(stored_hashes):
            return False  # a hash stored again: counted by the walk
        start = len(stored)
        gone = None
        if removed:
            # set methods take the lists as they are: the one set built is of the removed
            gone = set(removed)
            if (
                len(gone) != len(removed)
                or not stored.issuperset(gone)
                or not gone.isdisjoint(stored_hashes)
                or not gone.isdisjoint(parents)
                or (sc.extra and not gone.isdisjoint(sc.extra))
            ):
                return False
            stored -= gone
        if (
            parents
            and known not in WINDOWED
            and not stored.issuperset(parents)
            and not self._stored_earlier(
                set(parents) - stored,
                set(stored_hashes),
                [e for e in events if e.kind == "stored"],
            )
        ):
            if gone:
                stored |= gone
            return False
        before = len(stored)
        stored.update(stored_hashes)
        if len(stored) - before != len(stored_hashes):  # a hash twice in the batch: the walk
            stored.difference_update(stored_hashes)  # each was new: none stored before
            if gone:
                stored |= gone
            return False
        self.held += len(stored) - start
        if sc.cleared:
            sc.cleared.difference_update(stored_hashes)
        counts = self.counts
        counts["stored"] += len(events) - n_removed
        counts["removed"] += n_removed
        return True

    @staticmethod
    def _stored_earlier(missing: set[Any], new: set[Any], stores: list[Any]) -> bool:
        """Whether each parent in `missing` is stored by an earlier event of the batch."""
        if not missing <= new:
            return False
        seen: set[Any] = set()
        for e in stores:
            if e.parent in missing and e.parent not in seen:
                return False
            seen.update(e.hashes)
        return True

    def _slow(
        self,
        out: list[KVFinding],
        source: str,
        b: Batch,
        scopes: dict[tuple[Any, ...], _Scope],
    ) -> None:
        counts = self.counts
        pos = self.events
        for e in b.events:
            kind = e.kind
            counts[kind] += 1
            if kind == "cleared" or kind == "created":
                self._partial.discard(source)
                for sc in scopes.values():
                    # only the last clear's hashes are kept: memory bounded by the cache
                    self.held -= len(sc.stored)
                    sc.cleared = sc.stored if kind == "cleared" else set()
                    sc.clear_pos = pos
                    sc.stored = set()
                    sc.extra = {}
                pos += 1
                continue
            key = _SCOPE(e)
            found = scopes.get(key)
            if found is None:
                found = scopes[key] = _Scope(e.group)
            sc = found
            stored = sc.stored
            if kind == "stored":
                if e.spec_kind is not None:
                    sc.kind = e.spec_kind
                    sc.spec_window = e.spec_window
                parent = e.parent
                # a windowed group's chain has gaps: its parent need not be stored
                if parent is not None and parent not in stored and sc.kind not in WINDOWED:
                    if parent in sc.cleared:
                        self._found(
                            out,
                            "after_clear",
                            source,
                            b,
                            pos,
                            f"BlockStored names parent {show(parent)}, dropped by "
                            f"AllBlocksCleared (event {sc.clear_pos})",
                            sc,
                        )
                    else:
                        first = show(e.hashes[0]) if e.hashes else "(none)"
                        self._found(
                            out,
                            "unknown_parent",
                            source,
                            b,
                            pos,
                            f"BlockStored of {first} names parent {show(parent)}, "
                            "which is not stored",
                            sc,
                        )
                extra = sc.extra
                for h in e.hashes:
                    if h in stored:
                        extra[h] = extra.get(h, 0) + 1
                    else:
                        stored.add(h)
                        self.held += 1
                if sc.cleared:
                    sc.cleared.difference_update(e.hashes)
            else:  # removed, updated
                what = "BlockRemoved" if kind == "removed" else "updated"
                for h in e.hashes:
                    if h in stored:
                        if kind == "removed":
                            n = sc.extra.pop(h, 0)
                            if n > 1:
                                sc.extra[h] = n - 1
                            elif not n:
                                stored.discard(h)
                                self.held -= 1
                    elif h in sc.cleared:
                        self._found(
                            out,
                            "after_clear",
                            source,
                            b,
                            pos,
                            f"{what} of {show(h)}, which AllBlocksCleared "
                            f"(event {sc.clear_pos}) already dropped",
                            sc,
                        )
                    else:
                        self._found(
                            out,
                            "unknown_removal",
                            source,
                            b,
                            pos,
                            f"{what} of {show(h)}, which is not stored",
                            sc,
                        )
            pos += 1

    @property
    def total_findings(self) -> int:
        return sum(self.findings.values())
