"""One replica of a simulated fleet: a real vLLM ``KVCacheManager`` (the KV-cache groups
of a ``fuzz vllm --kind``), prefix caching and KV events on, recorded by the step
recorder, scheduled as vLLM's scheduler does in the simplest form (docs/fleet.md, "The
simulation"): each step the running requests decode one token each (in admission order; a
decode that finds no room preempts the latest admitted request, as vLLM does), then the
waiting requests are admitted in order (looked up with ``get_computed_blocks``, allocated
whole with ``allocate_slots``) until one finds no room or ``max_running`` run; a request
that reached its output length is freed. Imports vLLM (the engines venv)."""

from __future__ import annotations

import zlib
from collections import deque
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..fuzz.vllm import KINDS, group_spec
from ..hashes import canonical
from ..replay.record_vllm import Recorder
from .trace import VOCAB, Request


@dataclass
class Admitted:
    """A request's first admission: what its lookup hit (tokens)."""

    request: str
    step: int
    prompt_tokens: int
    cached_tokens: int


def hasher(block_size: int) -> Any:
    """vLLM's request block hasher (SHA-256, the default prefix-caching hash)."""
    from vllm.utils.hashing import sha256
    from vllm.v1.core import kv_cache_utils

    kv_cache_utils.init_none_hash(sha256)
    return kv_cache_utils.get_request_block_hasher(block_size, sha256)


def manager(kind: str, num_blocks: int, block_size: int) -> Any:
    """A real KVCacheManager of the groups of ``kind``, caching and events on."""
    import torch  # type: ignore[import-not-found]  # the engines venv has it
    from vllm.v1 import kv_cache_interface as spec_mod
    from vllm.v1.core import kv_cache_manager

    groups = [
        spec_mod.KVCacheGroupSpec(
            [f"model.layers.{g}.attn"], group_spec(spec_mod, torch, k, block_size)
        )
        for g, k in enumerate(KINDS[kind])
    ]
    config = spec_mod.KVCacheConfig(
        num_blocks=num_blocks, kv_cache_tensors=[], kv_cache_groups=groups
    )
    return kv_cache_manager.KVCacheManager(
        config,
        max_model_len=num_blocks * block_size,
        scheduler_block_size=block_size,
        hash_block_size=block_size,
        enable_caching=True,
        enable_kv_cache_events=True,
    )


class Replica:
    """A replica: its manager, its recorder writing ``steps``, its queues."""

    def __init__(
        self,
        name: str,
        worker_id: int,
        kind: str,
        num_blocks: int,
        block_size: int,
        steps: Path,
        block_hasher: Any,
        max_running: int = 8,
    ) -> None:
        from vllm.sampling_params import SamplingParams
        from vllm.v1.request import Request as VRequest
        from vllm.v1.request import RequestStatus

        self.name, self.worker_id = name, worker_id
        self.m = manager(kind, num_blocks, block_size)
        steps.parent.mkdir(parents=True, exist_ok=True)
        self.log = steps.open("w", encoding="utf-8")  # written in this thread, in step
        self.recorder = Recorder(self.m, self.log)
        self.groups = self.recorder.groups
        self.block_size = block_size
        self.hasher = block_hasher
        self.max_running = max_running
        self._params, self._request, self.status = SamplingParams, VRequest, RequestStatus
        self.waiting: deque[Any] = deque()
        self.running: list[Any] = []
        self.done: list[Any] = []  # finished by the last step, freed at the next one's start
        self.targets: dict[str, int] = {}  # request -> its output length
        self.admitted: list[Admitted] = []  # first admissions of the step
        self.seen: set[str] = set()
        self.finished = self.preempted = 0
        self.digests: dict[int, bytes] = {}  # canonical hash -> digest (record_digests)
        self.record_digests = False

    @property
    def load(self) -> int:
        return len(self.running) + len(self.waiting)

    @property
    def busy(self) -> bool:
        return bool(self.running or self.waiting or self.done)

    def request(self, req: Request) -> Any:
        """The vLLM request of a workload request (its block hashes computed)."""
        params = self._params(max_tokens=req.output_length)
        return self._request(req.id, list(req.tokens), params, None, block_hasher=self.hasher)

    def add(self, vreq: Any, output_length: int) -> None:
        self.targets[vreq.request_id] = output_length
        self.waiting.append(vreq)

    def _sample(self, r: Any) -> None:
        n = len(r.output_token_ids)
        token = 1 + zlib.crc32(f"{r.request_id}:{n}".encode()) % (VOCAB - 1)
        r.append_output_token_ids(token)
        if self.record_digests:
            self._remember(r)

    def _remember(self, r: Any) -> None:
        for h in r.block_hashes:
            self.digests[canonical(bytes(h))] = bytes(h)

    def _finish_if_done(self, r: Any) -> bool:
        if len(r.output_token_ids) < self.targets[r.request_id]:
            return False
        r.status = self.status.FINISHED_LENGTH_CAPPED
        self.running.remove(r)
        self.done.append(r)  # freed at the next step's start, as vLLM frees after the forward
        return True

    def _preempt(self, r: Any) -> None:
        r.status = self.status.PREEMPTED
        self.m.free(r)
        r.num_computed_tokens = 0
        r.num_preemptions += 1
        self.running.remove(r)
        self.waiting.appendleft(r)
        self.preempted += 1

    def step(self, n: int) -> list[Any]:
        """Global step ``n``: decode, admit, record the step; the KV events it published."""
        self.admitted = []
        for r in self.done:
            self.m.free(r)
            del self.targets[r.request_id]
            self.finished += 1
        self.done = []
        for r in list(self.running):
            if r not in self.running:  # preempted by an earlier decode of this step
                continue
            while self.m.allocate_slots(r, 1) is None:
                victim = self.running[-1]
                self._preempt(victim)
                if victim is r:
                    break
            else:
                r.num_computed_tokens += 1
                self._sample(r)
                self._finish_if_done(r)
        while self.waiting and len(self.running) < self.max_running:
            r = self.waiting[0]
            hit, num_hit, *_ = self.m.get_computed_blocks(r)
            todo = r.num_tokens - num_hit
            if self.m.allocate_slots(r, todo, num_hit, hit) is None:
                break
            self.waiting.popleft()
            if r.request_id not in self.seen:
                self.seen.add(r.request_id)
                self.admitted.append(Admitted(r.request_id, n, len(r.prompt_token_ids), num_hit))
            if self.record_digests:
                self._remember(r)
            r.status = self.status.RUNNING
            r.num_computed_tokens = r.num_tokens
            self.running.append(r)
            self._sample(r)
            self._finish_if_done(r)
        self.recorder.step_no = n
        self.recorder.step()
        return list(self.m.take_events())

    def restart(self) -> bool:
        """Every request preempted (a restarted engine lost them; they are sent again),
        the prefix cache reset: vLLM publishes AllBlocksCleared."""
        for r in self.done:
            self.m.free(r)
            del self.targets[r.request_id]
            self.finished += 1
        self.done = []
        for r in reversed(list(self.running)):
            self._preempt(r)
        return bool(self.m.reset_prefix_cache())

    def held(self) -> set[int]:
        """The canonical hashes the pool holds now (any physical copy)."""
        out = set()
        for b in self.m.block_pool.blocks:
            if b.block_hash is not None:
                out.add(canonical(bytes(b.block_hash)[:-4]))
        return out

    def close(self) -> None:
        self.recorder.close()
        self.log.close()
