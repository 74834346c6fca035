"""vLLM's KV-cache groups (``kv_cache_config.kv_cache_groups``, one
``coordinator.single_type_managers[g]`` each, all over one shared block pool): what a group
is, read from a live manager for a snapshot's metadata, and checked and mapped to the
``engine_kv_group`` table on import (docs/engines.md, "KV-cache groups").

A group has a kind, a block size (groups may differ: a Mamba group without prefix caching
has one block of ``max_model_len`` tokens), a window and its layers' names. The kinds keep
the names of vLLM's ``KVCacheSpecKind``:

- ``full_attention`` (``FullAttentionSpec`` and the specs that keep every token like it:
  ``MLAAttentionSpec``, ``SinkFullAttentionSpec``, ``CrossAttentionSpec``);
- ``sliding_window`` (``SlidingWindowSpec``, ``SlidingWindowMLASpec``): window W tokens;
- ``chunked_local_attention`` (``ChunkedLocalAttentionSpec``): chunk C tokens;
- ``mamba`` (``MambaSpec``): per-request state blocks, not tokens.

Any other spec class is refused by name, never guessed: its manager may keep tokens in a
way none of these describes (vLLM's ``RSWASpec`` frees a gap in the middle). The primary
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
from .meta import KV_GROUP_KINDS
from .snapshot import Snapshot
from .tables import table

KINDS = KV_GROUP_KINDS
FULL, SLIDING, CHUNKED, MAMBA = KINDS
WINDOWED = {SLIDING: "sliding_window", CHUNKED: "attention_chunk_size"}  # kind -> meta key
# vLLM's spec classes (v1/kv_cache_interface.py) by exact class name: a subclass is a spec
# of its own, whose manager may keep tokens otherwise
SPEC_KINDS = {
    "FullAttentionSpec": FULL,
    "MLAAttentionSpec": FULL,
    "SinkFullAttentionSpec": FULL,
    "CrossAttentionSpec": FULL,
    "SlidingWindowSpec": SLIDING,
    "SlidingWindowMLASpec": SLIDING,
    "ChunkedLocalAttentionSpec": CHUNKED,
    "MambaSpec": MAMBA,
}
UNIFORM = "UniformTypeKVCacheSpecs"  # several layers' specs of one type, as one group's


def spec_kind(spec: Any, group: int) -> str:
    """The kind of a group's ``KVCacheSpec`` (``UniformTypeKVCacheSpecs``: its layers'
    one kind); an ``InputError`` naming the class for a spec this module does not know."""
    name = type(spec).__name__
    if name == UNIFORM:
        inner = {spec_kind(s, group) for s in dict(spec.kv_cache_specs).values()}
        if len(inner) == 1:
            return inner.pop()
        name = f"{UNIFORM} of {sorted(inner)}"
    elif name in SPEC_KINDS:
        return SPEC_KINDS[name]
    raise InputError(
        f"cannot capture KV-cache group {group}: its spec {name} is not one pagedkv-sql "
        f"models ({', '.join(sorted(SPEC_KINDS))}); nothing was captured",
        hint="its manager's token retention is not known here; report the spec class "
        "(https://github.com/pagedkv-sql/pagedkv-sql/issues)",
    )


def _window(spec: Any, key: str) -> int | None:
    if type(spec).__name__ == UNIFORM:
        values = {_window(s, key) for s in dict(spec.kv_cache_specs).values()}
        return values.pop() if len(values) == 1 else None
    value = getattr(spec, key, None)
    return None if value is None else int(value)


def describe(kv_cache_manager: Any, managers: Sequence[Any]) -> list[dict[str, Any]]:
    """Each group of a live manager as snapshot metadata: kind, block_size (its manager's),
    sliding_window and attention_chunk_size (null unless its kind has one), layer_names
    (from the manager's ``kv_cache_config``, empty where it has none)."""
    config = getattr(kv_cache_manager, "kv_cache_config", None)
    specs = list(getattr(config, "kv_cache_groups", None) or [])
    out = []
    for g, manager in enumerate(managers):
        spec = manager.kv_cache_spec
        kind = spec_kind(spec, g)
        layers = [str(n) for n in specs[g].layer_names] if g < len(specs) else []
        out.append(
            {
                "kind": kind,
                "block_size": int(manager.block_size),
                "sliding_window": _window(spec, "sliding_window") if kind == SLIDING else None,
                "attention_chunk_size": (
                    _window(spec, "attention_chunk_size") if kind == CHUNKED else None
                ),
                "layer_names": layers,
            }
        )
    return out


def primary(kinds: Sequence[str | None]) -> int:
    """The group the spec's relations describe: the first full_attention group, else 0."""
    return next((g for g, k in enumerate(kinds) if k == FULL), 0)


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
        kinds: tuple[str | None, ...] = (FULL,) if groups == 1 else (None,) * groups
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
    if kind in WINDOWED:
        key = WINDOWED[kind]
        window = entry.get(key)
        if window is None:
            raise InputError(
                f"{where}[{g}] is a {kind} group without its {key}",
                hint=f"a {kind} group keeps the tokens of its window: record its {key}",
            )
    names = tuple(entry.get("layer_names") or ())
    return kind, int(entry["block_size"]), None if window is None else int(window), names
