"""A recorder's marks in a step log (docs/replay.md, "Recorder marks"): the line where a
log stops being checkable, a ``gap`` (step lines the recorder dropped: its writer fell
behind) or ``stopped`` (the recorder stopped: a full disk, a reader gone, an error of its
own). The reader ends at the first mark and carries it in the table's schema metadata;
replay reports it."""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import asdict, dataclass, replace
from typing import Any

import pyarrow as pa

from ..errors import InputError
from .header import LogLineError, as_count

MARK_KEY = "pagedkv_step_log_mark"  # the schema metadata key of a table read up to a mark
MARK_KEYS = ("gap", "stopped")


@dataclass(frozen=True)
class Mark:
    """Where a recorder's log stops being checkable: ``gap`` (step lines dropped after
    ``after_step``: its writer fell behind) or ``stopped`` (the recorder stopped, ``reason``
    says why). ``lines_after``: the lines the reader did not read past it."""

    kind: str
    after_step: int | None
    dropped: int | None = None
    reason: str | None = None
    lines_after: int = 0

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def to_json(self) -> str:
        return json.dumps(self.to_dict())

    def text(self) -> str:
        """One sentence for a report."""
        where = f"after step {self.after_step}"
        if self.after_step is None:
            where = "before its first step"
        if self.kind == "gap":
            what = (
                f"the log has a gap {where}: the recorder dropped {self.dropped} step line(s) "
                "(its writer fell behind); checked up to the gap"
            )
        else:
            what = f"the log stops {where}: the recorder stopped ({self.reason})"
        if self.lines_after:
            what += f"; the {self.lines_after} line(s) after it are not checked"
        return what


def is_mark(obj: Any) -> bool:
    """A recorder's mark line (a ``gap`` or ``stopped`` key, no ``step``)."""
    return isinstance(obj, dict) and "step" not in obj and any(k in obj for k in MARK_KEYS)


def mark_from(obj: Mapping[str, Any]) -> Mark:
    """Validate a mark line (raises LogLineError)."""
    known = {*MARK_KEYS, "after_step"}
    unknown = sorted(set(obj) - known)
    if unknown or ("gap" in obj) == ("stopped" in obj):
        raise LogLineError(
            "a recorder mark has one of 'gap' (a count) or 'stopped' (a reason), and "
            f"'after_step'; found keys {sorted(obj)}"
        )
    after = obj.get("after_step")
    after = None if after is None else as_count(after, "mark 'after_step'")
    if "gap" in obj:
        dropped = as_count(obj["gap"], "mark 'gap'")
        return Mark("gap", after, dropped=dropped)
    reason = obj["stopped"]
    if not isinstance(reason, str):
        raise LogLineError(f"mark 'stopped' must be a string, not {json.dumps(reason)[:60]}")
    return Mark("stopped", after, reason=reason)


def mark_of(meta: Mapping[bytes, bytes] | None, source: str) -> Mark | None:
    """The mark an event table's schema metadata carries, if any (InputError: a bad
    one)."""
    return stored(None if meta is None else meta.get(MARK_KEY.encode()), source)


def stored(raw: str | bytes | None, source: str) -> Mark | None:
    """A mark as ``Mark.to_json`` wrote it (None: none; InputError: a bad one)."""
    if raw is None:
        return None
    try:
        mark = Mark(**json.loads(raw))
        if mark.kind not in MARK_KEYS:
            raise ValueError(f"kind {mark.kind!r} is not one of {', '.join(MARK_KEYS)}")
        # the same values a mark line may have (mark_from)
        if mark.after_step is not None:
            as_count(mark.after_step, "mark 'after_step'")
        as_count(mark.lines_after, "mark 'lines_after'")
        if mark.kind == "gap":
            as_count(mark.dropped, "mark 'dropped'")
            if mark.reason is not None:
                raise ValueError("a gap mark has no 'reason'")
        else:
            if not isinstance(mark.reason, str):
                raise ValueError(f"mark 'reason' must be a string, not {json.dumps(mark.reason)}")
            if mark.dropped is not None:
                raise ValueError("a stopped mark has no 'dropped'")
    except (ValueError, TypeError, LogLineError) as e:
        raise InputError(f"{source}: bad recorder mark in the schema metadata: {e}") from None
    return mark


def with_mark(table: pa.Table, mark: Mark | None, lines_after: int | None = None) -> pa.Table:
    """``table`` with ``mark`` (and the lines read past it) in its schema metadata; None:
    the table as it is."""
    if mark is None:
        return table
    if lines_after is not None:
        mark = replace(mark, lines_after=lines_after)
    meta = {**(table.schema.metadata or {}), MARK_KEY.encode(): mark.to_json().encode()}
    return table.replace_schema_metadata(meta)
