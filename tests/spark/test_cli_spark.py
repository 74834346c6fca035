"""`pagedkv-sql spark resolve|check` and `export parquet` end to end: DuckDB databases
exported as replicas of one Parquet data set, resolved and checked on Spark (in this
process's session, in a fresh process, and on a standalone cluster of this machine), and
the errors a user meets said in one line each."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest

import pagedkv_sql
from pagedkv_sql.relations import INPUT_RELATIONS

from ..helpers import Cli
from .helpers import rows_of, spark_rows

pytestmark = pytest.mark.spark
CLI = str(Path(sys.executable).with_name("pagedkv-sql"))


@pytest.fixture
def fleet(cli: Cli, seed_dir: Path, tmp_path: Path) -> tuple[Path, dict[str, Path]]:
    """Two databases (the seed data, and a synthetic workload with anomalies) exported as
    replica=seed and replica=synth of one data set."""
    synth = tmp_path / "synth"
    assert (
        cli(
            "synth",
            str(synth),
            "-s",
            "30",
            "--mean-length",
            "40",
            "--anomalies",
            "2",
            "--swap-fraction",
            "0.2",
            "--wide-addresses",
        ).exit_code
        == 0
    )
    dbs = {"seed": tmp_path / "seed.duckdb", "synth": tmp_path / "synth.duckdb"}
    out = tmp_path / "fleet"
    for (name, db), source in zip(dbs.items(), (seed_dir, synth), strict=True):
        assert cli("load", str(source), "--db", str(db)).exit_code == 0
        result = cli(
            "export", "parquet", str(out), "--db", str(db), "--partition", f"replica={name}"
        )
        assert result.exit_code == 0, result.output
    return out, dbs


def duckdb_resolved(db: Path) -> set[tuple[Any, ...]]:
    with pagedkv_sql.connect(db, read_only=True) as d:
        return rows_of(d.resolve().read_all())


def test_spark_resolve_writes_duckdbs_answer_per_replica(
    spark: Any, cli: Cli, fleet: tuple[Path, dict[str, Path]], tmp_path: Path
) -> None:
    root, dbs = fleet
    out = tmp_path / "out"
    result = cli("spark", "resolve", "-i", str(root), "-o", str(out), "-p", "replica")
    assert result.exit_code == 0, result.output
    assert "spark: resolving: done in" in result.output  # progress, not a silent wait
    got = spark_rows(
        pq.read_table(out / "resolved_kv_address").select(
            ["replica", "seq_id", "token_pos", "physical_address"]
        )
    )
    assert set(got) == set(dbs)
    for name, db in dbs.items():
        assert got[name] == duckdb_resolved(db), name
    total = sum(len(v) for v in got.values())
    assert f"wrote {total} resolved address(es) in 2 replica value(s)" in result.output
    # the output is not replaced unless asked, and then only the partitions written now
    again = cli("spark", "resolve", "-i", str(root), "-o", str(out), "-p", "replica")
    assert again.exit_code == 2 and "already holds data" in again.output
    (out / "resolved_kv_address" / "replica=old").mkdir()
    shutil.copy(
        next((out / "resolved_kv_address" / "replica=seed").glob("*.parquet")),
        out / "resolved_kv_address" / "replica=old",
    )
    again = cli("spark", "resolve", "-i", str(root), "-o", str(out), "-p", "replica", "--overwrite")
    assert again.exit_code == 0, again.output
    assert (out / "resolved_kv_address" / "replica=old").exists()


def test_spark_check_gives_duckdbs_report_per_replica(
    spark: Any, cli: Cli, fleet: tuple[Path, dict[str, Path]], tmp_path: Path
) -> None:
    root, dbs = fleet
    out = tmp_path / "checks"
    result = cli(
        "spark",
        "check",
        "-i",
        str(root),
        "-o",
        str(out),
        "-p",
        "replica",
        "--format",
        "json",
        "--limit",
        "0",
    )
    assert result.exit_code == 0, result.output  # warnings only: exit 0 without --strict
    report = json.loads(result.output[result.output.index("{") :])
    by_check = {c["name"]: c for c in report["checks"]}
    for name, db in dbs.items():
        with pagedkv_sql.connect(db, read_only=True) as d:
            expected = d.check(limit=None)
        for r in expected.results:
            rows = {
                tuple(tuple(v) if isinstance(v, list) else v for v in row.values())
                for row in by_check[r.name]["rows"]
                if row["replica"] == name
            }
            assert {tuple(x[1:]) for x in rows} == rows_of(r.rows), (name, r.name)
            if r.count:
                written = pq.read_table(out / r.name / f"replica={name}")
                assert written.num_rows == r.count
    assert report["warnings"] > 0 and report["errors"] == 0
    strict = cli("spark", "check", "-i", str(root), "-p", "replica", "--strict")
    assert strict.exit_code == 1
    assert "diag_refcount_mismatch" in strict.output


def test_spark_check_writes_the_formats_check_writes(
    spark: Any, cli: Cli, seed_dir: Path, tmp_path: Path
) -> None:
    """Unpartitioned, `spark check` writes what `check` writes, byte for byte: text on
    standard output, and any report format to a file (from its extension, or --format)."""
    db = tmp_path / "seed.duckdb"
    assert cli("load", str(seed_dir), "--db", str(db)).exit_code == 0
    assert cli("export", "parquet", str(tmp_path / "in"), "--db", str(db)).exit_code == 0
    source = ["spark", "check", "-i", str(tmp_path / "in")]
    text = cli(*source)
    assert text.exit_code == 0, text.output
    assert text.stdout == cli("check", "--db", str(db)).stdout  # type: ignore[attr-defined]
    assert "unresolved_token (diag_unresolved_token), warning, 1 row:" in text.stdout
    for options, name in [([], "report.csv"), (["-f", "jsonl"], "report.out")]:
        core, ours = tmp_path / f"core-{name}", tmp_path / f"spark-{name}"
        assert cli("check", "--db", str(db), "-o", str(core), *options).exit_code == 0
        result = cli(*source, "--report", str(ours), *options)
        assert result.exit_code == 0, result.output
        assert ours.read_bytes() == core.read_bytes(), name
    assert ours.read_text().splitlines()[0].startswith('{"check":"spec_unaligned_base"')
    strict = cli(*source, "--strict", "-f", "parquet", "--report", str(tmp_path / "s.parquet"))
    assert strict.exit_code == 1 and strict.stdout == ""
    summary = pq.read_table(tmp_path / "s.parquet")
    assert summary.column_names == ["check", "severity", "found", "description"]
    assert (
        dict(zip(summary["check"].to_pylist(), summary["found"].to_pylist(), strict=True))[
            "diag_refcount_mismatch"
        ]
        == 1
    )


def test_violating_input_fails_the_job_naming_rows_and_writes_nothing(
    spark: Any, cli: Cli, tmp_path: Path
) -> None:
    from ..helpers import write_facts

    root = tmp_path / "bad"
    facts = {
        "root_table": [(1, 10)],
        "block_table_entry": [(10, 0, 300, 1), (10, 1, 512, -1)],
        "virtual_token": [(1, 0, 0, 256)],
        "swapped_block": [],
    }
    flat = write_facts(tmp_path / "flat", facts, "parquet")
    for relation in INPUT_RELATIONS:
        (root / relation).mkdir(parents=True)
        shutil.copy(flat / f"{relation}.parquet", root / relation / "part-0.parquet")
    out = tmp_path / "out"
    result = cli("spark", "resolve", "-i", str(root), "-o", str(out))
    assert result.exit_code == 1
    text = result.output
    assert "Error: 3 row(s) violate the spec's constraints; nothing was resolved" in text
    assert (
        "spec_unaligned_base: block_table_entry(block_table_id 10, block_index 0, "
        "physical_block_base 300, refcount 1): physical_block_base 300 is not 256-byte "
        "aligned (300 mod 256 = 44)" in text
    )
    assert "spec_negative_refcount: block_table_entry(" in text
    assert "spec_offset_out_of_block: virtual_token(" in text
    assert "Traceback" not in text
    assert not (out / "resolved_kv_address").exists()
    check = cli("spark", "check", "-i", str(root))
    assert check.exit_code == 1 and "3 error(s)" in check.output


def test_errors_are_one_clear_line(spark: Any, cli: Cli, tmp_path: Path) -> None:
    missing = cli("spark", "resolve", "-i", str(tmp_path / "nope"), "-o", str(tmp_path / "o"))
    assert missing.exit_code == 1
    assert f"Error: input directory {tmp_path / 'nope'} does not exist" in missing.output
    (tmp_path / "empty").mkdir()
    empty = cli("spark", "check", "-i", str(tmp_path / "empty"))
    assert "holds none of the spec's relations" in empty.output
    assert "Fix: expected subdirectories root_table/" in empty.output
    bad_conf = cli("spark", "check", "-i", str(tmp_path / "empty"), "--conf", "nonsense")
    assert bad_conf.exit_code == 2 and "--conf 'nonsense' is not KEY=VALUE" in bad_conf.output


def test_a_spark_failure_is_one_line_without_a_java_trace(
    spark: Any, cli: Cli, fleet: tuple[Path, dict[str, Path]], tmp_path: Path
) -> None:
    root, _ = fleet
    blocker = tmp_path / "a-file"
    blocker.write_text("not a directory")
    result = cli("spark", "resolve", "-i", str(root), "-o", str(blocker), "-p", "replica")
    assert result.exit_code == 1
    lines = [line for line in result.output.splitlines() if line.startswith("Error:")]
    assert len(lines) == 1 and lines[0].startswith("Error: resolve failed: "), result.output
    assert "\tat org.apache" not in result.output and "Traceback" not in result.output


def test_without_java_the_command_says_how_to_get_it(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if k != "JAVA_HOME"}
    env["PATH"] = str(Path(sys.executable).parent)  # no java here
    (tmp_path / "in" / "root_table").mkdir(parents=True)
    run = subprocess.run(
        [CLI, "spark", "check", "-i", str(tmp_path / "in")],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    assert run.returncode == 1
    assert run.stderr.startswith("Error: Java is not installed"), run.stderr
    assert "apt-get install openjdk-17-jre-headless" in run.stderr
    assert "Traceback" not in run.stderr


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture
def standalone_cluster(tmp_path: Path) -> Iterator[str]:
    """A Spark standalone master and one worker on the loopback address: the cluster of
    docs/scale.md's recipe, started here and stopped after the test."""
    import pyspark

    spark_class = Path(pyspark.__file__).parent / "bin" / "spark-class"
    env = {**os.environ, "SPARK_LOCAL_IP": "127.0.0.1", "SPARK_WORKER_DIR": str(tmp_path / "w")}
    port = free_port()
    url = f"spark://127.0.0.1:{port}"
    logs = [open(tmp_path / "master.log", "w"), open(tmp_path / "worker.log", "w")]  # noqa: SIM115
    master = subprocess.Popen(
        [
            str(spark_class),
            "org.apache.spark.deploy.master.Master",
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "--webui-port",
            str(free_port()),
        ],
        stdout=logs[0],
        stderr=subprocess.STDOUT,
        env=env,
    )
    worker = subprocess.Popen(
        [
            str(spark_class),
            "org.apache.spark.deploy.worker.Worker",
            url,
            "--host",
            "127.0.0.1",
            "--cores",
            "1",
            "--memory",
            "1g",
            "--webui-port",
            str(free_port()),
        ],
        stdout=logs[1],
        stderr=subprocess.STDOUT,
        env=env,
    )
    try:
        deadline = time.monotonic() + 240
        while "Registering worker" not in (tmp_path / "master.log").read_text():
            assert master.poll() is None and worker.poll() is None, "the cluster died"
            assert time.monotonic() < deadline, (tmp_path / "master.log").read_text()
            time.sleep(1)
        yield url
    finally:
        for process in (worker, master):
            process.terminate()
            try:
                process.wait(timeout=60)
            except subprocess.TimeoutExpired:
                process.kill()
        for log in logs:
            log.close()


def test_the_cluster_recipe_on_a_standalone_master_and_worker(
    standalone_cluster: str, fleet: tuple[Path, dict[str, Path]], tmp_path: Path
) -> None:
    """What docs/scale.md tells a user to run, in a fresh process, against a cluster."""
    root, dbs = fleet
    out = tmp_path / "out"
    run = subprocess.run(
        [
            CLI,
            "spark",
            "resolve",
            "-i",
            str(root),
            "-o",
            str(out),
            "-p",
            "replica",
            "--master",
            standalone_cluster,
            "--conf",
            "spark.driver.host=127.0.0.1",
            "--conf",
            "spark.driver.bindAddress=127.0.0.1",
            "--conf",
            "spark.executor.memory=512m",
            "--conf",
            "spark.cores.max=1",
        ],
        capture_output=True,
        text=True,
        timeout=600,
        env={**os.environ, "SPARK_LOCAL_IP": "127.0.0.1"},
    )
    assert run.returncode == 0, run.stderr
    assert "spark: resolving" in run.stderr
    got = spark_rows(
        pq.read_table(out / "resolved_kv_address").select(
            ["replica", "seq_id", "token_pos", "physical_address"]
        )
    )
    for name, db in dbs.items():
        assert got[name] == duckdb_resolved(db), name
