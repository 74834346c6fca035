"""Byte addresses of K and V from recorded layouts, against the arrays themselves: the
address the SQL macro computes for every token, layer and head equals the address of
that element in the tensor (numpy here; torch's ``tensor[index].data_ptr()`` in the
engines tier)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

import pagedkv_sql
from pagedkv_sql.engines import layout
from pagedkv_sql.engines.snapshot import CacheTensor
from pagedkv_sql.engines.tables import EngineState, Pool, table, write

NB, BS, H, D, LAYERS = 6, 4, 3, 8, 2
BLOCKS = [4, 1, 3]  # one request, 10 tokens
TOKENS = 10

# name -> (shape, dims, how K/V are split: "dim" (a kv or kvdim dimension) or "pair")
LAYOUTS: dict[str, tuple[tuple[int, ...], tuple[str, ...], str]] = {
    "vllm (2, nb, bs, H, D)": ((2, NB, BS, H, D), ("kv", "block", "slot", "head", "dim"), "dim"),
    "vllm (nb, 2, bs, H, D)": ((NB, 2, BS, H, D), ("block", "kv", "slot", "head", "dim"), "dim"),
    "vllm (nb, H, bs, 2*D)": ((NB, H, BS, 2 * D), ("block", "head", "slot", "kvdim"), "dim"),
    "flashinfer NHD": ((NB, 2, BS, H, D), ("block", "kv", "slot", "head", "dim"), "dim"),
    "flashinfer HND": ((NB, 2, H, BS, D), ("block", "kv", "head", "slot", "dim"), "dim"),
    "flashinfer NHD pair": ((NB, BS, H, D), ("block", "slot", "head", "dim"), "pair"),
    "flashinfer HND pair": ((NB, H, BS, D), ("block", "head", "slot", "dim"), "pair"),
    "sglang [slots, H, D]": ((NB * BS, H, D), ("token", "head", "dim"), "pair"),
    "trtllm [nb, L, 2, H, T, D]": (
        (NB, LAYERS, 2, H, BS, D),
        ("block", "layer", "kv", "head", "slot", "dim"),
        "dim",
    ),
}


def numpy_tensors(shape: tuple[int, ...], permute: bool) -> Callable[[], Any]:
    def make() -> Any:
        if not permute:
            return np.zeros(shape, dtype=np.float16)
        # allocated in another order, seen through a transposed view: odd strides
        return np.zeros(shape[::-1], dtype=np.float16).transpose(*range(len(shape))[::-1])

    return make


def numpy_address(arr: Any, index: tuple[int, ...]) -> int:
    return int(arr[tuple(slice(i, i + 1) for i in index)].__array_interface__["data"][0])


def torch_address(t: Any, index: tuple[int, ...]) -> int:
    return int(t[index].data_ptr())


def build(name: str, make: Callable[[], Any]) -> tuple[EngineState, list[tuple[CacheTensor, Any]]]:
    _, dims, split = LAYOUTS[name]
    recorded: list[tuple[CacheTensor, Any]] = []
    per_layer = 1 if "layer" in dims else LAYERS
    for layer in range(per_layer):
        lay = None if "layer" in dims else layer
        if split == "pair":
            for kv in (0, 1):
                t = make()
                recorded.append(
                    (CacheTensor.of(f"{'kv'[kv]}.{layer}", t, dims, kv=kv, layer=lay), t)
                )
        else:
            t = make()
            recorded.append((CacheTensor.of(f"kv.{layer}", t, dims, layer=lay), t))
    st = EngineState(
        engine="test",
        block_size=BS,
        requests=table("engine_request", seq_id=[0], request_id=["r"], num_tokens=[TOKENS]),
        block_table=table(
            "engine_block_table",
            seq_id=[0] * len(BLOCKS),
            group_id=[0] * len(BLOCKS),
            block_index=list(range(len(BLOCKS))),
            pool_id=[0] * len(BLOCKS),
            block_id=BLOCKS,
        ),
        pools=[Pool.from_tensors(0, "kv", [c for c, _ in recorded], BS)],
        cache_tensors=[c for c, _ in recorded],
    )
    return st, recorded


def expected(
    recorded: list[tuple[CacheTensor, Any]],
    layer: int,
    head: int,
    kv: int,
    pos: int,
    element_address: Callable[[Any, tuple[int, ...]], int],
) -> int:
    (tensor, arr), *_ = [(c, a) for c, a in recorded if layout.holds(c, layer, kv)]
    block, slot = BLOCKS[pos // BS], pos % BS
    index = layout.element_index(tensor, block, slot, BS, layer, head, kv)
    return element_address(arr, index)


def compare(
    db: pagedkv_sql.Database,
    name: str,
    make: Callable[[], Any],
    element_address: Callable[[Any, tuple[int, ...]], int],
) -> None:
    st, recorded = build(name, make)
    write(db.con, st, "test")
    checked = 0
    for layer in range(LAYERS):
        for head in range(H):
            rows = (
                db.sql(
                    "SELECT token_pos, kv, address, in_bounds FROM pagedkv_kv_address(?, ?) "
                    "ORDER BY ALL",
                    [layer, head],
                )
                .to_arrow_table()
                .to_pylist()
            )
            assert len(rows) == 2 * TOKENS
            for r in rows:
                kv = "KV".index(r["kv"])
                want = expected(recorded, layer, head, kv, r["token_pos"], element_address)
                assert r["address"] == want, (name, layer, head, r)
                assert r["in_bounds"]
                tensor = next(c for c, _ in recorded if layout.holds(c, layer, kv))
                block = BLOCKS[r["token_pos"] // BS]
                py = layout.address(tensor, block, r["token_pos"] % BS, BS, layer, head, kv)
                assert py == want
                checked += 1
    assert checked == LAYERS * H * 2 * TOKENS


@pytest.mark.parametrize("permute", [False, True], ids=["contiguous", "permuted"])
@pytest.mark.parametrize("name", list(LAYOUTS))
def test_addresses_equal_numpy_element_addresses(
    db: pagedkv_sql.Database, name: str, permute: bool
) -> None:
    compare(db, name, numpy_tensors(LAYOUTS[name][0], permute), numpy_address)


@pytest.mark.engines
@pytest.mark.parametrize("name", list(LAYOUTS))
def test_addresses_equal_torch_data_ptr(db: pagedkv_sql.Database, name: str) -> None:
    torch = pytest.importorskip("torch")
    shape = LAYOUTS[name][0]
    compare(db, name, lambda: torch.zeros(shape, dtype=torch.bfloat16), torch_address)
    # a permuted view: strides that no contiguous layout has
    compare(
        db,
        name,
        lambda: torch.zeros(shape[::-1], dtype=torch.float32).permute(*range(len(shape))[::-1]),
        torch_address,
    )


def test_explain_shows_k_and_v(cli: Any) -> None:
    st, recorded = build("flashinfer HND", numpy_tensors(LAYOUTS["flashinfer HND"][0], False))
    with pagedkv_sql.connect(cli.cwd / "pagedkv.duckdb") as db:
        write(db.con, st, "test")
    r = cli("explain", "0", "5", "--layer", "1", "--head", "2")
    assert r.exit_code == 0, r.output
    k = expected(recorded, 1, 2, 0, 5, numpy_address)
    v = expected(recorded, 1, 2, 1, 5, numpy_address)
    assert f"K  layer 1 head 2: kv.1 block 1 slot 1 -> {k:#x}" in r.output
    assert f"V  layer 1 head 2: kv.1 block 1 slot 1 -> {v:#x}" in r.output


def test_layer_outside_the_tensor_is_not_in_bounds(db: pagedkv_sql.Database) -> None:
    st, _ = build(
        "trtllm [nb, L, 2, H, T, D]", numpy_tensors(LAYOUTS["trtllm [nb, L, 2, H, T, D]"][0], False)
    )
    write(db.con, st, "test")
    rows = (
        db.sql("SELECT DISTINCT in_bounds FROM pagedkv_kv_address(5, 0)")
        .to_arrow_table()
        .to_pylist()
    )
    assert rows == [{"in_bounds": False}]
