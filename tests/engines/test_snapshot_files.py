"""engines/snapshot_files.py: the members of an .npz or .safetensors file read only when
asked and within a declared size; metadata held to its schema; a foreign, truncated or
non-regular file refused naming it."""

from __future__ import annotations

import json
import sys
import zipfile
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from pagedkv_sql import engines
from pagedkv_sql.engines import Snapshot, read
from pagedkv_sql.errors import InputError, UsageError

from .helpers import CSR, I32, flashinfer_header, import_module, load_engine_file, write_npz


def test_a_snapshot_file_records_format_version_1(tmp_path: Path) -> None:
    path = Snapshot("vllm", {}, {"block_size": 16}).save(tmp_path / "s.npz")
    with np.load(path) as npz:
        assert json.loads(str(npz["pagedkv"]))["format_version"] == 1


def test_metadata_that_is_not_json_is_named(tmp_path: Path) -> None:
    path = tmp_path / "bad.npz"
    np.savez(path, pagedkv=np.array("{not json"))
    with pytest.raises(InputError, match="pagedkv metadata is not valid JSON"):
        read(path)


def test_a_block_size_that_is_not_a_number_is_named() -> None:
    for value in ("sixteen", [16]):
        with pytest.raises(InputError, match="is not an integer"):
            _ = Snapshot("vllm", {}, {"block_size": value}).block_size


def test_a_snapshot_with_pickled_objects_is_not_read(tmp_path: Path) -> None:
    path = tmp_path / "pickled.npz"
    np.savez(path, block_table=np.array([{"a": 1}], dtype=object))
    with pytest.raises(InputError, match=r"not a readable \.npz snapshot"):
        read(path, "vllm")


def test_safetensors_missing_is_a_usage_error_with_the_extra_to_install(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, "safetensors", None)  # an install without the extra
    monkeypatch.setitem(sys.modules, "safetensors.numpy", None)
    with pytest.raises(UsageError, match="need the safetensors package"):
        Snapshot("vllm", {}, {"block_size": 16}).save(tmp_path / "s.safetensors")


@pytest.mark.parametrize(
    ("meta", "message"),
    [
        ({"page_size": 16.9}, r"metadata page_size 16\.9 is not an integer"),
        ({"page_size": True}, r"metadata page_size true is not an integer"),
        ({"page_size": "16"}, r'metadata page_size "16" is not an integer'),
        ({"page_size": 16.0}, r"metadata page_size 16\.0 is not an integer"),
        ({"request_ids": "ab"}, r'metadata request_ids "ab" is not a list'),
        ({"request_ids": 5}, r"metadata request_ids 5 is not a list"),
        ({"request_ids": [{"x": 1}, None]}, r'metadata request_ids\[0\] \{"x": 1\} is not a str'),
        ({"request_ids": ["a", 7]}, r"metadata request_ids\[1\] 7 is not a string"),
        ({"num_pages": "abc"}, r'metadata num_pages "abc" is not an integer'),
        ({"num_pages": 0}, r"metadata num_pages 0 is outside \[1, 2\^31 - 1\]"),
        ({"kv_layout": "nhd"}, r'metadata kv_layout "nhd" is not one of "NHD", "HND"'),
        ({"page_sise": 16}, r"key \"page_sise\" is unknown \(did you mean 'page_size'\?\)"),
        ({"block_size": 32}, r"metadata block_size 32, page_size 16 disagree"),
        ({"seq_ids": [0, -1]}, r"metadata seq_ids\[1\] -1 is outside"),
        ({"refused": [{"seq_id": 1, "reason": 5}]}, r"refused\[0\]\.reason 5 is not a string"),
    ],
)
def test_flashinfer_metadata_of_the_wrong_type_or_range_is_refused_naming_the_key(
    tmp_path: Path, meta: dict[str, Any], message: str
) -> None:
    # refused, never coerced (16.9 -> 16, true -> 1, "ab" -> two requests 'a', 'b')
    path = write_npz(tmp_path / "m.npz", flashinfer_header(meta))
    with pytest.raises(InputError, match=message):
        load_engine_file(path)


@pytest.mark.parametrize(
    ("engine", "meta", "message"),
    [
        ("vllm", {"null_block": "x"}, r'metadata null_block "x" is not an integer'),
        ("vllm", {"num_blocks": "x"}, r'metadata num_blocks "x" is not an integer'),
        ("vllm", {"num_free_blocks": "abc"}, r"metadata num_free_blocks \"abc\" is not an"),
        ("vllm", {"block_hashes": [1]}, r"metadata block_hashes \[1\] is not an object"),
        ("vllm", {"block_hashes": {"1": 5}}, r"metadata block_hashes\[1\] 5 is not a string"),
        ("vllm", {"block_hashes": {"one": "ab"}}, r'block_hashes key "one" is not a block id'),
        ("vllm", {"free_queue_complete": "yes"}, r"free_queue_complete \"yes\" is not a JSON"),
        ("sglang", {"num_pages": "x"}, r'metadata num_pages "x" is not an integer'),
        ("sglang", {"free_rows": [1, 2.5]}, r"metadata free_rows\[1\] 2\.5 is not an integer"),
        ("trtllm", {"beam_width": "x"}, r'metadata beam_width "x" is not an integer'),
        ("trtllm", {"num_layers": ["two"]}, r'metadata num_layers\[0\] "two" is not an integer'),
        ("trtllm", {"layer_first": "false"}, r'layer_first "false" is not a JSON boolean'),
        ("trtllm", {"layer_first": 0}, r"layer_first 0 is not a JSON boolean"),
        ("trtllm", {"kv_factor": 0}, r"metadata kv_factor 0 is not one of 1, 2"),
        ("trtllm", {"kv_factor": True}, r"metadata kv_factor true is not one of 1, 2"),
        ("trtllm", {"num_layers": 0}, r"metadata num_layers 0 is outside \[1, 65536\]"),
        ("trtllm", {"dtype": "half"}, r'metadata dtype "half" is not one of "float16"'),
        ("trtllm", {"tokens_per_block": 8}, r"block_size 16, tokens_per_block 8 disagree"),
    ],
)
def test_every_engine_holds_its_metadata_to_the_schema(
    engine: str, meta: dict[str, Any], message: str
) -> None:
    # "false" is not true, a kv_factor / num_layers of 0 divides nothing, "x" is no ValueError
    snap = Snapshot(engine, {}, {"block_size": 16, **meta})
    with pytest.raises(InputError, match=message):
        import_module(f"pagedkv_sql.engines.{engine}").to_state(snap)


@pytest.mark.parametrize(
    ("header", "message"),
    [
        (flashinfer_header() | {"cache_tensors": [5]}, r"cache_tensors\[0\] 5 is not an object"),
        (flashinfer_header() | {"cache_tensors": "abc"}, r"'cache_tensors' is not a JSON list"),
        (flashinfer_header() | {"cache_tensors": [{"a": 1}]}, r'cache_tensors\[0\] key "a"'),
        (flashinfer_header() | {"meta": [1]}, r"'meta' is not a JSON object"),
        ({"engine": 5, "meta": {}}, r"'engine' 5 is not an engine; engines: flashinfer"),
        ({"engine": "flashinfer", "format_version": 2}, r"format_version 2 is not 1"),
        ({"engine": "flashinfer", "extra": 1}, r"unknown key\(s\) 'extra'"),
        (  # RecursionError before
            '{"engine":"flashinfer","meta":{"page_size":16,"x":' + "[" * 3000 + "]" * 3000 + "}}",
            r"nested too deeply to read|nested deeper than",
        ),
        ('{"engine":"flashinfer","meta":{"page_size":Infinity}}', r"page_size Infinity is not"),
        (  # Python's 4300-digit limit: a ValueError before
            '{"engine":"flashinfer","meta":{"page_size":' + "9" * 5000 + "}}",
            r"pagedkv metadata cannot be read",
        ),
    ],
)
def test_a_malformed_header_is_one_error_naming_the_file(
    tmp_path: Path, header: Any, message: str
) -> None:
    path = write_npz(tmp_path / "h.npz", header)
    with pytest.raises(InputError, match=rf"h\.npz: .*{message}"):
        load_engine_file(path)


def test_a_file_that_is_not_a_regular_file_is_refused_at_once(tmp_path: Path) -> None:
    # a FIFO never blocks the import; a directory is not said to be "truncated"
    import os

    for suffix in (".npz", ".safetensors"):
        fifo = tmp_path / f"q{suffix}"
        os.mkfifo(fifo)
        with pytest.raises(InputError, match=r"is a FIFO \(named pipe\), not a snapshot file"):
            read(fifo)
        folder = tmp_path / f"d{suffix}"
        folder.mkdir()
        with pytest.raises(InputError, match=r"is a directory, not a snapshot file") as e:
            read(folder)
        assert "truncated" not in e.value.hint
    with pytest.raises(InputError, match=r"no snapshot file at"):
        read(tmp_path / "absent.npz")


def test_an_unreadable_npz_says_truncated_only_when_it_may_be(tmp_path: Path) -> None:
    # random bytes get neither numpy's pickle advice nor "may be truncated"
    noise = tmp_path / "g.npz"
    noise.write_bytes(np.random.default_rng(0).bytes(4096))
    with pytest.raises(InputError, match=r"g\.npz: not a \.npz \(zip\) file") as e:
        read(noise)
    assert "truncated" not in e.value.hint and "pickle" not in str(e.value)
    whole = write_npz(tmp_path / "w.npz", flashinfer_header()).read_bytes()
    cut = tmp_path / "c.npz"
    cut.write_bytes(whole[: len(whole) // 2])
    with pytest.raises(InputError, match=r"not a readable \.npz snapshot") as e:
        read(cut)
    assert "truncated" in e.value.hint


def test_an_unused_npz_member_is_never_decompressed_and_a_used_one_is_bounded(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # a member past the bound is refused before it is decompressed (1.9 MB file, 2 GB RSS)
    from pagedkv_sql.engines import snapshot_files

    monkeypatch.setattr(snapshot_files, "MAX_ARRAY_BYTES", 1 << 20)
    big = np.zeros(1 << 20, I32)  # 4 MiB declared, a few KB compressed
    path = tmp_path / "z.npz"
    header = json.dumps(flashinfer_header())
    np.savez_compressed(path, **CSR, extra=big, pagedkv=np.array(header))
    state = import_module("pagedkv_sql.engines.flashinfer").to_state(read(path))
    assert state.requests.num_rows == 2  # "extra" was never read
    np.savez_compressed(path, **{**CSR, "kv_indices": big}, pagedkv=np.array(header))
    with pytest.raises(InputError, match=r"array 'kv_indices' declares 4,194,\d+ bytes, more"):
        import_module("pagedkv_sql.engines.flashinfer").to_state(read(path))
    monkeypatch.setattr(snapshot_files, "MAX_META_BYTES", 64)
    with pytest.raises(InputError, match=r"array 'pagedkv' declares \d+ bytes, more than the 64"):
        read(path)


def test_an_array_numpy_cannot_read_is_named_by_its_dtype(tmp_path: Path) -> None:
    # bf16 / f8 tensors are named by dtype, not "the file may be truncated"
    path = write_npz(tmp_path / "b.npz", flashinfer_header())
    with zipfile.ZipFile(path, "a") as z:
        z.writestr(
            "kv.npy",
            b"\x93NUMPY\x01\x00v\x00{'descr': 'bfloat16', 'fortran_order': False, 'shape': (2,), }"
            + b" " * 55  # the header padded to the 118 bytes it declares (v\x00)
            + b"\n"
            + b"\x00" * 4,  # the data: two bf16 zeros
        )
    with pytest.raises(InputError, match=r"array 'kv' has a dtype numpy cannot read") as e:
        read(path)
    assert "truncated" not in e.value.hint
    objects = tmp_path / "o.npz"
    np.savez(objects, block_table=np.array([{"a": 1}], dtype=object))
    with pytest.raises(InputError, match=r"array 'block_table' holds Python objects"):
        read(objects, "vllm")


def test_a_file_without_metadata_says_how_to_record_the_block_size(tmp_path: Path) -> None:
    # the hint names no option that `import` does not have (it has no --block-size)
    path = tmp_path / "raw.npz"
    np.savez(path, **CSR)
    with pytest.raises(InputError, match=r"name the engine") as e:
        read(path)
    assert "--block-size" not in e.value.hint and "import ENGINE PATH" in e.value.hint
    with pytest.raises(InputError, match=r"metadata has no block_size") as e:
        load_engine_file(path, "flashinfer")
    # the hint names the option `import` has, and the plain member
    assert "--page-size N" in e.value.hint and "page_size=np.array(N)" in e.value.hint


def test_a_plain_npz_carries_its_metadata_as_members(tmp_path: Path) -> None:
    # np.savez with the engine's own names, page_size and request ids beside
    path = tmp_path / "plain.npz"
    np.savez(path, **CSR, page_size=np.array(16), request_ids=np.array(["a", "b"]))
    snap = engines.read(path, "flashinfer")
    assert snap.meta == {"page_size": 16, "request_ids": ["a", "b"]}
    assert sorted(snap.arrays) == sorted(CSR)  # the metadata members are no arrays
    assert load_engine_file(path, "flashinfer").rows["engine_request"] == 2
    # a member the 'pagedkv' JSON contradicts is refused, naming both
    header = json.dumps({"engine": "flashinfer", "meta": {"page_size": 32}})
    np.savez(path, **CSR, page_size=np.array(16), pagedkv=np.array(header))
    with pytest.raises(InputError, match=r"member 'page_size' \(16\) and the metadata's \(32\)"):
        engines.read(path)


def _unreadable_npz(path: Path, kind: str) -> None:
    import os
    import pickle
    import zipfile

    if kind == "random bytes":
        path.write_bytes(os.urandom(4096))
    elif kind == "text":
        path.write_text("hello world\n")
    elif kind == "a pickle":
        path.write_bytes(pickle.dumps({"kv_indptr": [0, 1]}))
    elif kind == "an object array":
        np.savez(path, kv_indptr=np.array([{"x": 1}], dtype=object))
    elif kind == "a .npy":
        with path.open("wb") as f:
            np.save(f, np.arange(3))
    elif kind == "an object .npy":
        with path.open("wb") as f:
            np.save(f, np.array([None], dtype=object), allow_pickle=True)
    elif kind == "a pickled member":
        with zipfile.ZipFile(path, "w") as z:
            z.writestr("kv_indptr.npy", pickle.dumps([0, 1]))
    elif kind == "empty":
        path.write_bytes(b"")


@pytest.mark.parametrize(
    "kind",
    [
        "random bytes",
        "text",
        "a pickle",
        "an object array",
        "a .npy",
        "an object .npy",
        "a pickled member",
        "empty",
    ],
)
def test_an_unreadable_npz_is_refused_without_numpys_pickle_advice(
    cli: Any, tmp_path: Path, kind: str
) -> None:
    path = tmp_path / "bad.npz"
    _unreadable_npz(path, kind)
    r = cli("import", "flashinfer", str(path), "--db", str(tmp_path / "x.duckdb"))
    assert r.exit_code == 1, r.output
    assert r.output.startswith(f"Error: {path}: ")
    assert "Traceback" not in r.output
    assert "allow_pickle" not in r.output and "unsafe" not in r.output
    assert "pickle.load" not in r.output and "If you trust" not in r.output
    assert "nothing was loaded" in r.output
    with pytest.raises(InputError) as e:
        read(path, "flashinfer")
    assert "allow_pickle" not in f"{e.value} {e.value.hint}"


@pytest.mark.parametrize(
    "text",
    [
        '{"engine": "flashinfer", "meta": {"page_size": 16}, "meta": {"page_size": 32}}',
        '{"engine": "flashinfer", "meta": {"page_size": 16, "page_size": 32}}',
        '{"engine": "vllm", "engine": "flashinfer", "meta": {"page_size": 16}}',
        '{"engine": "flashinfer", "meta": {"page_size": 16}, "cache_tensors": [{"name": "kv",'
        ' "name": "kv2"}]}',
    ],
    ids=["meta", "page_size", "engine", "tensor-field"],
)
@pytest.mark.parametrize("suffix", [".npz", ".safetensors"])
def test_snapshot_metadata_naming_a_key_twice_is_refused(
    tmp_path: Path, text: str, suffix: str
) -> None:
    path = tmp_path / f"m{suffix}"
    if suffix == ".npz":
        write_npz(path, text)
    else:
        from safetensors.numpy import save_file

        save_file(dict(CSR), str(path), metadata={"pagedkv": text})
    with pytest.raises(InputError, match=r"pagedkv metadata names '\w+' twice in one object"):
        load_engine_file(path)
