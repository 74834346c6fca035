"""Real byte addresses of a token's K and V, from recorded cache-tensor layouts.

The spec's ``physical_address`` is ``base + offset``, unscaled, and stays so. Beside it,
the address of the first element of the K (and V) vector of one token, layer and head is
``pointer + itemsize * sum(index[d] * stride[d])`` over the tensor's dimensions, where
each dimension's index comes from its recorded meaning (``CacheTensor.dims``):

    block -> the block id        slot  -> the token's slot in the block
    token -> block * B + slot    head  -> the head       dim -> 0
    kv    -> 0 for K, 1 for V    kvdim -> kv * (size / 2) (K and V side by side)
    layer -> the layer

Nothing assumes a layout: vLLM's ``(2, nb, bs, H, D)``, ``(nb, 2, bs, H, D)`` and
``(nb, H, bs, 2*D)``, FlashInfer's NHD / HND (one 5-D tensor or a K, V pair),
SGLang's per-layer ``[slots, H, D]`` buffers and TensorRT-LLM's
``[blocks, layers, 2, H, T, D]`` pools are all just dims, shape and strides.
The same arithmetic is the SQL macro ``pagedkv_kv_address`` (sql/engines.sql).
"""

from __future__ import annotations

from dataclasses import dataclass

import duckdb

from ..dbutil import scalar
from ..errors import UsageError
from ..kv_groups import MAMBA
from ..limits import INT32_MAX
from .snapshot import CacheTensor
from .tables import has_engine_tables, query

KV_NAMES = ("K", "V")
DIMS = ("block", "slot", "token", "head", "dim", "kv", "kvdim", "layer")


def holds(tensor: CacheTensor, layer: int, kv: int) -> bool:
    """Whether ``tensor`` holds the K (kv=0) or V (kv=1) of ``layer``. A tensor recorded
    without a layer and without a layer dimension is layer 0's."""
    if tensor.kv is not None and tensor.kv != kv:
        return False
    if tensor.kv is None and "kv" not in tensor.dims and "kvdim" not in tensor.dims:
        return False
    if "layer" in tensor.dims:
        return tensor.layer is None or tensor.layer == layer
    return (tensor.layer if tensor.layer is not None else 0) == layer


def element_index(
    tensor: CacheTensor, block_id: int, slot: int, block_size: int, layer: int, head: int, kv: int
) -> tuple[int, ...]:
    """The index, one per dimension, of the first element of the K / V vector."""
    index = []
    for name, size in zip(tensor.dims, tensor.shape, strict=True):
        if name == "block":
            i = block_id
        elif name == "slot":
            i = slot
        elif name == "token":
            i = block_id * block_size + slot
        elif name == "head":
            i = head
        elif name == "dim":
            i = 0
        elif name == "kv":
            i = kv
        elif name == "kvdim":
            i = kv * (size // 2)
        elif name == "layer":
            i = layer
        else:
            raise UsageError(f"{tensor.name}: unknown dimension name '{name}'; known: {DIMS}")
        if not 0 <= i < size:
            raise UsageError(
                f"{tensor.name}: {name} index {i} is outside the tensor's {size} (shape "
                f"{list(tensor.shape)}, dims {list(tensor.dims)})"
            )
        index.append(i)
    return tuple(index)


def address(
    tensor: CacheTensor, block_id: int, slot: int, block_size: int, layer: int, head: int, kv: int
) -> int:
    """The byte address of the first element of the token's K or V vector."""
    if tensor.pointer is None:
        raise UsageError(f"{tensor.name}: no data pointer was recorded")
    index = element_index(tensor, block_id, slot, block_size, layer, head, kv)
    offset = sum(i * s for i, s in zip(index, tensor.strides, strict=True))
    return tensor.pointer + offset * tensor.itemsize


@dataclass(frozen=True)
class KVAddress:
    kv: str  # "K" | "V"
    tensor: str
    block_id: int
    slot: int
    address: int
    in_bounds: bool  # false: an index is outside the tensor's shape


def token_addresses(
    con: duckdb.DuckDBPyConnection, seq_id: int, token_pos: int, layer: int, head: int
) -> list[KVAddress]:
    """The K and V byte addresses of one token for a layer and head, computed in SQL
    (the pagedkv_kv_address macro) from the tensors an import recorded: in the layer's
    KV-cache group, its block list and block size (``engine_layer_group``)."""
    for name, n in (("layer", layer), ("head", head)):
        if not 0 <= n <= INT32_MAX:
            raise UsageError(f"{name} {n} is outside [0, 2^31 - 1]")
    if not has_engine_tables(con) or not scalar(con, "SELECT count(*) FROM engine_cache_tensor"):
        raise UsageError(
            "no cache-tensor layouts are stored: byte addresses need an engine snapshot "
            "with cache tensors (https://github.com/pagedkv-sql/pagedkv-sql/blob/main/docs/engines.md)"
        )
    _layer_group(con, layer)
    rows = con.execute(query("token_kv_address"), [layer, head, seq_id, token_pos]).fetchall()
    return [KVAddress(KV_NAMES[kv], name, b, s, a, ok) for kv, name, b, s, a, ok in rows]


def _layer_group(con: duckdb.DuckDBPyConnection, layer: int) -> None:
    """A ``UsageError`` where the layer's KV-cache group gives its tokens no K and V: a
    layer two groups name, or a Mamba group's (its blocks hold a state, not tokens)."""
    if not scalar(
        con, "SELECT count(*) FROM duckdb_views() WHERE view_name = 'engine_layer_group'"
    ):
        return  # the views of an import by a version before groups
    rows = con.execute(
        "SELECT DISTINCT group_id, kind FROM engine_layer_group WHERE layer = ? ORDER BY ALL",
        [layer],
    ).fetchall()
    if len(rows) > 1:
        named = " and ".join(str(g) for g, _ in rows)
        raise UsageError(
            f"layer {layer} is named by KV-cache groups {named}: its block list is ambiguous",
            hint="record each layer's cache tensor under its layer name (CacheTensor.of(name, "
            "..., layer=)) so that its group is known",
        )
    if rows and rows[0][1] == MAMBA:
        raise UsageError(
            f"layer {layer} is in KV-cache group {rows[0][0]}, a mamba group: its blocks hold "
            "each request's state, not tokens, so a token has no K and V there"
        )
