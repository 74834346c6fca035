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
    # kv-events takes -f / -o as every report does, not only text / json to stdout
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
    assert csv.stdout.splitlines()[0] == (
        "check,source,stream,seq,position,where,message,group,group_kind,group_window"
    )


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


@pytest.mark.parametrize("codec", ["gzip", "zstd"])
def test_compressed_events_and_step_logs_are_read_by_their_content(cli: Cli, codec: str) -> None:
    """kv-events and watch read gzip and zstd as every reader does: by the first bytes,
    whatever the name, from a file or stdin; the findings are the plain stream's."""
    import gzip

    import pyarrow as pa

    def pack(data: bytes) -> bytes:
        if codec == "gzip":
            return gzip.compress(data)
        return bytes(pa.compress(data, codec="zstd", asbytes=True))

    events = _batch(STORED) + _batch(REMOVED_9)
    (cli.cwd / "e.msgpack").write_bytes(pack(events))  # the name does not say it
    for args, given in ((("e.msgpack",), None), (("-",), pack(events))):
        result: Any = cli("kv-events", *args, input=given)
        assert result.exit_code == 1, result.stderr
        assert result.stdout.splitlines()[0] == "2 event(s): 1 stored, 1 removed, 0 cleared"
        assert "unknown_removal: BlockRemoved of 9, which is not stored" in result.stdout
    steps = [{"step": 0, "ops": [{"op": "allocate", "req": "a", "blocks": [1]}]},
             {"step": 1, "ops": [{"op": "allocate", "req": "b", "blocks": [1]}]}]  # fmt: skip
    log = "".join(json.dumps(s) + "\n" for s in steps).encode()
    (cli.cwd / f"run.jsonl.{'gz' if codec == 'gzip' else 'zst'}").write_bytes(pack(log))
    for args, given in (((f"run.jsonl.{'gz' if codec == 'gzip' else 'zst'}",), None),
                        (("-",), pack(log))):  # fmt: skip
        result = cli("watch", *args, input=given)
        assert result.exit_code == 1, result.stderr
        assert "step 1: use_after_free (fresh_while_held): block 1 handed to" in result.stdout


def test_a_watch_that_stores_nothing_of_unreadable_input_leaves_no_new_database(
    cli: Cli,
) -> None:
    (cli.cwd / "garbage.bin").write_bytes(bytes(range(256)) * 8)
    result: Any = cli("watch", "garbage.bin", "--db", "new.duckdb")
    assert result.exit_code == 1
    assert "garbage.bin: not a stream of KV event batches (byte 0)" in result.stderr
    assert result.stderr.splitlines()[-1] == "--db: nothing was stored; new.duckdb was not created"
    assert sorted(p.name for p in cli.cwd.iterdir()) == ["garbage.bin"]


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


def test_the_root_db_and_pagedkv_db_are_where_kv_events_and_watch_store(
    cli: Cli, monkeypatch: pytest.MonkeyPatch
) -> None:
    (cli.cwd / "e.msgpack").write_bytes(_batch(STORED))
    assert cli("--db", "root.duckdb", "kv-events", "e.msgpack").exit_code == 0  # type: ignore[attr-defined]
    assert cli("--db", "watched.duckdb", "watch", "e.msgpack").exit_code == 0  # type: ignore[attr-defined]
    monkeypatch.setenv("PAGEDKV_DB", "env.duckdb")
    result: Any = cli("kv-events", "e.msgpack")
    assert result.stderr == "stored 1 row(s) in env.duckdb (engine_kv_event)\n"
    assert cli("kv-events", "e.msgpack", "--db", "after.duckdb").exit_code == 0  # type: ignore[attr-defined]
    for name in ("root", "watched", "env", "after"):
        con = duckdb.connect(str(cli.cwd / f"{name}.duckdb"), read_only=True)
        assert con.execute("SELECT count(*) FROM engine_kv_event").fetchall() == [(1,)], name
        con.close()


def test_a_signal_while_watch_says_what_it_stored_says_what_was_committed(
    cli: Cli, monkeypatch: pytest.MonkeyPatch
) -> None:
    # the watch's own handlers are gone by then: a SIGINT is Python's KeyboardInterrupt,
    # here raised where it would land, in the line that says what was stored
    from pagedkv_sql.cli import common

    said = common.err

    def err(text: str) -> None:
        if text.startswith("stored "):
            raise KeyboardInterrupt
        said(text)

    monkeypatch.setattr(common, "err", err)
    (cli.cwd / "e.msgpack").write_bytes(_batch(STORED))
    result: Any = cli("watch", "e.msgpack", "--db", "w.duckdb")
    assert result.exit_code == 130
    assert result.stderr == "Error: interrupted; 1 event row(s) were stored in w.duckdb before it\n"
    con = duckdb.connect(str(cli.cwd / "w.duckdb"), read_only=True)
    assert con.execute("SELECT count(*) FROM engine_kv_event").fetchall() == [(1,)]
    con.close()


def test_the_same_stream_is_stored_once(cli: Cli) -> None:
    (cli.cwd / "e.msgpack").write_bytes(_batch(STORED) + _batch(REMOVED_9))
    first: Any = cli("kv-events", "e.msgpack", "--db", "k.duckdb")
    (cli.cwd / "copy.msgpack").write_bytes((cli.cwd / "e.msgpack").read_bytes())
    again: Any = cli("kv-events", "copy.msgpack", "--db", "k.duckdb")
    assert first.exit_code == again.exit_code == 1  # the findings, each time
    assert again.stdout == first.stdout.replace("e.msgpack", "copy.msgpack")
    assert again.stderr == (
        "not stored again: k.duckdb holds these bytes already (2 row(s) stored from e.msgpack; "
        "engine_kv_load)\n"
    )
    con = duckdb.connect(str(cli.cwd / "k.duckdb"), read_only=True)
    assert con.execute("SELECT count(*) FROM engine_kv_event").fetchall() == [(2,)]


def test_an_int64_overflow_is_refused_naming_its_line_with_or_without_db(cli: Cli) -> None:
    (cli.cwd / "w.jsonl").write_text(
        '{"event_id": 0, "data": {"type": "created"}}\n'
        '{"event_id": 1, "window_size": 99999999999999999999, "data": {"type": "created"}}\n'
    )
    group = {**STORED, "group_idx": 2**64 - 1}
    (cli.cwd / "g.msgpack").write_bytes(_batch(STORED) + _batch(group))
    for path, where in (("w.jsonl", "w.jsonl:2"), ("g.msgpack", f"byte {len(_batch(STORED))}")):
        for db in ([], ["--db", "x.duckdb"]):
            for command in ("kv-events", "watch"):
                result: Any = cli(command, path, *db)
                assert result.exit_code == 1, (path, db, command)
                assert "<= 9223372036854775807" in result.stderr and where in result.stderr
                assert "Traceback" not in result.stderr
                stored = (cli.cwd / "x.duckdb").exists()
                if command == "kv-events":
                    assert not stored  # all or nothing
                elif db:  # a watch keeps what it read before: the event before the refused
                    con = duckdb.connect(str(cli.cwd / "x.duckdb"), read_only=True)
                    assert con.execute("SELECT count(*) FROM engine_kv_event").fetchall() == [(1,)]
                    con.close()
                    (cli.cwd / "x.duckdb").unlink()


def test_watch_exits_1_on_input_it_could_not_read_even_without_a_finding(cli: Cli) -> None:
    (cli.cwd / "torn.jsonl").write_text('{"step": 0, "ops": []}\n{"step": 1, "ops": [')
    result: Any = cli("watch", "torn.jsonl")
    assert result.exit_code == 1
    assert result.stdout.splitlines()[1:] == [
        "0 finding(s): none",
        "1 problem(s): input that could not be read or kept (above)",
    ]
    assert result.stderr.startswith("torn.jsonl:2: malformed JSON")
    follow: Any = cli("watch", "--follow", "typo.jsonl", "--duration", "0.3")
    assert follow.exit_code == 1
    assert follow.stdout.splitlines()[-1] == (
        "typo.jsonl never existed while watched: nothing was read"
    )
    ci: Any = cli("watch", "torn.jsonl", "--exit-on-finding", "--format", "jsonl")
    assert ci.exit_code == 1 and json.loads(ci.stdout.splitlines()[-1])["stopped_by"] in (
        "unreadable input",
        "end of input",
    )


def test_watch_into_head_ends_quietly(tmp_path: Path) -> None:
    log = tmp_path / "steps.jsonl"
    lines = [json.dumps({"step": n, "ops": [{"op": "release", "req": "a", "blocks": [1]}]})
             for n in range(1, 400)]  # fmt: skip
    log.write_text(
        json.dumps({"step": 0, "ops": [{"op": "allocate", "req": "a", "blocks": [1]}]})
        + "\n" + "\n".join(lines) + "\n"
    )  # fmt: skip
    run = subprocess.run(
        f"{sys.executable} -m pagedkv_sql watch {log} | head -1; echo ${{PIPESTATUS[0]}}",
        shell=True, executable="/bin/bash", cwd=ROOT, capture_output=True, text=True,
        env={k: v for k, v in os.environ.items() if k != "PAGEDKV_DB"}, timeout=300,
    )  # fmt: skip
    out = run.stdout.splitlines()
    assert out[0].startswith(f"{log} step 2: double_free:") and out[1] == "0", run
    assert run.stderr == ""


def test_metrics_are_served_on_the_address_given_and_port_0_says_which(tmp_path: Path) -> None:
    pytest.importorskip("prometheus_client")
    import urllib.request

    fifo = tmp_path / "events"
    os.mkfifo(fifo)
    proc = _pagedkv("watch", str(fifo), "--metrics-host", "0.0.0.0", "--metrics-port", "0")
    with open(fifo, "wb") as writer:  # the watch waits on it while we read its stderr
        assert proc.stderr is not None
        said = proc.stderr.readline()
        port = int(said.rsplit(":", 1)[1].split("/")[0])
        assert said == f"metrics: serving Prometheus metrics on http://0.0.0.0:{port}/metrics\n"
        text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read()
        assert b"pagedkv_watch_events" in text
        writer.write(_batch(STORED))
    proc.communicate(timeout=60)
    assert proc.returncode == 0
