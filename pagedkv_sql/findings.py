"""One shape for every model's findings, and the one way each renderer prints them.

Each model has its finding class: ``replay.engine.Finding`` (a step log), the fast check's
``engines.fastcheck_state.Finding`` (an engine snapshot in memory), ``check``'s rows of the
spec's and the engine's views, ``live.checker.KVFinding`` (prefix-cache events) and
``live.steplog.StepFinding`` (a step log watched as it grows). Each offers the small protocol
``Finding`` below; the text, JSON, watch, report and metrics renderers read only that, so a
finding prints the same whoever found it:

    step 40: double_free: request r1 releases block 5 which it does not hold (1 holder(s))
      double_free (replay): request r1; block 5; event 812, op release
      cause: ...

``invariant`` is the catalogue's name of the idea (pagedkv_sql/invariants.py), ``check``
the model's own check; ``ordered`` sorts the findings of one place cause before consequence
(the catalogue's ranks). Standard library only.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any, Protocol, runtime_checkable

from . import invariants


@runtime_checkable
class Finding(Protocol):
    """What every model's finding offers its renderers."""

    @property
    def check(self) -> str:
        """The model's own name of the check (a view, a replay query, a checker kind)."""

    @property
    def model(self) -> str:
        """The model that found it: one of ``invariants.MODELS``."""

    @property
    def where(self) -> str:
        """Where it was found, for people: ``step 40``, ``ev.jsonl#12``; "" for a snapshot."""

    @property
    def message(self) -> str:
        """What is wrong, in one sentence naming the request and block ids."""

    @property
    def request_ids(self) -> tuple[str, ...]:
        """The requests it names: the one acting first, then the others involved."""

    @property
    def block_ids(self) -> tuple[int, ...]:
        """The blocks (or pages) it names."""

    @property
    def cause(self) -> str | None:
        """For a consequence, the earlier finding that explains it (one line), else None."""

    def extra(self) -> Mapping[str, Any]:
        """The model's own fields (event, op, expected, found...), in their order."""


def invariant(f: Finding) -> str:
    """The catalogue's name of the idea ``f`` breaks (see ``idea``)."""
    return idea(f.model, f.check)


def rank(f: Finding) -> int:
    return invariants.rank_of(f.model, f.check)


def ordered(found: Iterable[Finding]) -> list[Finding]:
    """The findings of one place (a step, a snapshot, a batch) cause before consequence:
    by the catalogue's rank, the order they came in otherwise."""
    return sorted(found, key=rank)


def _ids(f: Finding) -> str:
    parts = []
    if f.request_ids:
        label = "request" if len(f.request_ids) == 1 else "requests"
        parts.append(f"{label} {', '.join(f.request_ids)}")
    if f.block_ids:
        label = "block" if len(f.block_ids) == 1 else "blocks"
        parts.append(f"{label} {', '.join(str(b) for b in f.block_ids)}")
    return "; ".join(parts)


def idea(model: str, check: str) -> str:
    """The catalogue's name of the idea ``model``'s ``check`` breaks (the check's own name
    when the catalogue does not know it: a check of an engine newer than this package)."""
    try:
        return invariants.idea_of(model, check).name
    except KeyError:
        return check


def _name(f: Finding) -> str:
    """The idea, and the model's check when it has another name (``invariants.name_of``)."""
    return invariants.name_of(f.model, f.check)


def line(f: Finding) -> str:
    """One line: where, the idea and the check, what is wrong, and the ids it names (lists,
    assertion messages, watch)."""
    head = f"{f.where}: " if f.where else ""
    ids = _ids(f)
    cause = f" (cause: {f.cause})" if f.cause else ""
    return f"{head}{_name(f)}: {f.message}" + (f" [{ids}]" if ids else "") + cause


def text(f: Finding) -> list[str]:
    """The long form, a finding on its own: the line, then the check and every id, then
    its cause."""
    head = f"{f.where}: " if f.where else ""
    lines = [f"{head}{invariant(f)}: {f.message}"]
    parts = [p for p in (_ids(f),) if p]
    parts += [f"{k} {v}" for k, v in f.extra().items() if v is not None and v != ""]
    lines.append(f"  {f.check} ({f.model})" + (f": {'; '.join(parts)}" if parts else ""))
    if f.cause:
        lines.append(f"  cause: {f.cause}")
    return lines


def record(f: Finding) -> dict[str, Any]:
    """The shared keys every model's finding has, as plain data."""
    return {
        "invariant": invariant(f),
        "check": f.check,
        "model": f.model,
        "where": f.where,
        "message": f.message,
        "requests": list(f.request_ids),
        "blocks": list(f.block_ids),
        "cause": f.cause,
    }


def as_dict(f: Finding) -> dict[str, Any]:
    """The JSON form: the shared keys, then the model's own."""
    return {**record(f), **dict(f.extra())}


TABLE_HEADER = ("where", "invariant", "check", "requests", "blocks", "message")


def table_row(f: Finding) -> list[Any]:
    """One row of a text table of findings (``TABLE_HEADER``)."""
    return [
        f.where,
        invariant(f),
        f.check,
        ",".join(f.request_ids),
        ",".join(str(b) for b in f.block_ids),
        f.message + (f" (cause: {f.cause})" if f.cause else ""),
    ]


def counts(found: Iterable[Finding]) -> dict[str, int]:
    """How many findings of each idea."""
    out: dict[str, int] = {}
    for f in found:
        name = invariant(f)
        out[name] = out.get(name, 0) + 1
    return out


def cause_of(f: Finding, earlier: Sequence[Finding]) -> Finding | None:
    """Among ``earlier`` (at the same place or before, in order), the last finding of an
    idea that can cause ``f``'s, naming one of its blocks or requests; None if there is
    none (then ``f`` is a root cause itself)."""
    try:
        causes = set(invariants.idea_of(f.model, f.check).causes)
    except KeyError:
        return None
    if not causes:
        return None
    blocks, requests = set(f.block_ids), set(f.request_ids)
    for g in reversed(earlier):
        if g is f or invariant(g) not in causes:
            continue
        if blocks & set(g.block_ids) or (not blocks and requests & set(g.request_ids)):
            return g
    return None


def cause_text(g: Finding) -> str:
    """How a consequence names its cause: the idea, where, and the ids."""
    head = f" at {g.where}" if g.where else ""
    ids = _ids(g)
    return f"{invariant(g)}{head}" + (f" ({ids})" if ids else "")
