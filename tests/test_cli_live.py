"""`kv-events` and `watch` as a user runs them: stdin, the database all or
nothing, a missing extra as one line, SIGINT/SIGTERM ending with a summary and a committed
database, --exit-on-finding, each against a real ZeroMQ socket on 127.0.0.1."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import duckdb
import msgspec
import pytest

from .helpers import ROOT, Cli
from .steplogs import stream

enc = msgspec.msgpack.encode


def _batch(*events: Any) -> bytes:
    return enc([1.0, list(events), 0])


STORED = {"type": "BlockStored", "block_hashes": [1], "parent_block_hash": None,
          "token_ids": [0] * 16, "block_size": 16, "lora_id": None, "medium": "GPU"}  # fmt: skip
REMOVED_9 = {"type": "BlockRemoved", "block_hashes": [9], "medium": "GPU"}


def test_kv_events_reads_stdin(cli: Cli) -> None:
    result: Any = cli("kv-events", "-", input=_batch(STORED) + _batch(REMOVED_9))
    assert result.exit_code == 1
    assert result.stdout.splitlines() == [
        "2 event(s): 1 stored, 1 removed, 0 cleared",
        f"<stdin>@{len(_batch(STORED))}: unknown_removal: BlockRemoved of 9, which is not stored",
        "1 finding(s)",
    ]


def test_kv_events_writes_every_rows_format_and_its_output_file(cli: Cli) -> None:
    # issue 29: kv-events took only text / json to stdout; now -f / -o as every report
    import pyarrow.parquet as pq

    (cli.cwd / "e.msgpack").write_bytes(_batch(STORED) + _batch(REMOVED_9))
    document: Any = cli("kv-events", "e.msgpack", "-f", "json")
    assert document.exit_code == 1
    assert json.loads(document.stdout)["findings"][0]["check"] == "unknown_removal"
    lines: Any = cli("kv-events", "e.msgpack", "-f", "jsonl")
    rows = [json.loads(line) for line in lines.stdout.splitlines()]
    assert [(r["check"], r["position"]) for r in rows] == [("unknown_removal", 1)]
    written: Any = cli("kv-events", "e.msgpack", "-o", "found.parquet")
    assert written.exit_code == 1 and written.stdout == ""
    table = pq.read_table(cli.cwd / "found.parquet")
    assert table.column("check").to_pylist() == ["unknown_removal"]
    csv: Any = cli("kv-events", "e.msgpack", "-f", "csv")
    assert csv.stdout.splitlines()[0] == "check,source,stream,seq,position,where,message"


def test_kv_events_db_stores_all_or_nothing(cli: Cli) -> None:
    good = cli.cwd / "good.msgpack"
    good.write_bytes(_batch(STORED) + _batch(REMOVED_9))
    bad = cli.cwd / "bad.msgpack"
    bad.write_bytes(_batch(STORED) * 50 + b"\xc1")
    refused: Any = cli("kv-events", str(bad), "--db", "k.duckdb")
    assert refused.exit_code == 1 and not (cli.cwd / "k.duckdb").exists()  # no new file
    assert cli("kv-events", str(good), "--db", "k.duckdb").exit_code == 1  # type: ignore[attr-defined]
    again: Any = cli("kv-events", str(bad), "--db", "k.duckdb")
    assert "not a stream of KV event batches" in again.stderr
    con = duckdb.connect(str(cli.cwd / "k.duckdb"), read_only=True)
    # the first stream only
    assert con.execute("SELECT count(*) FROM engine_kv_event").fetchall() == [(2,)]


def test_a_missing_extra_is_one_line_naming_it(cli: Cli, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "zmq", None)  # import zmq raises ImportError
    result: Any = cli("watch", "zmq://127.0.0.1:5557")
    assert result.exit_code == 2
    assert result.stderr.splitlines() == [
        "Error: watching a zmq:// source needs pyzmq",
        "Fix: pip install 'pagedkv-sql[live]'",
    ]
    monkeypatch.setitem(sys.modules, "prometheus_client", None)
    # a metrics test run before this one left live/metrics.py imported, prometheus with it
    monkeypatch.delitem(sys.modules, "pagedkv_sql.live.metrics", raising=False)
    (cli.cwd / "e.msgpack").write_bytes(_batch(STORED))
    result = cli("watch", "e.msgpack", "--metrics-port", "0")
    assert result.stderr.splitlines()[0] == "Error: --metrics-port needs prometheus-client"


def test_bad_sources_are_usage_errors(cli: Cli) -> None:
    for args, message in [
        (["zmq://127.0.0.1"], "zmq://127.0.0.1: not HOST:PORT"),
        (["zmq://h:99999"], "zmq://h:99999: not HOST:PORT"),
        (["a.msgpack"], "no KV event file at a.msgpack"),
        (["-", "-"], "- is given twice"),
        (["zmq://127.0.0.1:1", "--replay-endpoint", "zmq://a:1", "--replay-endpoint", "zmq://b:1"],
         "2 --replay-endpoint(s) for 1 zmq:// source(s)"),
    ]:  # fmt: skip
        result: Any = cli("watch", *args)
        assert result.exit_code in (1, 2), args
        assert result.stderr.splitlines()[0] == f"Error: {message}", args


def test_watch_on_a_recorded_file_prints_findings_and_a_summary(cli: Cli) -> None:
    (cli.cwd / "e.msgpack").write_bytes(_batch(STORED) + _batch(REMOVED_9))
    result: Any = cli("watch", "e.msgpack", "--format", "jsonl")
    assert result.exit_code == 1
    finding, summary = (json.loads(x) for x in result.stdout.splitlines())
    assert (finding["type"], finding["check"], finding["source"]) == (
        "finding",
        "unknown_removal",
        "e.msgpack",
    )
    assert summary["type"] == "summary" and summary["findings"] == {"unknown_removal": 1}


def _pagedkv(*args: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "pagedkv_sql", *args],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={k: v for k, v in os.environ.items() if k != "PAGEDKV_DB"},
    )


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_a_signal_ends_watch_with_a_summary_and_a_committed_database(
    tmp_path: Path, sig: signal.Signals
) -> None:
    pytest.importorskip("zmq")
    from pagedkv_sql.live.publisher import BlockRemoved, BlockStored, Publisher

    pub = Publisher()
    db = tmp_path / "w.duckdb"
    port = _free_port()
    pub.publish([BlockStored([1], None, [0] * 16, 16, None, "GPU", None)])  # before it starts
    proc = _pagedkv("watch", pub.endpoint, "--replay-endpoint", str(pub.replay_endpoint),
                    "--db", str(db), "--metrics-port", str(port))  # fmt: skip
    try:
        assert _events_seen(port) == 1.0  # from the replay socket: it joined late
        pub.publish([BlockRemoved([7], "GPU")])
        assert _events_seen(port, 2.0) == 2.0
        proc.send_signal(sig)
        out, err = proc.communicate(timeout=20)
    finally:
        proc.kill()
        pub.close()
    assert proc.returncode == 1, (out, err)
    lines = out.splitlines()
    assert lines[0] == f"{pub.endpoint}#1: unknown_removal: BlockRemoved of 7, which is not stored"
    assert lines[1] == (
        f"watched 1 source(s) ({sig.name}): 2 event(s) in 2 batch(es), 0 step-log line(s), "
        "0 sequence gap(s)"
    )
    con = duckdb.connect(str(db), read_only=True)
    rows = con.execute("SELECT seq, kind, block_hash FROM engine_kv_event ORDER BY event")
    assert rows.fetchall() == [
        (0, "stored", "1"),
        (1, "removed", "7"),
    ]


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _events_seen(port: int, wanted: float = 1.0, timeout: float = 30.0) -> float | None:
    """pagedkv_watch_events_total from watch's metrics, once it reaches `wanted`."""
    import urllib.request

    deadline = time.monotonic() + timeout
    seen = None
    while time.monotonic() < deadline:
        try:
            text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2).read()
        except OSError:
            time.sleep(0.1)
            continue
        for line in text.decode().splitlines():
            if line.startswith("pagedkv_watch_events_total{"):
                seen = float(line.rsplit(" ", 1)[1])
        if seen is not None and seen >= wanted:
            return seen
        time.sleep(0.1)
    return seen


def test_exit_on_finding_ends_at_the_first(tmp_path: Path) -> None:
    pytest.importorskip("zmq")
    from pagedkv_sql.live.publisher import BlockRemoved, Publisher

    pub = Publisher()
    proc = _pagedkv("watch", pub.endpoint, "--replay-endpoint", str(pub.replay_endpoint),
                    "--exit-on-finding", "--format", "jsonl", "--duration", "60")  # fmt: skip
    pub.publish([BlockRemoved([7], "GPU")])  # before it starts: read from the replay socket
    try:
        out, err = proc.communicate(timeout=30)
    finally:
        proc.kill()
        pub.close()
    assert proc.returncode == 1, (out, err)
    records = [json.loads(x) for x in out.splitlines()]
    (finding,) = [r for r in records if r["type"] == "finding"]
    assert finding["check"] == "unknown_removal" and records[-1]["stopped_by"] == "finding"


def _dynamo_events(tmp_path: Path) -> Path:
    """A Dynamo JSON Lines stream with three findings: a gap, an unknown removal, a hash
    used after AllBlocksCleared."""
    import json

    def ev(n: int, data: Any) -> str:
        event = {"worker_id": 7, "event": {"event_id": n, "data": data, "dp_rank": 0}}
        return json.dumps({"timestamp": n, "event": event})

    stored = {"parent_hash": None, "blocks": [{"block_hash": 1, "tokens_hash": 5}]}
    later = {"parent_hash": 1, "blocks": [{"block_hash": 3, "tokens_hash": 7}]}
    lines = [
        ev(0, {"stored": stored}),
        ev(2, {"removed": {"block_hashes": [2]}}),
        ev(3, "cleared"),
        ev(4, {"stored": later}),
    ]
    path = tmp_path / "dynamo.jsonl"
    path.write_text("\n".join(lines) + "\n")
    return path


def test_kv_events_limit_shows_that_many_findings_and_zero_all(cli: Cli, tmp_path: Path) -> None:
    path = str(_dynamo_events(tmp_path))
    every: Any = cli("kv-events", path)
    assert every.exit_code == 1
    lines = every.stdout.splitlines()
    assert lines[0] == "4 event(s): 2 stored, 1 removed, 1 cleared"
    assert [line.split(": ")[1] for line in lines[1:-1]] == [
        "sequence_gap",
        "unknown_removal",
        "after_clear",
    ]
    assert lines[-1] == "3 finding(s)"
    assert cli("kv-events", path, "--limit", "0").stdout == every.stdout  # type: ignore[attr-defined]
    one: Any = cli("kv-events", path, "--limit", "1")
    assert one.stdout.splitlines()[1:] == [
        lines[1],
        "... and 2 more (--limit 0: all)",
        "3 finding(s)",
    ]


def test_kv_events_json_is_indented_by_two(cli: Cli, tmp_path: Path) -> None:
    import json

    result: Any = cli("kv-events", str(_dynamo_events(tmp_path)), "--format", "json")
    document = json.loads(result.stdout)
    assert result.stdout == json.dumps(document, indent=2, default=str) + "\n"


def test_cli_kv_events(cli: Cli, tmp_path: Path) -> None:
    path = tmp_path / "events.msgpack"
    path.write_bytes(b"".join(msgspec.msgpack.encode(b) for b in stream(False)))
    result: Any = cli("kv-events", str(path))
    assert result.exit_code == 1
    assert result.stdout.splitlines()[0] == "7 event(s): 3 stored, 3 removed, 1 cleared"
    assert result.stdout.splitlines()[-1] == "3 finding(s)"
    clean = tmp_path / "clean.msgpack"
    clean.write_bytes(b"".join(msgspec.msgpack.encode(b) for b in stream(False)[:2]))
    assert cli("kv-events", str(clean)).exit_code == 0
