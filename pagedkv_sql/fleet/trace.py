"""A fleet simulation's workload: requests with arrival times, prompt tokens and output
lengths, read from a trace file or generated (docs/fleet.md, "Workloads").

- Mooncake (``{timestamp, input_length, output_length, hash_ids}``, one JSON object a
  line; ``timestamp`` in milliseconds, each hash id a block of 512 tokens);
- Qwen-Bailian (``{chat_id, parent_chat_id, timestamp, input_length, output_length, type,
  turn, hash_ids}``; ``timestamp`` in seconds, each hash id a block of 16 tokens): told
  apart from Mooncake by its ``chat_id``;
- ``generate``: shared system prompts, multi-turn sessions and exact retries.

A hash id stands for a block of token ids, the same block wherever it appears
(``id_tokens``): two prompts share a prefix exactly where their hash ids do. A prompt is
the first ``input_length`` tokens of its hash ids' blocks."""

from __future__ import annotations

import json
import random
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from ..errors import InputError, Problem

VOCAB = 32000  # token ids are 1 .. VOCAB - 1
MOONCAKE_BLOCK = 512  # tokens a Mooncake hash id stands for
BAILIAN_BLOCK = 16  # tokens a Qwen-Bailian hash id stands for


@dataclass(frozen=True)
class Request:
    """One request of the workload: its id, arrival (seconds from the start), prompt and
    the tokens it will generate."""

    id: str
    t: float
    tokens: tuple[int, ...]
    output_length: int


def id_tokens(hash_id: int, count: int, salt: int = 0) -> list[int]:
    """The token ids a hash id stands for: ``count`` ids from a generator seeded by it."""
    rng = random.Random((int(hash_id) << 8) ^ salt)
    return [rng.randrange(1, VOCAB) for _ in range(count)]


def _tokens(hash_ids: list[int], input_length: int, block: int, salt: int) -> tuple[int, ...]:
    out: list[int] = []
    for h in hash_ids:
        if len(out) >= input_length:
            break
        out.extend(id_tokens(h, block, salt))
    if len(out) < input_length:  # more tokens than its hash ids cover: a tail of its own
        out.extend(id_tokens(-1 - len(hash_ids), input_length - len(out), salt ^ input_length))
    return tuple(out[:input_length])


def read(path: Path, limit: int | None = None) -> list[Request]:
    """The requests of a Mooncake or Qwen-Bailian trace file (the first ``limit``)."""
    out: list[Request] = []
    source = str(path)
    start: float | None = None
    try:
        lines: Iterator[str] = iter(path.read_text(encoding="utf-8").splitlines())
    except OSError as e:
        raise InputError(f"cannot read the trace {source}: {e.strerror}") from None
    for n, line in enumerate(lines, 1):
        if limit is not None and len(out) >= limit:
            break
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
            bailian = "chat_id" in obj
            stamp = float(obj["timestamp"]) / (1.0 if bailian else 1000.0)
            length = int(obj["input_length"])
            output = int(obj["output_length"])
            ids = [int(h) for h in obj["hash_ids"]]
        except (ValueError, KeyError, TypeError) as e:
            detail = f"missing {e}" if isinstance(e, KeyError) else str(e)
            raise InputError(
                f"{source}:{n}: not a trace record ({detail})",
                problems=[Problem(source, n, None, detail)],
                hint="one JSON object a line: {timestamp, input_length, output_length, "
                "hash_ids} (Mooncake; Qwen-Bailian adds chat_id)",
            ) from None
        if length < 1 or output < 1:
            raise InputError(f"{source}:{n}: input_length and output_length must be positive")
        start = stamp if start is None else start
        block = BAILIAN_BLOCK if bailian else MOONCAKE_BLOCK
        out.append(Request(f"q{len(out)}", stamp - start, _tokens(ids, length, block, 0), output))
    if not out:
        raise InputError(f"the trace {source} has no request", hint="give a non-empty trace")
    return out


def generate(n: int, seed: int, block_size: int, per_second: float) -> list[Request]:
    """``n`` requests (docs/fleet.md, "The generated workload"): 8 system prompts of 3-6
    blocks; sessions of 1-4 turns, each turn's prompt the previous turn's prompt, its
    answer and a new message of 1-3 blocks and a part; 1 request in 12 an exact retry of
    one of the last 8; output 4-24 tokens; arrivals a Poisson process of ``per_second``."""
    rng = random.Random(seed)
    systems = [id_tokens(rng.randrange(1 << 30), block_size * rng.randint(3, 6)) for _ in range(8)]
    out: list[Request] = []
    open_sessions: list[list[int]] = []  # each open session's prompt so far
    t = 0.0
    while len(out) < n:
        t += rng.expovariate(per_second)
        if out and rng.random() < 1 / 12:  # an exact retry of a recent request
            again = rng.choice(out[-8:])
            out.append(Request(f"q{len(out)}", t, again.tokens, again.output_length))
            continue
        if open_sessions and rng.random() < 0.5:
            prompt = open_sessions.pop(rng.randrange(len(open_sessions)))
        else:
            prompt = list(rng.choice(systems))
        message = block_size * rng.randint(1, 3) + rng.randrange(block_size)
        prompt = prompt + id_tokens(rng.randrange(1 << 30), message)
        output = rng.randint(4, 24)
        out.append(Request(f"q{len(out)}", t, tuple(prompt), output))
        if rng.random() < 0.75 and len(prompt) < block_size * 24:  # the session goes on
            answer = id_tokens(rng.randrange(1 << 30), output)
            open_sessions.append(prompt + answer)
    return out
