"""What a real serving engine can hold: the bounds every reader of engine state shares.

Input that claims more is refused before any work is done for it (a 150-byte step log
asking for 3e9 tokens, a 1.2 KB snapshot claiming 2^31 tokens), naming the field.
"""

from __future__ import annotations

INT32_MAX = 2**31 - 1  # block / page ids are int32 in every engine's index arrays
# Token slots a pool may hold: the largest GPU (192 GB) at the smallest KV a real model keeps
# for a token (2 layers x K and V x 64 dims x 2 bytes = 512 bytes) holds about 2^28.5.
MAX_POOL_TOKENS = 1 << 29

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
