"""A router's index as Dynamo dumps it: the elements of ``RadixTree.dump_tree_as_events()``
(each a ``RouterEvent``: worker_id, storage_tier, and an event with its dp_rank and the
``stored`` blocks; a dp_rank beside the event read too), or the standalone indexer's
``GET /dump`` JSON (an object whose ``events`` are the same elements), as rows (replica,
dp_rank, tier, block_hash). Standard library only."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any


def dump_elements(dump: Any) -> list[Any]:
    """The elements of one dump: a list of them, or an object holding them under
    ``events`` (``GET /dump``; ``dump`` and ``entries`` accepted too)."""
    if isinstance(dump, list):
        return dump
    if isinstance(dump, dict):
        for key in ("events", "dump", "entries"):
            if isinstance(dump.get(key), list):
                return list(dump[key])
    raise ValueError(
        "an index dump must be a list of Dynamo RouterEvents (dump_tree_as_events) or an "
        "object with an 'events' list (the standalone indexer's GET /dump)"
    )


def _stored(element: Mapping[str, Any]) -> Mapping[str, Any]:
    event = element.get("event", element)
    data = event.get("data", event) if isinstance(event, dict) else None
    stored = data.get("stored") if isinstance(data, dict) else None
    if not isinstance(stored, dict) or not isinstance(stored.get("blocks"), list):
        raise ValueError("a dump element must hold a 'stored' event with its 'blocks'")
    return stored


def dump_rows(
    elements: list[Any],
    workers: Mapping[tuple[Any, Any], str],
    by_worker: Mapping[Any, str],
) -> Iterator[tuple[str, int, str, int]]:
    """Each block of each element: (replica, dp_rank, tier, block_hash), the worker id
    mapped to a replica by fleet.json (by worker id and rank, else by worker id)."""
    for i, element in enumerate(elements):
        if not isinstance(element, dict):
            raise ValueError(f"dump element {i} is not an object")
        worker = element.get("worker_id")
        event = element.get("event")  # Dynamo 1.6.1 keeps the rank inside the event
        inner = event.get("dp_rank") if isinstance(event, dict) else None
        rank = inner if inner is not None else element.get("dp_rank") or 0
        replica = workers.get((worker, rank), by_worker.get(worker))
        if replica is None:
            raise ValueError(f"dump element {i}: worker_id {worker} is no replica of fleet.json")
        tier = str(element.get("storage_tier") or "device")
        for block in _stored(element)["blocks"]:
            if not isinstance(block, dict) or "block_hash" not in block:
                raise ValueError(f"dump element {i}: a block without its 'block_hash'")
            yield replica, int(rank), tier, block["block_hash"]
