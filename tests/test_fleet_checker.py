"""`fleet.check` over hand-built fleet directories (tests/fleet_fixtures.py): a clean fleet
has no finding, and each fault is found as the residency it broke, with its cause and the
side at fault."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

import pagedkv_sql
from pagedkv_sql import findings, fleet
from pagedkv_sql.errors import UsageError

from . import fleet_fixtures as ff


def run(tmp_path: Path, scenario: ff.Fleet, **kw: Any) -> fleet.FleetReport:
    with pagedkv_sql.connect(":memory:") as db:
        return fleet.check(db, scenario.write(tmp_path / "fleet"), **kw)


def found(report: fleet.FleetReport) -> list[tuple[str, str | None, str, str, str | None]]:
    """(check, cause, fault, replica, hash) of each finding."""
    return [(f.check, f.cause, f.fault, f.replica, f.hash) for f in report.findings]


def test_a_clean_fleet_has_no_finding_and_exact_rates(tmp_path: Path) -> None:
    report = run(tmp_path, ff.clean())
    assert report.findings == []
    (s,) = report.summary
    assert (s["router"], s["false_rate"], s["missed_rate"]) == ("dynamo", 0.0, 0.0)
    assert (s["misroutes"], s["false_hits"], s["recomputed_tokens"]) == (0, 0, 1)
    assert report.counts["fleet_truth"] == 6 and report.misroute_checked


def test_a_hash_past_2_63_is_stored_folded_and_printed_unsigned(tmp_path: Path) -> None:
    scenario = ff.clean()
    scenario.routers["dynamo"].skip.add(("r1", 6))  # the store of 2^64 - 5 never applied
    with pagedkv_sql.connect(":memory:") as db:
        report = fleet.check(db, scenario.write(tmp_path / "fleet"))
        stored = db.sql("SELECT DISTINCT hash FROM fleet_event WHERE hash < 0").fetchall()
    assert stored == [(-5,)]
    assert found(report) == [
        ("missed_residency", "sequence_gap", "router", "r1", str((1 << 64) - 5))
    ]


def test_a_batch_the_router_lost_is_a_false_residency_with_its_staleness(tmp_path: Path) -> None:
    report = run(tmp_path, ff.router_lost_removal())
    assert found(report) == [("false_residency", "sequence_gap", "router", "r0", "13")]
    (f,) = report.findings
    assert (f.t_from, f.stage) == (0.05, "router")
    (s,) = report.summary
    assert s["drop_never"] == 1 and s["drop_max"] == pytest.approx(0.05)
    assert s["false_rate"] > 0


def test_a_store_the_router_lost_is_a_missed_residency_learned_late(tmp_path: Path) -> None:
    scenario = ff.clean()
    scenario.routers["dynamo"].skip.add(("r1", 2))
    report = run(tmp_path, scenario)
    assert found(report) == [("missed_residency", "sequence_gap", "router", "r1", "21")]
    assert report.summary[0]["learn_p50"] == pytest.approx(0.06)


def test_a_line_removed_from_an_events_file_is_found_in_the_engine_stage_with_its_gap(
    tmp_path: Path,
) -> None:
    """The lost batch was numbered, so published: the fault is the way to the router's."""
    scenario = ff.clean()
    scenario.routers["dynamo"].skip.add(("r0", 5))  # nobody downstream saw it
    scenario.replicas["r0"].dropped_lines.add(1)
    report = run(tmp_path, scenario)
    assert found(report) == [("false_residency", "sequence_gap", "router", "r0", "13")]
    assert report.findings[0].stage == "engine"


def test_a_restart_without_clear_is_the_engines(tmp_path: Path) -> None:
    scenario = ff.clean()
    scenario.restart(7, "r0", clear=False)
    report = run(tmp_path, scenario)
    assert {x[:3] for x in found(report)} == {
        ("false_residency", "restart_without_clear", "engine")
    }
    assert sorted(f.hash for f in report.findings) == ["11", "12"]


def test_a_restart_with_its_clear_is_clean_and_a_clear_ignored_is_the_routers(
    tmp_path: Path,
) -> None:
    scenario = ff.clean()
    scenario.restart(7, "r0", clear=True)
    assert run(tmp_path / "a", scenario).findings == []
    scenario = ff.clean()
    scenario.restart(7, "r0", clear=True)
    scenario.routers["dynamo"].ignore_clear = True
    report = run(tmp_path / "b", scenario)
    assert {x[:3] for x in found(report)} == {("false_residency", "clear_ignored", "router")}


def test_a_duplicate_copy_removal_is_the_engines_and_names_vllm_55092(tmp_path: Path) -> None:
    report = run(tmp_path, ff.duplicate_copy())
    assert found(report) == [("missed_residency", "duplicate_copy_removed", "engine", "r1", "21")]
    assert "vllm #55092" in report.findings[0].message
    with pagedkv_sql.connect(":memory:") as db:  # folded with counts, the events match
        fleet.check(db, ff.duplicate_copy().write(tmp_path / "again"))
        copies = db.sql(
            "SELECT t_from, t_to, copies FROM fleet_claimed WHERE replica = 'r1' AND hash = 21"
            " ORDER BY t_from"
        ).fetchall()
        truth = db.sql(
            "SELECT t_from, t_to, copies FROM fleet_truth WHERE replica = 'r1' AND hash = 21"
            " ORDER BY t_from"
        ).fetchall()
    assert copies == truth == [(0.02, 0.03, 1), (0.03, 0.04, 2), (0.04, 0.08, 1)]


def test_the_lag_tolerates_a_mismatch_up_to_its_length(tmp_path: Path) -> None:
    scenario = ff.duplicate_copy()  # 0.04 s long
    assert run(tmp_path / "a", scenario, lag=0.03).findings != []
    assert run(tmp_path / "b", ff.duplicate_copy(), lag=0.05).findings == []
    with pytest.raises(UsageError):
        run(tmp_path / "c", ff.clean(), lag=-1)


def test_a_prefix_false_hit_takes_its_cause_from_the_residency_open_then(tmp_path: Path) -> None:
    report = run(tmp_path, ff.over_predicted())
    hits = [f for f in report.findings if f.check == "prefix_false_hit"]
    assert [(f.request_ids, f.cause, f.fault) for f in hits] == [
        (("q2",), "sequence_gap", "router")
    ]
    assert findings.invariant(hits[0]) == "prefix_false_hit"


def test_a_full_hit_cut_to_num_tokens_minus_one_is_no_false_hit(tmp_path: Path) -> None:
    scenario = ff.clean()
    scenario.decide(4, "q2", "r0", [11, 12], predicted={"r0": 2}, cached_blocks=1)
    scenario.decisions[-1]["prompt_tokens"] = 2 * ff.BLOCK  # a full hit: vLLM hits one less
    report = run(tmp_path, scenario)
    assert report.findings == []
    assert report.summary[0]["capped_hits"] == 1


def test_a_misroute_by_prefix_is_found_and_one_by_load_only_counted(tmp_path: Path) -> None:
    report = run(tmp_path / "a", ff.misrouted())
    assert [(f.check, f.request_ids) for f in report.findings] == [("misroute", ("q2",))]
    scenario = ff.clean()
    scenario.decide(4, "q2", "r1", [11, 12], reason="load", predicted={"r0": 2}, cached_blocks=0)
    report = run(tmp_path / "b", scenario)
    assert report.findings == []
    assert (report.summary[0]["misroutes"], report.summary[0]["load_misroutes"]) == (0, 1)


def test_an_approximate_router_is_summarized_not_found(tmp_path: Path) -> None:
    scenario = ff.Fleet(routers=(ff.Router("dynamo"), ff.Router("approx", "approx_lru", False)))
    scenario.store(1, "r0", 11)
    scenario.evict(3, "r0", 11)
    scenario.routers["approx"].skip.add(("r0", 3))  # no eviction signal
    report = run(tmp_path, scenario)
    assert report.findings == []
    rates = {s["router"]: s["false_rate"] for s in report.summary}
    assert rates["dynamo"] == 0 and rates["approx"] > 0


def test_hashes_folded_differently_never_match_and_say_so(tmp_path: Path) -> None:
    scenario = ff.clean()
    for r in scenario.replicas.values():  # the step log keeps other 64 bits of each hash
        for ops in r.steps.values():
            for op in ops:
                if "hashes" in op:
                    op["hashes"] = [ff.hex16(int(h, 16) ^ (1 << 40)) for h in op["hashes"]]
    report = run(tmp_path, scenario)
    assert report.findings and {f.cause for f in report.findings} == {"hash_fold_mismatch"}
    assert {f.fault for f in report.findings if f.stage} == {"engine"}


def test_a_removal_of_a_hash_with_no_copy_counts_nothing(tmp_path: Path) -> None:
    """The fold with counts never goes below 0: a later store of the hash is one copy."""
    scenario = ff.clean()
    scenario.replicas["r0"].batches.setdefault(4, []).append(["BlockRemoved", [99], "GPU"])
    scenario.store(6, "r0", 99)
    with pagedkv_sql.connect(":memory:") as db:
        report = fleet.check(db, scenario.write(tmp_path / "fleet"))
        claimed = db.sql("SELECT t_from, copies FROM fleet_claimed WHERE hash = 99").fetchall()
    assert claimed == [(0.06, 1)]
    assert report.findings == []


@pytest.mark.parametrize("make", [ff.clean, ff.router_lost_removal, ff.duplicate_copy])
def test_events_in_vllms_json_object_form_read_as_the_array_form(tmp_path: Path, make: Any) -> None:
    arrays, objects = make(), make()
    objects.objects = True
    assert found(run(tmp_path / "a", objects)) == found(run(tmp_path / "b", arrays))


def test_an_index_dumped_every_n_steps_is_compared_at_those_steps_only(tmp_path: Path) -> None:
    scenario = ff.clean()
    scenario.index_every = 4  # the index seen at steps 0, 4, 8 and the end: no finding
    assert run(tmp_path / "a", scenario).findings == []
    scenario = ff.router_lost_removal()
    scenario.index_every = 4  # 13 still claimed at step 8: found
    assert found(run(tmp_path / "b", scenario)) == [
        ("false_residency", "sequence_gap", "router", "r0", "13")
    ]


def test_two_ranks_of_one_worker_folded_into_rank_0_are_merged_dp_ranks(tmp_path: Path) -> None:
    """r0 and r1 are ranks 0 and 1 of worker 0; the index files r1's blocks under rank 0."""

    def two_ranks() -> ff.Fleet:
        scenario = ff.clean()
        scenario.replicas["r1"].worker_id = 0
        scenario.replicas["r1"].dp_rank = 1
        return scenario

    assert run(tmp_path / "ranks", two_ranks()).findings == []
    scenario = two_ranks()
    scenario.merge_ranks = True
    report = run(tmp_path / "merged", scenario)
    assert report.findings
    assert {(f.cause, f.fault) for f in report.findings} == {("merged_dp_ranks", "router")}
    assert {(f.check, f.replica) for f in report.findings} >= {
        ("false_residency", "r0"),
        ("missed_residency", "r1"),
    }


def test_stores_chained_onto_a_dropped_parent_inherit_its_cause(tmp_path: Path) -> None:
    """Dynamo refuses a store whose parent it lacks: after a lost batch (the parent's
    store), the child's and grandchild's missed residency name the lost batch too."""
    scenario = ff.clean()
    scenario.routers["dynamo"].tree = True
    scenario.store(3, "r1", 31)
    scenario.store(4, "r1", 32, parent=31)
    scenario.store(4, "r1", 41)  # the batches of 32 and 33 reach the index: not lost whole
    scenario.store(5, "r1", 33, parent=32)
    scenario.store(5, "r1", 51)
    scenario.routers["dynamo"].skip.add(("r1", 3))
    report = run(tmp_path, scenario)
    assert sorted(found(report), key=lambda x: x[4] or "") == [
        ("missed_residency", "sequence_gap", "router", "r1", h) for h in ("31", "32", "33")
    ]


def test_a_restart_that_caches_anew_in_its_step_is_still_a_restart(tmp_path: Path) -> None:
    scenario = ff.clean()
    scenario.store(6, "r0", 15, 16)
    scenario.restart(7, "r0", clear=False)
    scenario.store(7, "r0", 71)  # re-prefilled at once: the truth never reaches 0
    report = run(tmp_path, scenario)
    assert {f.cause for f in report.findings} == {"restart_without_clear"}


def test_a_request_queued_past_an_eviction_is_no_false_hit(tmp_path: Path) -> None:
    """Predicted right at decision time; the outcome, later, met a cache evicted since."""

    def queued(t: float) -> ff.Fleet:
        scenario = ff.clean()
        scenario.decide(4, "q2", "r0", [11, 12, 13], predicted={"r0": 3}, cached_blocks=2)
        scenario.decisions[-1].pop("hashes")
        scenario.outcomes[-1]["t"] = t
        return scenario

    assert run(tmp_path / "a", queued(0.07)).findings == []  # after 13's eviction at step 5
    found_then = run(tmp_path / "b", queued(0.04)).findings  # scheduled at once: it judges
    assert [f.check for f in found_then] == ["prefix_false_hit"]


def test_a_hybrid_logs_cached_blocks_take_their_allocations_group(tmp_path: Path) -> None:
    """One pool, two groups: a cache op names no group; its block's allocate does."""
    scenario = hybrid()
    with pagedkv_sql.connect(":memory:") as db:
        report = fleet.check(db, scenario.write(tmp_path / "fleet"))
        groups = db.sql("SELECT grp, t_to FROM fleet_truth WHERE hash = 11 ORDER BY grp").fetchall()
    assert groups == [(0, 0.05), (1, 0.04)]
    assert report.findings == []


def hybrid() -> ff.Fleet:
    """Full attention (group 0) and a sliding window (group 1): r0 caches 11, 12 in both;
    the window lets 11 go at step 4; the router indexes group 0's events only."""
    scenario = ff.Fleet(routers=(ff.Router("dynamo", groups=(0,)),))
    scenario.groups = [
        {"group": 0, "kind": "full_attention", "block_size": ff.BLOCK},
        {"group": 1, "kind": "sliding_window", "block_size": ff.BLOCK, "sliding_window": 32},
    ]
    scenario.store(1, "r0", 11, 12)
    scenario.store(1, "r0", 11, 12, group=1)
    scenario.evict(4, "r0", 11, group=1)
    return scenario


def test_a_window_groups_removal_indexed_as_a_prefix_is_named(tmp_path: Path) -> None:
    scenario = hybrid()
    scenario.routers["dynamo"].groups = None  # every group's events indexed, as one prefix
    report = run(tmp_path, scenario)
    assert found(report) == [("missed_residency", "sliding_window_as_prefix", "router", "r0", "11")]


def test_a_hybrids_false_hit_without_hashes_is_an_unindexed_group(tmp_path: Path) -> None:
    scenario = hybrid()
    scenario.decide(5, "q1", "r0", [11, 12], predicted={"r0": 2}, cached_blocks=0)
    scenario.decisions[-1].pop("hashes")
    report = run(tmp_path, scenario)
    assert [(f.check, f.cause, f.fault) for f in report.findings] == [
        ("prefix_false_hit", "unindexed_group", "router")
    ]
