"""Each `fleet sim --plant` leaves its mark where fleet.json's plant_detail says, in the
files a checker reads, and nowhere on a clean run."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from pagedkv_sql.fleet.sim import Options, run

from .helpers import batches, cached_hashes, held_after, lines, steps, stored_hashes

OPTIONS = {"replicas": 3, "requests": 150, "seed": 2}


def planted(tmp_path: Path, plant: str | None, **kw: Any) -> tuple[Path, dict[str, Any]]:
    out = tmp_path / (plant or "clean")
    return out, run(out, Options(**{**OPTIONS, **kw}, plant=plant))


def types(batch: dict[str, Any]) -> list[str]:
    return [e["type"] for e in batch["events"]]


def test_a_dropped_batch_is_a_sequence_gap_the_routers_never_saw(tmp_path: Path) -> None:
    out, fleet = planted(tmp_path, "dropped_batch")
    d = fleet["plant_detail"]
    seqs = [b["seq"] for b in batches(out, d["replica"])]
    assert d["seq"] not in seqs and seqs == [s for s in range(len(seqs) + 1) if s != d["seq"]]
    for name in {r["name"] for r in fleet["replicas"]} - {d["replica"]}:
        got = [b["seq"] for b in batches(out, name)]
        assert got == list(range(len(got)))
    # the replica cached blocks in that step that no event it published stores
    lost = cached_hashes(out, d["replica"]) - stored_hashes(out, d["replica"])
    assert lost


@pytest.mark.parametrize("plant", ["restart_without_replay", "clear_ignored"])
def test_a_restart_empties_the_replica_and_the_clear_is_lost_where_the_plant_says(
    tmp_path: Path, plant: str
) -> None:
    out, fleet = planted(tmp_path, plant)
    d = fleet["plant_detail"]
    step = next(s for s in steps(out, d["replica"])[1:] if s["step"] == d["step"])
    assert any(op["op"] == "evict" for op in step["ops"])  # the truth: the cache emptied
    cleared = [b["seq"] for b in batches(out, d["replica"]) if "AllBlocksCleared" in types(b)]
    if plant == "clear_ignored":
        assert cleared == [d["seq"]]  # published, and the routers dropped it
    else:
        assert cleared == []  # never published
    # Dynamo still believes blocks the replica dropped, right after the restart
    worker = next(r["worker_id"] for r in fleet["replicas"] if r["name"] == d["replica"])
    t = d["step"] * fleet["step_seconds"]
    dump = next(x for x in lines(out / "router=dynamo" / "index.jsonl") if x["t"] >= t)["dump"]
    believed = {
        b["block_hash"]
        for e in dump
        if e["worker_id"] == worker
        for b in e["event"]["data"]["stored"]["blocks"]
    }
    assert believed - set(held_after(out, d["replica"], d["step"]))


def test_a_duplicate_copy_removal_removes_a_hash_the_replica_still_holds(tmp_path: Path) -> None:
    out, fleet = planted(tmp_path, "duplicate_copy_removal")
    d = fleet["plant_detail"]
    batch = next(b for b in batches(out, d["replica"]) if b["seq"] == d["seq"])
    removed = {h for e in batch["events"] if e["type"] == "BlockRemoved" for h in e["block_hashes"]}
    assert d["hash"] in removed
    assert held_after(out, d["replica"], d["step"]).get(d["hash"])  # another copy holds it
    assert any(x["request"].endswith("-retry") for x in lines(out / "outcomes.jsonl"))
    assert fleet["stats"]["duplicate_copy_removals"] >= 1


def test_hashes_folded_from_the_wrong_end_match_no_block_of_the_truth(tmp_path: Path) -> None:
    out, fleet = planted(tmp_path, "hash_wrong_end")
    assert fleet["hash"] == "first8" and fleet["plant_detail"]["fold"] == "first8"
    clean, _ = planted(tmp_path, None)
    for r in fleet["replicas"]:
        name = r["name"]
        truth = cached_hashes(out, name)
        assert truth == cached_hashes(clean, name)  # the engines did the same
        assert stored_hashes(clean, name) == truth  # a clean fleet's events join its truth
        assert not stored_hashes(out, name) & truth  # the planted one's join nothing
    # routing is by Dynamo's own token hash: unchanged
    assert (out / "decisions.jsonl").read_bytes() == (clean / "decisions.jsonl").read_bytes()


def test_a_sliding_window_group_indexed_as_prefix(tmp_path: Path) -> None:
    _, fleet = planted(tmp_path, "sliding_window_as_prefix", kind="hybrid", requests=60)
    assert fleet["plant_detail"]["groups"] == [0]
    _, fair = planted(tmp_path, None, kind="hybrid", requests=60)
    # fed the window group's removals too, Dynamo refuses events the clean index never sees
    assert fleet["stats"]["dynamo_refused_events"] > fair["stats"]["dynamo_refused_events"]


def test_a_clean_run_carries_no_mark(tmp_path: Path) -> None:
    out, fleet = planted(tmp_path, None)
    assert (
        fleet["plant"] is None and fleet["plant_detail"] is None and fleet["hash"] == "vllm_last8"
    )
    for r in fleet["replicas"]:
        got = batches(out, r["name"])
        assert [b["seq"] for b in got] == list(range(len(got)))
        assert not any("AllBlocksCleared" in types(b) for b in got)
        assert stored_hashes(out, r["name"]) == cached_hashes(out, r["name"])


def test_data_parallel_ranks_merged_into_one_worker(tmp_path: Path) -> None:
    out, fleet = planted(tmp_path, "dp_ranks_merged", replicas=4)
    slots = {r["name"]: (r["worker_id"], r["dp_rank"]) for r in fleet["replicas"]}
    assert slots == {"r0": (0, 0), "r1": (0, 1), "r2": (1, 0), "r3": (1, 1)}
    assert fleet["plant_detail"]["merged"] == [
        {"worker_id": 0, "replicas": ["r0", "r1"]},
        {"worker_id": 1, "replicas": ["r2", "r3"]},
    ]
    for name, (_, rank) in slots.items():
        assert {b["data_parallel_rank"] for b in batches(out, name)} <= {rank}
    assert any(batches(out, n) for n in ("r1", "r3"))  # rank 1 published
    # Dynamo heard every rank as rank 0: nothing of rank 1 in its index, ever
    for dump in lines(out / "router=dynamo" / "index.jsonl"):
        assert {e["event"]["dp_rank"] for e in dump["dump"]} <= {0}
    # no decision ever sends a request to a rank-1 replica by its prefix
    ranked = [d for d in lines(out / "decisions.jsonl") if d["router"] == "dynamo"]
    assert all(d["predicted"]["r1"] == d["predicted"]["r3"] == 0 for d in ranked)
