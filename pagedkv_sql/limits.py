"""What a real serving engine can hold: the bounds every reader of engine state shares.

Input that claims more is refused before any work is done for it (a 150-byte step log
asking for 3e9 tokens, a 1.2 KB snapshot claiming 2^31 tokens), naming the field.
"""

from __future__ import annotations

INT32_MAX = 2**31 - 1  # block / page ids are int32 in every engine's index arrays
# Token slots a pool may hold: the largest GPU (192 GB) at the smallest KV a real model keeps
# for a token (2 layers x K and V x 64 dims x 2 bytes = 512 bytes) holds about 2^28.5.
MAX_POOL_TOKENS = 1 << 29
