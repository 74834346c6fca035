"""`fleet sim` checked by `fleet check`, end to end: real vLLM managers behind Dynamo's real
RadixTree (and the approximate router), the directory the simulator writes read by the
checker as it is. A clean fleet has no `router` finding, and every `engine` finding it has
is a real engine behaviour named by its cause; each plant is found and named where
fleet.json's plant_detail says it struck; a batch line cut from a replica's events file is
found as the residency it broke, the sequence gap its cause."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest

from pagedkv_sql.fleet.sim import Options, run
from tests.helpers import Cli

from .helpers import batches

OPTIONS = {"replicas": 4, "requests": 300, "seed": 1}
FINDING_KEYS = {"invariant", "check", "replica", "router", "hash", "cause", "fault"}
# what a clean fleet of real vLLM managers may show: the engine's own behaviour, by name
ENGINE_BEHAVIOUR = {"duplicate_copy_removed": "vllm #55092"}


def simulate(base: Path, name: str, **kw: Any) -> tuple[Path, dict[str, Any]]:
    out = base / name
    return out, run(out, Options(**{**OPTIONS, **kw}))


def check(directory: Path) -> tuple[int, dict[str, Any]]:
    result: Any = Cli(directory.parent)("fleet", "check", str(directory), "-f", "json")
    assert result.exit_code in (0, 1), result.output
    report = json.loads(result.stdout)
    assert result.exit_code == (1 if report["findings"] else 0)
    for f in report["findings"]:
        assert set(f) >= FINDING_KEYS, f
        assert f["fault"] in ("engine", "router") and f["model"] == "fleet"
    return result.exit_code, report


def router_summary(report: dict[str, Any], name: str) -> dict[str, Any]:
    return next(s for s in report["summary"] if s["router"] == name)


@pytest.fixture(scope="module")
def base(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("e2e")


@pytest.fixture(scope="module")
def clean(base: Path) -> Path:
    return simulate(base, "clean")[0]


@pytest.fixture(scope="module")
def clean_causes(clean: Path) -> set[str]:
    return {f["cause"] for f in check(clean)[1]["findings"]}


def assert_clean(report: dict[str, Any]) -> None:
    """No router fault; each engine finding a real engine behaviour, named."""
    assert [f for f in report["findings"] if f["fault"] == "router"] == []
    for f in report["findings"]:
        assert f["cause"] in ENGINE_BEHAVIOUR, f
        assert ENGINE_BEHAVIOUR[f["cause"]] in f["message"], f


@pytest.mark.parametrize("router", ["dynamo", "approx"])
def test_a_clean_fleet_has_no_router_finding(base: Path, clean: Path, router: str) -> None:
    directory = clean if router == "dynamo" else simulate(base, "clean-approx", router=router)[0]
    _, report = check(directory)
    assert_clean(report)
    assert report["misroute_checked"] is True  # the simulator writes the request hashes
    assert router_summary(report, router)["routed"] is True
    assert router_summary(report, router)["decisions"] == OPTIONS["requests"]
    # Dynamo fed every event holds nothing the replicas do not; the approximate router has
    # no eviction signal: its false residency is measured, and is no finding
    assert router_summary(report, "dynamo")["false_rate"] == 0
    assert router_summary(report, "approx")["false_rate"] > 0
    assert router_summary(report, "approx")["cause"] == "no_eviction_signal"
    assert router_summary(report, "dynamo")["cause"] is None
    assert not [f for f in report["findings"] if f["router"] == "approx"]


def test_a_clean_fleet_with_no_engine_fault_exits_0(base: Path) -> None:
    """Too few requests to evict: nothing to find, exit 0."""
    out, fleet = simulate(base, "small", requests=60)
    code, report = check(out)
    assert (code, report["findings"]) == (0, [])
    assert fleet["stats"]["duplicate_copy_removals"] == 0


def test_a_real_engine_finding_on_a_clean_fleet_exits_1_and_names_it(base: Path) -> None:
    """The generated workload's exact retries make vLLM publish BlockRemoved for a hash it
    still holds in a second copy: a real engine's behaviour, found on a clean fleet."""
    out, fleet = simulate(base, "retries", requests=500)
    assert fleet["stats"]["duplicate_copy_removals"] > 0
    code, report = check(out)
    assert code == 1
    assert_clean(report)
    engine = [f for f in report["findings"] if f["router"] is None]
    assert engine and {f["cause"] for f in engine} == {"duplicate_copy_removed"}


def test_a_clean_hybrid_fleet_names_the_group_its_index_lacks(base: Path) -> None:
    """A hybrid model indexed on its full-attention events alone (as Dynamo does): its
    router findings are the decisions that group over-predicts, each `unindexed_group`."""
    out, _ = simulate(base, "clean-hybrid", kind="hybrid")
    _, report = check(out)
    router = [f for f in report["findings"] if f["fault"] == "router"]
    assert router and {(f["invariant"], f["cause"]) for f in router} == {
        ("prefix_false_hit", "unindexed_group")
    }
    for f in report["findings"]:
        assert f["fault"] == "router" or f["cause"] in ENGINE_BEHAVIOUR, f


# plant -> (sim options, the finding it must leave: invariant, cause, fault, router)
PLANTS: dict[str, tuple[dict[str, Any], tuple[str, str, str, str | None]]] = {
    "dropped_batch": ({}, ("missed_residency", "sequence_gap", "router", None)),
    "restart_without_replay": ({}, ("false_residency", "restart_without_clear", "engine", None)),
    "clear_ignored": ({}, ("false_residency", "clear_ignored", "router", "dynamo")),
    "duplicate_copy_removal": (
        {},
        ("missed_residency", "duplicate_copy_removed", "engine", None),
    ),
    "hash_wrong_end": ({}, ("missed_residency", "hash_fold_mismatch", "engine", None)),
    "dp_ranks_merged": ({}, ("missed_residency", "merged_dp_ranks", "router", "dynamo")),
    "sliding_window_as_prefix": (
        {"kind": "hybrid"},
        ("missed_residency", "sliding_window_as_prefix", "router", "dynamo"),
    ),
}


@pytest.mark.parametrize("plant", sorted(PLANTS))
def test_every_plant_is_found_and_named_where_it_struck(
    base: Path, clean_causes: set[str], plant: str
) -> None:
    options, (invariant, cause, fault, router) = PLANTS[plant]
    out, fleet = simulate(base, plant, plant=plant, **options)
    code, report = check(out)
    assert code == 1
    named = [f for f in report["findings"] if f["cause"] == cause]
    assert named, sorted({(f["invariant"], f["cause"], f["fault"]) for f in report["findings"]})
    assert {(f["invariant"], f["fault"]) for f in named} >= {(invariant, fault)}
    if router is not None:
        assert router in {f["router"] for f in named}
    d = fleet["plant_detail"]
    if "replica" in d:  # struck one replica at one step: found there, then
        at = d["step"] * fleet["step_seconds"]
        here = [f for f in named if f["replica"] == d["replica"]]
        assert here and min(f["t_from"] for f in here) == pytest.approx(at)
    if "hash" in d:
        assert str(d["hash"]) in {f["hash"] for f in named}
    if "merged" in d:
        assert {f["replica"] for f in named} <= {r for m in d["merged"] for r in m["replicas"]}
    # the plant's cause is not on the clean fleet (unless a real engine shows it there)
    assert cause not in clean_causes - set(ENGINE_BEHAVIOUR)


def test_a_batch_cut_from_an_events_file_is_the_residency_it_broke(base: Path, clean: Path) -> None:
    cut = base / "cut"
    shutil.copytree(clean, cut)
    path = cut / "replica=r1" / "events.jsonl"
    lines = path.read_text().splitlines(keepends=True)
    stored = [
        i
        for i, b in enumerate(batches(cut, "r1"))
        if any(e["type"] == "BlockStored" for e in b["events"])
    ]
    i = stored[len(stored) // 2]
    lost = json.loads(lines[i])
    path.write_text("".join(lines[:i] + lines[i + 1 :]))
    code, report = check(cut)
    assert code == 1
    gap = [f for f in report["findings"] if f["cause"] == "sequence_gap"]
    assert gap and {f["replica"] for f in gap} == {"r1"}
    assert min(f["t_from"] for f in gap) == pytest.approx(lost["ts"])
    lost_hashes = {
        str(h) for e in lost["events"] if e["type"] == "BlockStored" for h in e["block_hashes"]
    }
    assert {f["hash"] for f in gap} & lost_hashes
