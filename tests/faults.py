"""Fault injection for tests/test_faults.py and tests/test_faults_signals.py: the CLI run as
a subprocess, a full tmpfs, a file size limit, signals at random moments, and what a
clean failure leaves (one line, no traceback, no stray file, the old or the new state)."""

from __future__ import annotations

import json
import os
import resource
import signal
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import duckdb

BIN = Path(sys.executable).parent


RUNS = {"cases": 0}  # fault runs made by this module, printed at the end


def everything(path: Path) -> dict[str, list[tuple[Any, ...]]]:
    """Every table of a database (pagedkv's, the engines', the replay log), sorted."""
    con = duckdb.connect(str(path), read_only=True)
    try:
        names = [
            n
            for (n,) in con.execute(
                "SELECT table_name FROM duckdb_tables() WHERE NOT temporary ORDER BY 1"
            ).fetchall()
        ]
        return {n: sorted(con.execute(f'SELECT * FROM "{n}"').fetchall()) for n in names}
    finally:
        con.close()


def cli(
    args: list[str],
    cwd: Path,
    tmpdir: Path,
    *,
    preexec: Callable[[], None] | None = None,
    stdin: Any = subprocess.DEVNULL,
    prefix: tuple[str, ...] = (),
) -> subprocess.Popen[str]:
    env = {**os.environ, "TMPDIR": str(tmpdir), "PATH": f"{BIN}{os.pathsep}{os.environ['PATH']}"}
    env.pop("PAGEDKV_DB", None)
    RUNS["cases"] += 1
    return subprocess.Popen(
        [*prefix, str(BIN / "pagedkv-sql"), *args],
        cwd=cwd,
        env=env,
        stdin=stdin,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=preexec,
    )


def finish(proc: subprocess.Popen[str]) -> tuple[int, str, str]:
    out, err = proc.communicate(timeout=300)
    return proc.returncode, out, err


def clean_error(err: str) -> None:
    """One error message (Ctrl-C: click's 'Aborted!' or ours), or nothing; no traceback."""
    err = err.lstrip("\n")
    assert err.startswith("Error: ") or err == "" or err.startswith("Aborted!"), err
    assert "Traceback" not in err and "Exception ignored" not in err, err


def no_strays(directory: Path, allowed: set[str]) -> None:
    left = {p.name for p in directory.iterdir()}
    assert left <= allowed, left - allowed


def synth_dir(directory: Path, sequences: int) -> Path:
    """A consistent workload of about sequences x 1000 tokens, one file a relation."""
    from pagedkv_sql.synth import SynthConfig, synthesize, write

    write(synthesize(SynthConfig(sequences=sequences, mean_length=1000)), directory)
    return directory


def step_log(path: Path, steps: int) -> Path:
    """A clean step log: each step a new request with fresh blocks and its tokens; the
    request from 20 steps before finishes."""
    header = {
        "pagedkv_step_log": 1,
        "block_size": 16,
        "num_gpu_blocks": 4 * steps + 1,
        "reserved_blocks": [0],
    }
    lines = [json.dumps(header)]
    for s in range(steps):
        blocks = list(range(4 * s + 1, 4 * s + 5))
        step: dict[str, Any] = {
            "step": s,
            "ops": [
                {"op": "allocate", "req": f"r{s}", "blocks": blocks},
                {"op": "append", "req": f"r{s}", "tokens": 60},
            ],
        }
        if s >= 20:
            step["finished"] = [f"r{s - 20}"]
        lines.append(json.dumps(step))
    path.write_text("\n".join(lines) + "\n")
    return path


def fsize_limit(nbytes: int) -> Callable[[], None]:
    """In the child: files may not grow beyond nbytes (EFBIG instead of SIGXFSZ)."""

    def apply() -> None:
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (nbytes, nbytes))

    return apply
