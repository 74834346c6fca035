"""The KV-cache events: `Stored`, `Removed`, `Cleared`, `Updated`, `Created`, whose
attributes the checker and the store read (the array layouts' classes in live/decode.py say
the same ones), and the `Batch` a sequence number numbers. live/decode.py decodes msgpack
into them, live/decode_json.py JSON."""

from __future__ import annotations

from typing import Annotated, Any, ClassVar, Protocol

import msgspec

Hash = int | bytes  # vLLM's ExternalBlockHash; SGLang's int
JsonHash = int | str
# a number stored in a BIGINT column (group_idx, window_size): refused when decoded, with
# its line or byte offset, not when stored (msgpack and JSON carry up to 2^64 - 1)
Int64 = Annotated[int, msgspec.Meta(ge=-(2**63), le=2**63 - 1)]
MAX_SEQ = 2**63 - 1
CHUNK = 1 << 20


# -- the common event classes (map layout: vLLM 0.32's field names) ------------------------
class Stored(msgspec.Struct, tag_field="type", tag="BlockStored", gc=False):
    kind: ClassVar[str] = "stored"
    hashes: list[Hash] = msgspec.field(name="block_hashes", default_factory=list)
    parent: Hash | None = msgspec.field(name="parent_block_hash", default=None)
    medium: str | None = None
    group: Int64 | None = msgspec.field(name="group_idx", default=None)
    locality: str | None = None
    ownership: str | None = None
    window: Int64 | None = None
    # vLLM's group metadata: the group's KV-cache spec kind and sliding window
    spec_kind: str | None = msgspec.field(name="kv_cache_spec_kind", default=None)
    spec_window: Int64 | None = msgspec.field(name="kv_cache_spec_sliding_window", default=None)
    # token_ids, block_size, lora_id, lora_name, extra_keys: not fields, so msgspec skips
    # them as unknown keys without making an object (a Raw field cost 20 % of decoding)


class Removed(msgspec.Struct, tag_field="type", tag="BlockRemoved", gc=False):
    kind: ClassVar[str] = "removed"
    hashes: list[Hash] = msgspec.field(name="block_hashes", default_factory=list)
    medium: str | None = None
    group: Int64 | None = msgspec.field(name="group_idx", default=None)
    locality: str | None = None
    ownership: str | None = None
    window: Int64 | None = None
    parent: ClassVar[None] = None
    spec_kind: ClassVar[None] = None
    spec_window: ClassVar[None] = None


class _Unscoped(msgspec.Struct, gc=False):
    """An event without a block's scope: what the checker reads of one is None."""

    parent: ClassVar[None] = None
    medium: ClassVar[None] = None
    group: ClassVar[None] = None
    locality: ClassVar[None] = None
    ownership: ClassVar[None] = None
    spec_kind: ClassVar[None] = None
    spec_window: ClassVar[None] = None


class Cleared(_Unscoped, tag_field="type", tag="AllBlocksCleared"):
    kind: ClassVar[str] = "cleared"
    hashes: ClassVar[list[Any]] = []
    window: ClassVar[None] = None


class Updated(_Unscoped):
    """TensorRT-LLM's `updated` (a stored block's cache level or priority changed)."""

    kind: ClassVar[str] = "updated"
    hashes: list[Any]
    window: Int64 | None = None


class Created(_Unscoped):
    """TensorRT-LLM's `created` (a cache came up: nothing is stored in it yet)."""

    kind: ClassVar[str] = "created"
    window: Int64 | None = None
    hashes: ClassVar[list[Any]] = []


Event = Stored | Removed | Cleared | Updated | Created


class Reader(Protocol):
    def read(self, n: int = -1, /) -> bytes: ...


class Batch(msgspec.Struct, gc=False):
    """One published batch (or one JSON event): what a sequence number numbers (a Struct:
    made in C, one a batch; not tracked by the garbage collector, it holds no cycle)."""

    stream: str  # the publisher's data-parallel rank / worker, within its source
    seq: int | None
    ts: float | None
    where: str  # file@byte, file:line, or endpoint#seq
    events: list[Any]  # Stored | Removed | Cleared | Updated | Created, or an array layout's


class Malformed(Exception):
    """A message that is not a batch of KV events; its text says why, the reader where."""
