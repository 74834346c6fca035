"""The vLLM plugin's snapshot writer: a process of its own, so that building a
snapshot (O(pool) in Python) never holds the engine's interpreter lock.

The engine's side (``plugins/vllm_snapshots.py``) hands each snapshot over as ``Changes``
(the fields of the pool's blocks written since the last one, the whole pool's with the
first) and a ``Step`` (the free queue's head and count, each request's block ids and
counts); ``Child`` pickles them to ``python -m pagedkv_sql.plugins.vllm_snapshot_writer``,
which keeps a ``Mirror`` of the pool's fields, rebuilds a still image of the manager from
it (``still_image``), runs ``engines.vllm.capture`` on it (the same code as on the live
manager) and saves it with ``save_new``, then answers None, or what went wrong.
"""

from __future__ import annotations

import contextlib
import os
import pickle
import secrets
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace
from typing import IO, Any


@dataclass
class Copied:
    """What a capture reads of a live manager, copied at a step's end."""

    ref_cnt: list[int]
    hashes: list[Any]  # immutable hash objects (bytes), shared, not copied
    nexts: list[Any]  # each block's next in the free queue: a block (ids never change)
    head_next: Any
    tail: Any
    num_free: int
    null_block: int
    hash_block_size: Any
    # per KV-cache group: its block size and each request's (block id, hash tokens) held
    groups: list[tuple[int, dict[Any, list[tuple[int, Any]]]]]
    requests: dict[Any, tuple[Any, int, list[Any]]]  # id -> (request_id, computed, hashes)
    # what capture reads of the groups: each manager's spec, the manager's kv_cache_config,
    # the coordinator's class name (never changed after the engine starts: not copied)
    specs: list[Any] = field(default_factory=list)
    config: Any = None
    coordinator: str = ""


@dataclass
class Changes:
    """The blocks written since the last snapshot handed over, with their fields now;
    ``base``: the whole pool's fields (the first snapshot's, when the mirror starts)."""

    ids: list[int]
    ref_cnt: list[int]
    hashes: list[Any]
    nexts: list[int | None]  # each block's next in the free queue, its id (-1: the tail)
    tokens: list[Any]
    base: Changes | None = None  # every block's, with the first snapshot


@dataclass
class Step:
    """What a snapshot copies of the step besides the blocks' fields: the free queue's
    head and count, each group's tables (each list copied: its blocks, not read), the
    requests' ids, counts and hashes."""

    head_next: int | None  # the free queue's first block's id (-1: the tail, none free)
    num_free: int
    null_block: int
    hash_block_size: Any
    groups: list[tuple[int, dict[Any, list[int]]]]  # each request's block ids
    requests: dict[Any, tuple[Any, int, list[Any]]]
    specs: list[Any]
    config: Any
    coordinator: str


class Mirror:
    """The writer thread's copy of the pool's per-block fields, brought up to date by each
    snapshot's changes."""

    def __init__(self) -> None:
        self.ref_cnt: list[int] = []
        self.hashes: list[Any] = []
        self.nexts: list[Any] = []
        self.tokens: list[Any] = []

    def apply(self, c: Changes) -> None:
        if c.base is not None:
            base = c.base
            self.ref_cnt, self.hashes, self.nexts = base.ref_cnt, base.hashes, base.nexts
            self.tokens = base.tokens
        ref_cnt, hashes, nexts, tokens = self.ref_cnt, self.hashes, self.nexts, self.tokens
        for i, r, h, n, t in zip(c.ids, c.ref_cnt, c.hashes, c.nexts, c.tokens, strict=True):
            ref_cnt[i], hashes[i], nexts[i], tokens[i] = r, h, n, t

    def copied(self, step: Step) -> Copied:
        """The step's state as ``copy_state`` would have copied it then."""
        tokens = self.tokens
        groups = [
            (size, {rid: [(i, tokens[i]) for i in held] for rid, held in tables.items()})
            for size, tables in step.groups
        ]
        return Copied(
            ref_cnt=self.ref_cnt,
            hashes=self.hashes,
            nexts=self.nexts,
            head_next=step.head_next,
            tail=None,
            num_free=step.num_free,
            null_block=step.null_block,
            hash_block_size=step.hash_block_size,
            groups=groups,
            requests=step.requests,
            specs=step.specs,
            config=step.config,
            coordinator=step.coordinator,
        )


class Still:
    """A block of the still image: the fields ``capture`` reads."""

    __slots__ = ("block_hash", "block_hash_num_tokens", "block_id", "next_free_block", "ref_cnt")

    def __init__(self, block_id: int, ref_cnt: int = 0, block_hash: Any = None) -> None:
        self.block_id, self.ref_cnt, self.block_hash = block_id, ref_cnt, block_hash
        self.block_hash_num_tokens: Any = None
        self.next_free_block: Still | None = None


def still_image(c: Copied) -> tuple[Any, dict[Any, Any]]:
    """A manager and requests standing still as copied, for ``capture``."""
    blocks = [Still(i, r, h) for i, (r, h) in enumerate(zip(c.ref_cnt, c.hashes, strict=True))]
    head, tail = Still(-1), Still(-1)

    def still(block: Any) -> Still | None:
        """A next in the free queue: a block, or its id (-1: the queue's tail)."""
        if block is None:
            return None
        if isinstance(block, int):
            return tail if block < 0 else blocks[block]
        return tail if block is c.tail else blocks[int(block.block_id)]

    for b, following in zip(blocks, c.nexts, strict=True):
        b.next_free_block = still(following)
    head.next_free_block = still(c.head_next)
    managers = []
    specs = c.specs or [None] * len(c.groups)
    for (block_size, held), spec in zip(c.groups, specs, strict=True):
        tables = {}
        for rid, ids in held.items():
            tables[rid] = [blocks[int(i)] for i, _ in ids]
            for i, tokens in ids:
                blocks[int(i)].block_hash_num_tokens = tokens
        manager = SimpleNamespace(block_size=block_size, req_to_blocks=tables, kv_cache_spec=spec)
        managers.append(manager)
    queue = SimpleNamespace(
        num_free_blocks=c.num_free, fake_free_list_head=head, fake_free_list_tail=tail
    )
    pool = SimpleNamespace(blocks=blocks, null_block=blocks[c.null_block], free_block_queue=queue)
    if c.hash_block_size is not None:
        pool.hash_block_size = c.hash_block_size
    coordinator = type(c.coordinator or "Coordinator", (), {})()  # capture names its class
    coordinator.single_type_managers = managers
    manager = SimpleNamespace(block_pool=pool, coordinator=coordinator, kv_cache_config=c.config)
    requests = {
        rid: SimpleNamespace(request_id=r, num_computed_tokens=n, block_hashes=h)
        for rid, (r, n, h) in c.requests.items()
    }
    return manager, requests


def save_new(snapshot: Any, target: Path) -> None:
    """Save ``snapshot`` at ``target``, which must not exist: written whole under a hidden
    name beside it, then hard-linked (a link never replaces a name, nor follows one)."""
    part = target.with_name(f".{target.stem}.{secrets.token_hex(6)}.part{target.suffix}")
    snapshot.save(part)
    try:
        os.link(part, target, follow_symlinks=False)
    except FileExistsError:
        raise FileExistsError(
            f"{target} exists (a snapshot never replaces a file or follows a link)"
        ) from None
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(part)


class Child:
    """The writer process, from the engine's side (called in a writer thread): started at
    the first snapshot, ended by ``close`` (its input closed) or with the engine."""

    def __init__(self) -> None:
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        """Start the process (this package's checkout first on its path)."""
        import pagedkv_sql

        home = str(Path(pagedkv_sql.__file__).resolve().parent.parent)
        path = os.environ.get("PYTHONPATH")
        env = {**os.environ, "PYTHONPATH": home + (os.pathsep + path if path else "")}
        argv = [sys.executable, "-m", "pagedkv_sql.plugins.vllm_snapshot_writer"]
        self.proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=env)

    def save(self, changes: Changes, step: Step, target: Path) -> str | None:
        """Have the process save the snapshot at ``target``: None, or what went wrong."""
        if self.proc is None:
            self.start()
        proc = self.proc
        assert proc.stdin is not None and proc.stdout is not None
        try:
            pickle.dump((changes, step, str(target)), proc.stdin, pickle.HIGHEST_PROTOCOL)
            proc.stdin.flush()
            reply: str | None = pickle.load(proc.stdout)
        except (OSError, EOFError, pickle.PickleError) as e:
            return f"the snapshot writer process ended ({proc.poll()}): {e!r}"
        return reply

    def close(self, timeout: float = 10.0) -> None:
        proc, self.proc = self.proc, None
        if proc is None:
            return
        for pipe in (proc.stdin, proc.stdout):
            with contextlib.suppress(OSError, AttributeError):
                pipe.close()  # type: ignore[union-attr]
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def serve(inp: IO[bytes], out: IO[bytes]) -> None:
    """The process's loop: each (changes, step, target) read, the snapshot saved, the
    answer written, until its input ends."""
    from ..engines import vllm

    mirror = Mirror()
    while True:
        try:
            changes, step, target = pickle.load(inp)
        except EOFError:
            return
        reply = None
        try:
            mirror.apply(changes)
            save_new(vllm.capture(*still_image(mirror.copied(step))), Path(target))
        except Exception as e:
            reply = str(e) or repr(e)
        pickle.dump(reply, out, pickle.HIGHEST_PROTOCOL)
        out.flush()


def main() -> None:
    """Answers on the process's own stdout; anything else written there (an engine's
    import logging) goes to stderr."""
    out = os.fdopen(os.dup(1), "wb")
    os.dup2(2, 1)
    serve(sys.stdin.buffer, out)


if __name__ == "__main__":
    main()
