"""Byte addresses of K and V from recorded layouts, against the arrays themselves: the
address the SQL macro computes for every token, layer and head equals the address of
that element in the tensor (numpy here; torch's ``tensor[index].data_ptr()`` in the
engines tier)."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

import pagedkv_sql
from pagedkv_sql.engines import layout
from pagedkv_sql.engines.snapshot import CacheTensor
from pagedkv_sql.engines.tables import EngineState, Pool, table, write

from .helpers import BLOCK, state, with_group

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


def test_a_tensor_without_layer_holds_layer_0_and_addresses_are_values() -> None:
    dims = ("block", "kv", "slot", "head", "dim")
    t = CacheTensor("kv", (2, 2, BLOCK, 1, 1), (2 * BLOCK, BLOCK, 1, 1, 1), "f2", 2, dims, 0)
    assert layout.holds(t, 0, 1) and not layout.holds(t, 1, 1)
    # a tensor that names neither K nor V (no kv, no kv / kvdim dimension) holds neither
    plain = dataclasses.replace(t, shape=(2, BLOCK, 1, 1), dims=("block", "slot", "head", "dim"))
    assert not layout.holds(plain, 0, 0) and not layout.holds(plain, 0, 1)
    a = layout.KVAddress("K", "kv", 1, 2, 0x100, True)
    with pytest.raises(dataclasses.FrozenInstanceError):
        a.address = 0  # type: ignore[misc]
    with pytest.raises(dataclasses.FrozenInstanceError):
        t.pointer = 0  # type: ignore[misc]


def test_pools_take_their_own_tensors_and_round_unaligned_blocks_up() -> None:
    dims = ("block", "slot", "head", "dim")
    t0 = CacheTensor("a", (4, BLOCK, 1, 8), (8 * BLOCK, 8, 8, 1), "f2", 2, dims, 1 << 20, pool=0)
    t1 = CacheTensor("b", (6, BLOCK, 1, 4), (4 * BLOCK, 4, 4, 1), "f2", 2, dims, 1 << 21, pool=1)
    pool = Pool.from_tensors(1, "second", [t0, t1], BLOCK)
    assert (pool.pointer, pool.block_bytes, pool.num_blocks) == (1 << 21, 4 * BLOCK * 2, 6)
    assert Pool(0, "kv", block_bytes=300).addressing(2)[:2] == (2 << 40, 512)
    assert Pool(0, "kv", pointer=100, block_bytes=512).addressing(0)[:2] == (0, 512)
    with pytest.raises(dataclasses.FrozenInstanceError):
        pool.num_blocks = 7  # type: ignore[misc]


def test_a_token_dim_pool_has_blocks_of_page_size_tokens() -> None:
    # SGLang's per-layer [slots, heads, dim] buffers: a page is page_size slots
    dims = ("token", "head", "dim")
    t = CacheTensor("k_buffer.0", (64, 2, 8), (16, 8, 1), "bfloat16", 2, dims, 1 << 20, kv=0)
    pool = Pool.from_tensors(0, "kv_pool", [t], BLOCK)
    assert (pool.block_bytes, pool.num_blocks) == (16 * 2 * BLOCK, 64 // BLOCK)


def test_an_element_index_needs_a_name_for_every_dimension() -> None:
    t = CacheTensor("kv", (2, BLOCK, 4), (BLOCK * 4, 4, 1), "f2", 2, ("block", "slot"), 0)
    with pytest.raises(ValueError, match="zip"):
        layout.element_index(t, 1, 0, BLOCK, 0, 0, 0)


def test_a_pool_is_described_by_its_k_tensor_even_listed_after_v() -> None:
    dims = ("block", "slot", "head", "dim")
    shape, strides = (4, BLOCK, 1, 8), (8 * BLOCK, 8, 8, 1)
    v = CacheTensor("v", shape, strides, "f2", 2, dims, 2 << 20, kv=1, layer=0)
    k = CacheTensor("k", shape, strides, "f2", 2, dims, 1 << 20, kv=0, layer=0)
    assert Pool.from_tensors(0, "kv", [v, k], BLOCK).pointer == 1 << 20


def test_a_tensor_with_a_layer_dimension_holds_its_recorded_layer_or_all() -> None:
    dims = ("layer", "block", "kv", "slot", "head", "dim")
    t = CacheTensor("kv", (3, 2, 2, BLOCK, 1, 1), (0, 0, 0, 0, 0, 0), "f2", 2, dims, 0)
    assert [layout.holds(t, n, 0) for n in range(3)] == [True, True, True]
    one = dataclasses.replace(t, layer=1)
    assert [layout.holds(one, n, 0) for n in range(3)] == [False, True, False]


def test_kv_addresses_of_group_0_and_the_last_block_of_the_tensor(
    db: pagedkv_sql.Database,
) -> None:
    # a [2, 2, BLOCK, 1, 1] cache holds blocks 0 and 1: block 1 is its last block (in
    # bounds), block 2 is one past it (not); group 1's block 7 has no address here
    st = state({"req-a": [1, 2]})
    with_group(st, [(0, 0, 7)])
    shape = (2, 2, BLOCK, 1, 1)
    strides = (2 * BLOCK, BLOCK, 1, 1, 1)
    dims = ("block", "kv", "slot", "head", "dim")
    st.cache_tensors = [CacheTensor("kv", shape, strides, "float16", 2, dims, 1 << 20)]
    write(db.con, st, "tensor")
    rows = db.sql(
        "SELECT block_id, kv, count(*), bool_and(in_bounds), bool_or(in_bounds) "
        "FROM pagedkv_kv_address(0, 0) GROUP BY ALL ORDER BY ALL"
    ).fetchall()
    assert rows == [
        (1, "K", BLOCK, True, True),
        (1, "V", BLOCK, True, True),
        (2, "K", BLOCK, False, False),
        (2, "V", BLOCK, False, False),
    ]


# -- overflows are named by field, never DuckDB's "Overflow in multiplication" ---------------
def vllm_on(tensor: CacheTensor, block_ids: list[int]) -> Any:
    from pagedkv_sql.engines import Snapshot

    arrays = {
        "block_table": np.array([block_ids], np.int32),
        "num_blocks_per_row": np.array([len(block_ids)], np.int32),
    }
    return Snapshot("vllm", arrays, {"block_size": 16}, [tensor])


DIMS = ("block", "kv", "slot", "head", "dim")
WIDE = CacheTensor(  # strides of 2^38 elements: a block id of 2^31 passes 2^63 bytes
    "kv", (4, 2, 16, 1, 8), (2**38, 2**37, 8, 8, 1), "float16", 2, DIMS, 2**40
)


def test_a_block_whose_address_passes_64_bits_is_refused_naming_pool_and_block(
    db: pagedkv_sql.Database,
) -> None:
    with pytest.raises(pagedkv_sql.InputError, match=r"block 2147483647 of pool 0 \(kv_cache\)"):
        db.load_engine(vllm_on(WIDE, [1, 2**31 - 1]))
    assert db.sql("SELECT count(*) FROM engine_request").fetchall() == [(0,)]


def test_an_address_outside_the_tensor_is_computed_without_overflow(
    db: pagedkv_sql.Database,
) -> None:
    db.load_engine(vllm_on(WIDE, [1, 3]))
    k, v = db.kv_addresses(0, 17, 0, 0)
    assert (k.address, v.address) == (
        2**40 + 2 * (3 * 2**38 + 8),
        2**40 + 2 * (3 * 2**38 + 2**37 + 8),
    )
    far = db.kv_addresses(0, 17, 0, 2**31 - 1)  # head far outside: 2^31 * 8 * 2 bytes more
    assert [a.in_bounds for a in far] == [False, False]
    assert far[0].address == k.address + (2**31 - 1) * 8 * 2
    for layer, head in ((0, 2**31), (-1, 0)):
        with pytest.raises(pagedkv_sql.UsageError, match=r"is outside \[0, 2\^31 - 1\]"):
            db.kv_addresses(0, 17, layer, head)
