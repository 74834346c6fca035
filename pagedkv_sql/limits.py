"""What a real serving engine can hold: the bounds every reader of engine state shares.

Input that claims more is refused before any work is done for it (a 150-byte step log
asking for 3e9 tokens, a 1.2 KB snapshot claiming 2^31 tokens), naming the field.
"""

from __future__ import annotations

from typing import Any

INT32_MAX = 2**31 - 1  # block / page ids are int32 in every engine's index arrays
# Tokens a block (a page) holds: the spec's offset_in_block is in [0, 255], so no block holds
# more. Every reader of a block size refuses a larger one: `check --block-size`, an engine
# snapshot's metadata and `import --page-size`, a step log's header, synth, synth-log, fuzz,
# and Spark.
MAX_BLOCK_SIZE = 256
# Token slots a pool may hold: the largest GPU (192 GB) at the smallest KV a real model keeps
# for a token (2 layers x K and V x 64 dims x 2 bytes = 512 bytes) holds about 2^28.5.
MAX_POOL_TOKENS = 1 << 29

# Request ids given beside a snapshot (`import --request-ids FILE`), read before the
# snapshot's sequences are counted: at most what any engine runs at once (vLLM's
# max_num_seqs, SGLang's max_running_requests, TensorRT-LLM's max_batch_size are
# thousands) and no id longer than a few KiB (vLLM's are ~40 bytes, with suffixes ~80)
MAX_REQUEST_IDS = 1 << 20
MAX_REQUEST_ID_BYTES = 4096

# Nesting of a JSON document we read (a step-log line, snapshot metadata). No engine writes more
# than a few levels; Python's json decoder recurses once a level, and on 3.12+ its C recursion
# may go far deeper than the interpreter's limit before (or without) a RecursionError, so the
# depth is bounded here, the same on every Python we support.
MAX_JSON_DEPTH = 512


def check_json_depth(text: str, limit: int = MAX_JSON_DEPTH) -> None:
    """Raise RecursionError when ``text`` nests arrays / objects deeper than ``limit``
    (brackets inside strings do not count). Cheap for every real line: only a text with more
    than ``limit`` opening brackets in all is scanned."""
    if text.count("[") + text.count("{") <= limit:
        return
    import re

    bare = re.sub(r'"(?:[^"\\]|\\.)*"', "", text)
    depth = 0
    for c in re.sub(r"[^\[\]{}]", "", bare):
        depth += 1 if c in "[{" else -1
        if depth > limit:
            raise RecursionError(f"JSON nested deeper than {limit} levels")


class DuplicateKey(ValueError):
    """A JSON object names one key twice (``str(e)`` is the key): JSON readers keep the
    last value and silently drop the first (a free, a block size, an event)."""


def _no_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    obj = dict(pairs)
    if len(obj) != len(pairs):
        seen: set[str] = set()
        for key, _ in pairs:
            if key in seen:
                raise DuplicateKey(key)
            seen.add(key)
    return obj


def loads_strict(text: str | bytes) -> Any:
    """``json.loads``, strictly: a duplicate key in any object is DuplicateKey, nesting past
    MAX_JSON_DEPTH a RecursionError; malformed JSON is json.JSONDecodeError and a number of
    more than 4300 digits a ValueError, as ``json.loads`` has them. Every JSON document we
    read from a user (step-log lines and headers, snapshot metadata, kv-event lines) is read
    by this one function or checked by ``refuse_duplicate_keys``."""
    import json

    check_json_depth(text.decode("utf-8") if isinstance(text, bytes) else text)
    return json.loads(text, object_pairs_hook=_no_duplicates)


def refuse_duplicate_keys(text: bytes, compact: bytes) -> None:
    """DuplicateKey if the JSON ``text`` named a key twice in one object, given ``compact``:
    the value a faster reader parsed from it (keeping the last of two equal keys),
    re-encoded without white space. Every key ends in ``":`` in ``compact``, and in
    ``text`` too unless white space or a ``\\u`` escape intervenes; so equal counts of
    ``":`` prove no key was dropped, and any other text is read again by ``loads_strict``
    (cheap: a C-speed count, where re-reading every line doubled the cost)."""
    exact = b"\\u" in text or any(w in text for w in (b'" ', b'"\t', b'"\r', b'"\n'))
    if exact or text.count(b'":') != compact.count(b'":'):
        loads_strict(text)


# A line of a step log or of a JSON kv-event stream: the longest a real engine writes is a
# step allocating its whole pool at once (2^29 tokens / 16 = 33M block ids, about 300 MB of
# JSON); readers held whole lines, so `replay /dev/zero` grew to 23 GB before the kernel
# killed it. A longer line is refused once this many bytes are read, naming it.
MAX_LINE_BYTES = 1 << 29  # 512 MiB


class LineTooLong(ValueError):
    """Line ``number`` (1-based) of a stream is longer than ``limit`` bytes."""

    def __init__(self, number: int, limit: int) -> None:
        super().__init__(f"line {number} is longer than {limit:,} bytes")
        self.number = number
        self.limit = limit


def bounded_lines(stream: Any, limit: int | None = None) -> Any:
    """The lines of a binary stream (each with its b"\\n"), none longer than ``limit``
    bytes without it (MAX_LINE_BYTES by default): LineTooLong as soon as one is, after
    reading at most ``limit`` + 1 bytes of it."""
    limit = MAX_LINE_BYTES if limit is None else limit
    number = 0
    while True:
        line = stream.readline(limit + 1)
        if not line:
            return
        number += 1
        if len(line) > limit and not line.endswith(b"\n"):
            raise LineTooLong(number, limit)
        yield line


def split_lines(chunks: Any, limit: int | None = None) -> Any:
    """The lines (without b"\\n") of a stream given as chunks of bytes, the last one
    even without its b"\\n"; LineTooLong once a line passes ``limit`` bytes
    (MAX_LINE_BYTES by default). A long line's pieces are joined once, not re-copied at
    every chunk (``rest + chunk`` made a 100 MB line cost minutes)."""
    limit = MAX_LINE_BYTES if limit is None else limit
    pending: list[bytes] = []
    size = number = 0
    for chunk in chunks:
        if b"\n" not in chunk:
            pending.append(chunk)
            size += len(chunk)
            if size > limit:
                raise LineTooLong(number + 1, limit)
            continue
        first, *middle, last = chunk.split(b"\n")
        pending.append(first)
        if size + len(first) > limit:
            raise LineTooLong(number + 1, limit)
        yield b"".join(pending)
        number += 1
        for line in middle:
            if len(line) > limit:
                raise LineTooLong(number + 1, limit)
            yield line
            number += 1
        pending, size = [last], len(last)
        if size > limit:
            raise LineTooLong(number + 1, limit)
    if size:
        yield b"".join(pending)
