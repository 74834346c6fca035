"""synth.py: the synthesized caches, their parameters' bounds and the files written."""

from __future__ import annotations

import dataclasses
from collections import defaultdict
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pytest

import pagedkv_sql
from pagedkv_sql.errors import PagedKVError, UsageError
from pagedkv_sql.relations import INPUT_RELATIONS
from pagedkv_sql.synth import MAX_ANOMALIES, MAX_TOKENS, SynthConfig, synthesize

from .helpers import Cli

_SMALL = {"sequences": 2, "mean_length": 3}


@pytest.mark.parametrize(
    "change",
    [
        {"sequences": 1},
        {"mean_length": 1},
        {"block_size": 1},
        {"block_size": 256},
        {"anomalies": 0},
        {"seed": 2**63 - 1},
        {"fork_fraction": 0.0, "swap_fraction": 1.0, "missing_fraction": 1.0},
        {"fork_fraction": 1.0, "swap_fraction": 0.0, "missing_fraction": 0.0},
    ],
)
def test_synth_takes_every_parameter_at_its_bounds(change: dict[str, Any]) -> None:
    tables = synthesize(SynthConfig(**{**_SMALL, **change}))
    assert set(tables) == set(INPUT_RELATIONS)


@pytest.mark.parametrize(
    "change",
    [
        {"sequences": 0},
        {"mean_length": 0},
        {"block_size": 0},
        {"block_size": 257},
        {"anomalies": -1},
        {"anomalies": MAX_ANOMALIES + 1},
        {"seed": -1},
        {"seed": 2**63},
        {"fork_fraction": -0.01},
        {"swap_fraction": 1.01},
        {"missing_fraction": -0.01},
        {"sequences": 1, "mean_length": MAX_TOKENS + 1},
    ],
)
def test_synth_refuses_every_parameter_just_beyond_its_bounds(change: dict[str, Any]) -> None:
    with pytest.raises(UsageError):
        synthesize(SynthConfig(**{**_SMALL, **change}))


def test_synth_csv_has_the_bare_header_every_csv_has(tmp_path: Path) -> None:
    """docs/decisions.md: csv means a bare header line everywhere (as resolve writes it);
    synth wrote it quoted ("seq_id","block_table_ptr")."""
    from pagedkv_sql.synth import write

    tables = synthesize(SynthConfig(sequences=2, mean_length=3))
    write(tables, tmp_path, "csv")
    assert (tmp_path / "root_table.csv").read_text().splitlines() == [
        "seq_id,block_table_ptr",
        "0,100",
        "1,101",
    ]


def test_synth_swapped_blocks_take_consecutive_cpu_slots_from_the_cpu_base() -> None:
    """The CPU tier is a pool of 256-byte slots numbered up from CPU_BASE (plus 2^44 with
    wide addresses), one a swapped block, as an engine's swap space numbers its blocks."""
    from pagedkv_sql.synth import CPU_BASE

    for wide in (False, True):
        config = SynthConfig(sequences=20, mean_length=40, swap_fraction=0.3, wide_addresses=wide)
        cpu = synthesize(config)["swapped_block"].column("cpu_base_address").to_pylist()
        first = CPU_BASE + (1 << 44 if wide else 0)
        assert len(cpu) > 10
        assert sorted(cpu) == [first + 256 * i for i in range(len(cpu))]


def test_synth_resident_blocks_take_consecutive_gpu_slots_from_the_gpu_base() -> None:
    from pagedkv_sql.synth import GPU_BASE

    config = SynthConfig(sequences=20, mean_length=40, fork_fraction=0, swap_fraction=0)
    bases = synthesize(config)["block_table_entry"].column("physical_block_base").to_pylist()
    assert sorted(bases) == [GPU_BASE + 256 * i for i in range(len(bases))]


def test_synth_takes_exactly_the_most_anomalies_it_allows() -> None:
    """MAX_ANOMALIES passes that check and the config is refused by the next one (the
    seed), so nothing is built; one more is refused for the anomalies."""
    at_bound = SynthConfig(sequences=1, mean_length=1, anomalies=MAX_ANOMALIES, seed=-1)
    with pytest.raises(UsageError, match="seed must be within"):
        synthesize(at_bound)
    with pytest.raises(UsageError, match="anomalies must be within"):
        synthesize(dataclasses.replace(at_bound, anomalies=MAX_ANOMALIES + 1))


def test_synth_creates_the_directories_it_writes_into(tmp_path: Path) -> None:
    from pagedkv_sql.synth import write

    out = tmp_path / "runs" / "seed-0"
    written = write(synthesize(SynthConfig(sequences=2, mean_length=3)), out)
    assert [p.name for p in written] == [f"{r}.facts" for r in INPUT_RELATIONS]
    assert all(p.parent == out and p.is_file() for p in written)


def test_synth_refuses_one_token_more_than_it_builds_and_takes_exactly_as_many() -> None:
    """sequences x mean length may be MAX_TOKENS, not one more: a config at the bound passes
    that check and is refused by the next one (so nothing is built)."""
    at_bound = SynthConfig(sequences=1, mean_length=MAX_TOKENS, anomalies=-1)
    with pytest.raises(UsageError, match="anomalies must be within"):
        synthesize(at_bound)
    with pytest.raises(UsageError, match="more than 100,000,000 tokens"):
        synthesize(dataclasses.replace(at_bound, mean_length=MAX_TOKENS + 1))


def _synth_shape(tables: dict[str, pa.Table]) -> dict[str, Any]:
    """What a synthesized cache says about itself, read back from its tables."""
    tokens = tables["virtual_token"].to_pydict()
    lengths: dict[int, int] = defaultdict(int)
    for s in tokens["seq_id"]:
        lengths[s] += 1
    bte = tables["block_table_entry"].to_pydict()
    base = {
        (t, i): b
        for t, i, b in zip(
            bte["block_table_id"], bte["block_index"], bte["physical_block_base"], strict=True
        )
    }
    swapped = tables["swapped_block"].to_pydict()
    cpu = {
        (t, i): a
        for t, i, a in zip(
            swapped["block_table_id"],
            swapped["block_index"],
            swapped["cpu_base_address"],
            strict=True,
        )
    }
    return {"tokens": tokens, "lengths": lengths, "bte": bte, "base": base, "cpu": cpu}


@pytest.mark.parametrize("block_size", [1, 4, 16])
def test_synth_gives_each_sequence_exactly_the_blocks_its_tokens_fill(block_size: int) -> None:
    """ceil(length / block size) logical blocks a sequence, each resident or swapped (none
    missing): a length that is an exact multiple of the block size gets no extra block."""
    config = SynthConfig(
        sequences=40, mean_length=24, block_size=block_size, swap_fraction=0.3, seed=5
    )
    shape = _synth_shape(synthesize(config))
    lengths = shape["lengths"]
    assert any(n % block_size == 0 for n in lengths.values())  # the boundary is exercised
    blocks: dict[int, set[int]] = defaultdict(set)
    for t, i in [*shape["base"], *shape["cpu"]]:
        blocks[t - 100].add(i)
    assert set(blocks) == set(lengths)
    for seq, n in lengths.items():
        assert blocks[seq] == set(range(-(-n // block_size))), seq
    tokens = shape["tokens"]
    for pos, index, offset in zip(
        tokens["token_pos"], tokens["block_index"], tokens["offset_in_block"], strict=True
    ):
        assert (index, offset) == divmod(pos, block_size)


def test_a_fork_shares_the_first_half_of_its_parents_blocks_and_no_more() -> None:
    """Every sequence but the first forks (fork fraction 1): sequence k holds the bases of
    sequence k-1 for its first min(blocks of k, blocks of k-1) // 2 blocks, fresh ones after;
    a base's refcount is the number of entries holding it."""
    config = SynthConfig(
        sequences=30, mean_length=40, block_size=4, fork_fraction=1.0, swap_fraction=0, seed=2
    )
    shape = _synth_shape(synthesize(config))
    base, lengths = shape["base"], shape["lengths"]
    nblocks = {s: -(-n // 4) for s, n in lengths.items()}
    for k in range(1, 30):
        shared = min(nblocks[k], nblocks[k - 1]) // 2
        parent = {base[(k + 99, i)] for i in range(nblocks[k - 1])}
        for i in range(nblocks[k]):
            if i < shared:
                assert base[(k + 100, i)] == base[(k + 99, i)], (k, i)
            else:
                assert base[(k + 100, i)] not in parent, (k, i)
    holders: dict[int, int] = defaultdict(int)
    for b in base.values():
        holders[b] += 1
    bte = shape["bte"]
    for b, r in zip(bte["physical_block_base"], bte["refcount"], strict=True):
        assert r == holders[b]
    assert max(holders.values()) > 2  # chains of forks share a block three ways and more


def test_synth_without_forks_gives_every_block_its_own_base() -> None:
    shape = _synth_shape(synthesize(SynthConfig(sequences=20, mean_length=30, fork_fraction=0)))
    assert len(set(shape["base"].values())) == len(shape["base"])
    assert set(shape["bte"]["refcount"]) == {1}


def test_synth_by_default_injects_no_anomaly() -> None:
    """The Python API's defaults make a consistent cache: nothing for `check` to find."""
    with pagedkv_sql.connect(":memory:") as db:
        for relation, table in synthesize(SynthConfig(sequences=20, mean_length=50)).items():
            db.load_arrow(relation, table)
        assert {r.name: r.count for r in db.check().results if r.count} == {}
    bases = synthesize(SynthConfig(sequences=5, mean_length=50))["block_table_entry"]
    assert max(bases.column("physical_block_base").to_pylist()) < 1 << 44


@pytest.mark.parametrize("block_size", [16, 4])
def test_anomalies_are_n_of_each_kind_and_nothing_else(block_size: int) -> None:
    """More anomalies than a block has tokens: the tokens in no block are still decomposed
    right for the block size, so `check` finds exactly n orphans and n unresolved tokens,
    and no wrong decomposition."""
    config = SynthConfig(
        sequences=40, mean_length=40, block_size=block_size, anomalies=37, swap_fraction=0
    )
    with pagedkv_sql.connect(":memory:") as db:
        for relation, table in synthesize(config).items():
            db.load_arrow(relation, table)
        found = {r.name: r.count for r in db.check(block_size=block_size).results if r.count}
    assert found.pop("diag_refcount_mismatch") >= 1
    assert found == {"diag_unresolved_token": 37, "diag_orphan_block_table": 37}


def test_synth_addresses_are_aligned_and_wide_ones_above_two_to_the_44() -> None:
    for wide in (False, True):
        shape = _synth_shape(
            synthesize(
                SynthConfig(sequences=10, mean_length=50, swap_fraction=0.3, wide_addresses=wide)
            )
        )
        addresses = np.array([*shape["base"].values(), *shape["cpu"].values()], dtype=np.int64)
        assert (addresses % 256 == 0).all()
        assert ((addresses >= 1 << 44) == wide).all()
        cpu = sorted(shape["cpu"].values())
        assert len(set(cpu)) == len(cpu)


def test_injected_orphans_hold_bases_of_their_own() -> None:
    """An orphan block table's block is a leak, not a share of a live block: its base is
    held by no other entry (else it would add refcount findings of its own)."""
    tables = synthesize(SynthConfig(sequences=40, mean_length=100, anomalies=25, swap_fraction=0))
    bte = tables["block_table_entry"].to_pydict()
    orphan = {
        b
        for t, b in zip(bte["block_table_id"], bte["physical_block_base"], strict=True)
        if t >= 10**12
    }
    live = {
        b
        for t, b in zip(bte["block_table_id"], bte["physical_block_base"], strict=True)
        if t < 10**12
    }
    assert len(orphan) == 25 and not orphan & live
    assert len(bte["block_table_id"]) > 25 + 200  # enough live blocks to meet a careless base


@pytest.mark.parametrize("fmt", ["facts", "tsv", "csv", "parquet", "arrow"])
def test_synth_writes_each_format_that_loads_back(tmp_path: Path, fmt: str) -> None:
    from pagedkv_sql.synth import write

    tables = synthesize(SynthConfig(sequences=5, mean_length=30, swap_fraction=0.3, seed=4))
    written = write(tables, tmp_path / "out", fmt)
    assert [p.name for p in written] == [f"{r}.{fmt}" for r in tables]
    with pagedkv_sql.connect(":memory:") as db:
        db.load(tmp_path / "out", format=fmt)
        for relation, table in tables.items():
            got = db.con.execute(f"SELECT * FROM {relation} ORDER BY ALL").fetchall()
            assert got == sorted(zip(*table.to_pydict().values(), strict=True)), relation


def test_synth_writes_into_a_directory_that_exists(tmp_path: Path) -> None:
    from pagedkv_sql.synth import write

    tables = synthesize(SynthConfig(sequences=2, mean_length=5))
    write(tables, tmp_path / "out")
    assert write(tables, tmp_path / "out") == [tmp_path / "out" / f"{r}.facts" for r in tables]


def test_synth_seeds_from_zero_by_default() -> None:
    """The Python default seed is the CLI's (0): the same facts either way."""
    a = synthesize(SynthConfig(sequences=5, mean_length=20))
    b = synthesize(SynthConfig(sequences=5, mean_length=20, seed=0))
    c = synthesize(SynthConfig(sequences=5, mean_length=20, seed=1))
    assert all(a[r].equals(b[r]) for r in a)
    assert not all(a[r].equals(c[r]) for r in a)


def test_synth_lengths_spread_a_quarter_of_the_mean_around_it() -> None:
    lengths = np.array(
        list(
            _synth_shape(synthesize(SynthConfig(sequences=2000, mean_length=400, seed=3)))[
                "lengths"
            ].values()
        )
    )
    assert abs(lengths.mean() - 400) < 8
    assert 90 < lengths.std() < 110  # a quarter of the mean, 100


def test_synth_swaps_and_loses_the_fractions_of_blocks_asked_for() -> None:
    config = SynthConfig(
        sequences=400,
        mean_length=160,
        swap_fraction=0.2,
        missing_fraction=0.3,
        fork_fraction=0,
        seed=9,
    )
    shape = _synth_shape(synthesize(config))
    logical = sum(-(-n // 16) for n in shape["lengths"].values())
    swapped, resident = len(shape["cpu"]), len(shape["base"])
    missing = logical - swapped - resident
    assert abs(swapped / logical - 0.2) < 0.03
    assert abs(missing / logical - 0.3) < 0.03


def test_synth_config_defaults_are_the_cli_defaults_and_frozen() -> None:
    import typer

    from pagedkv_sql.cli import app

    command = typer.main.get_command(app).commands["synth"]  # type: ignore[attr-defined]
    cli_defaults = {p.name: p.default for p in command.params}
    config = SynthConfig()
    for f in dataclasses.fields(SynthConfig):
        assert getattr(config, f.name) == cli_defaults[f.name], f.name
    assert hash(config) == hash(SynthConfig())
    with pytest.raises(dataclasses.FrozenInstanceError):
        config.seed = 1  # type: ignore[misc]


def test_synth_sequences_are_at_least_one_token_long() -> None:
    shape = _synth_shape(synthesize(SynthConfig(sequences=50, mean_length=1)))
    assert set(shape["lengths"].values()) == {1}


def test_synth_says_why_it_cannot_create_its_directory(tmp_path: Path) -> None:
    from pagedkv_sql.synth import write

    (tmp_path / "f").write_text("")
    with pytest.raises(PagedKVError) as e:
        write(synthesize(SynthConfig(sequences=1, mean_length=1)), tmp_path / "f" / "out")
    assert str(e.value) == f"cannot create {tmp_path / 'f' / 'out'}: Not a directory"


def test_an_injected_refcount_is_off_by_exactly_one() -> None:
    tables = synthesize(SynthConfig(sequences=30, mean_length=50, anomalies=10, fork_fraction=0.5))
    bte = tables["block_table_entry"].to_pydict()
    holders: dict[int, int] = defaultdict(int)
    for b in bte["physical_block_base"]:
        holders[b] += 1
    off = [r - holders[b] for b, r in zip(bte["physical_block_base"], bte["refcount"], strict=True)]
    assert set(off) == {0, 1} and off.count(1) == 10


def test_synth_is_consistent_and_anomalies_are_found(cli: Cli) -> None:
    result: Any = cli(
        "synth",
        "w",
        "--sequences",
        "50",
        "--mean-length",
        "100",
        "--swap-fraction",
        "0.1",
        "--seed",
        "3",
    )
    assert result.exit_code == 0, result.stderr
    assert cli("load", "w", "--strict").exit_code == 0
    result = cli(
        "synth",
        "a",
        "--sequences",
        "50",
        "--mean-length",
        "100",
        "--anomalies",
        "2",
        "-f",
        "parquet",
    )
    assert result.exit_code == 0
    cli("load", "a", "--no-diagnostics")
    report = __import__("json").loads(cli("check", "--format", "json").stdout)
    found = {c["name"]: c["count"] for c in report["checks"] if c["count"]}
    assert found["diag_orphan_block_table"] == 2
    assert found["diag_unresolved_token"] == 2
    assert found["diag_refcount_mismatch"] >= 1


@pytest.mark.parametrize(
    "args, message",
    [
        (["--sequences", "-1"], "need sequences >= 1"),
        (["--mean-length", "0"], "need sequences >= 1, mean length >= 1"),
        (["--sequences", "1000000", "--mean-length", "1000"], "more than 100,000,000 tokens"),
        (["--anomalies", "-2"], "anomalies must be within [0, 1,000,000], not -2"),
        (["--seed", "-1"], "seed must be within [0, 2^63), not -1"),
        (["--block-size", "0"], "1 <= block size <= 256"),
    ],
)
def test_synth_parameter_bounds(cli: Cli, args: list[str], message: str) -> None:
    result: Any = cli("synth", "out", *args)
    assert result.exit_code == 2
    assert message in result.stderr
    assert not (cli.cwd / "out").exists()


def test_synth_onto_an_existing_file(cli: Cli) -> None:
    (cli.cwd / "out").write_text("keep me")
    result: Any = cli("synth", "out", "--sequences", "2", "--mean-length", "10")
    assert result.exit_code == 2
    assert result.stderr.startswith("Error: out exists and is not a directory\n")
    assert (cli.cwd / "out").read_text() == "keep me"


@pytest.mark.slow
def test_synth_interrupted_while_writing_leaves_no_directory_and_says_so(tmp_path: Path) -> None:
    """Ctrl-C while the files are written: the directory it made goes with the draft, so
    'nothing was changed' is the truth."""
    import signal
    import subprocess
    import sys
    import time

    out = tmp_path / "made" / "w"
    proc = subprocess.Popen(
        [sys.executable, "-m", "pagedkv_sql", "synth", str(out), "-s", "3000"],
        stderr=subprocess.PIPE,
        text=True,
    )
    deadline = time.monotonic() + 120
    while not any(out.glob(".pagedkv-set.*")) and proc.poll() is None:
        assert time.monotonic() < deadline
        time.sleep(0.005)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=120)
    if proc.returncode == 0:  # pragma: no cover - the write ended before the signal came
        pytest.skip("the write ended before the signal")
    assert (proc.returncode, err) == (130, "Error: interrupted; nothing was changed\n")
    assert list(tmp_path.iterdir()) == []
