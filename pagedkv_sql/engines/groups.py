"""A snapshot's KV-cache groups, whatever its engine (vLLM's ``kv_cache_groups``; SGLang's
full and sliding-window pools and its Mamba state slots): read from the snapshot's metadata
``kv_cache_groups``, checked, and mapped to the ``engine_kv_group`` table on import
(docs/engines.md, "KV-cache groups"). The kinds and their window keys are kv_groups.py's.

A group has a kind, a block size (groups may differ: a Mamba group without prefix caching
has one block of ``max_model_len`` tokens), a window and its layers' names. The primary
group, the one the spec's relations describe, is the lowest-index ``full_attention`` group,
else group 0.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa

from ..errors import InputError
from ..kv_groups import FULL_ATTENTION, WINDOW_KEYS
from .snapshot import Snapshot
from .tables import table


def primary(kinds: Sequence[str | None]) -> int:
    """The group the spec's relations describe: the first full_attention group, else 0."""
    return next((g for g, k in enumerate(kinds) if k == FULL_ATTENTION), 0)


@dataclass(frozen=True)
class Groups:
    """A snapshot's KV-cache groups, checked: one entry a group of ``block_table``."""

    kinds: tuple[str | None, ...]  # None: not recorded (a snapshot from before groups)
    block_sizes: tuple[int, ...]
    windows: tuple[int | None, ...]
    layers: tuple[tuple[str, ...], ...]
    primary: int

    def table(self) -> pa.Table:
        n = len(self.kinds)
        return table(
            "engine_kv_group",
            group_id=np.arange(n, dtype=np.int64),
            kind=list(self.kinds),
            block_size=np.array(self.block_sizes, dtype=np.int64),
            window_tokens=list(self.windows),
            layers=[list(x) for x in self.layers],
            is_primary=[g == self.primary for g in range(n)],
        )


def read(snap: Snapshot, groups: int) -> Groups:
    """The snapshot's groups from meta ``kv_cache_groups``, checked against its
    ``groups`` block tables and its ``block_size`` (the primary group's). A snapshot without
    them (taken before groups were recorded) has them as it was read then: one group is
    full_attention; of several, no kind is known (the spec's relations from group 0)."""
    given = snap.meta.get("kv_cache_groups")
    size = snap.block_size
    if given is None:
        kinds: tuple[str | None, ...] = (FULL_ATTENTION,) if groups == 1 else (None,) * groups
        return Groups(kinds, (size,) * groups, (None,) * groups, ((),) * groups, 0)
    where = f"{snap.source}: metadata 'kv_cache_groups'"
    if len(given) != groups:
        raise InputError(f"{where} has {len(given)} group(s); block_table has {groups}")
    parsed = [_group(g, entry, where) for g, entry in enumerate(given)]
    kinds = tuple(p[0] for p in parsed)
    first = primary(kinds)
    if parsed[first][1] != size:
        raise InputError(
            f"{where}[{first}] (the primary group, {kinds[first]}) has block_size "
            f"{parsed[first][1]}, but the snapshot's block_size is {size}",
            hint="the snapshot's block_size is its primary group's (the first full-attention "
            "group, else group 0)",
        )
    return Groups(
        kinds,
        tuple(p[1] for p in parsed),
        tuple(p[2] for p in parsed),
        tuple(p[3] for p in parsed),
        first,
    )


def _group(
    g: int, entry: Mapping[str, Any], where: str
) -> tuple[str, int, int | None, tuple[str, ...]]:
    """(kind, block_size, window, layer names) of one entry (its types checked by the
    metadata's schema), or an InputError where a kind lacks its window."""
    kind = str(entry["kind"])
    window = None
    if kind in WINDOW_KEYS:
        key = WINDOW_KEYS[kind]
        window = entry.get(key)
        if window is None:
            raise InputError(
                f"{where}[{g}] is a {kind} group without its {key}",
                hint=f"a {kind} group keeps the tokens of its window: record its {key}",
            )
    names = tuple(entry.get("layer_names") or ())
    return kind, int(entry["block_size"]), None if window is None else int(window), names
