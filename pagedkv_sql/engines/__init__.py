"""Serving engines' state in and out (docs/engines.md).

One module per engine, looked up by name in ``ENGINES`` and imported only when asked for.
Each engine module provides:

- ``to_state(snapshot, *, convert=False) -> tables.EngineState``: check the snapshot's
  arrays (names, dtypes, shapes, ranges: an ``InputError`` naming the array and index) and
  map them to the engine tables; ``convert`` allows lossless dtype conversions the engine
  itself would not accept (FlashInfer's int64 index arrays).
- optionally ``capture(...) -> Snapshot``: read a live engine object (attributes only).

The stored relations are exported as an engine's arrays by ``export.py`` (the exporter each
face names in faces.py: FlashInfer and vLLM), not by the engine modules.

The doors take a ``Database`` and reach DuckDB through ``Database.cursor()``: ``load`` (a
snapshot imported), ``export_arrays`` (an engine's arrays from the stored relations),
``kv_addresses`` (a token's K and V bytes); ``read`` reads a snapshot file without a
database. ``pagedkv-sql import``, ``export`` and ``explain --layer`` call these functions,
and ``Database.load_engine``, ``export_engine`` and ``kv_addresses`` delegate to them.
Nothing here imports torch or an engine.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

from .. import faces
from ..arguments import argument
from ..errors import UsageError
from . import registry
from . import snapshot as _snapshot
from .export import Export
from .fastcheck import Finding, check_snapshot, check_state, digest
from .meta import members_to_meta
from .registry import ENGINES, engine
from .snapshot import CacheTensor, Snapshot
from .tables import EngineState, ImportReport, Pool

if TYPE_CHECKING:
    from ..database import Database
    from .layout import KVAddress

EXPORTS = faces.EXPORTS  # engines whose arrays `export` writes (each face's exporter)


def read(source: Snapshot | str | os.PathLike[str], name: str | None = None) -> Snapshot:
    """A snapshot object as is, or read from a .safetensors / .npz file; a file's scalar
    members named as metadata keys (a plain ``np.savez(..., page_size=np.array(16))``)
    become its metadata (``meta.members_to_meta``)."""
    if isinstance(source, Snapshot):
        if name is not None and source.engine != name:
            raise UsageError(f"the snapshot is a {source.engine} snapshot, not {name}")
        return source
    snap = _snapshot.load(source, name)
    members_to_meta(snap.engine, snap.arrays, snap.meta, snap.source)
    return snap


def load(
    db: Database,
    snapshot: Snapshot | str | os.PathLike[str],
    engine: str | None = None,
    *,
    strict: bool = False,
    diagnostics: bool = True,
    convert: bool = False,
) -> ImportReport:
    """Replace the stored state with a serving engine's: a ``Snapshot`` (from a capture
    function) or a ``.safetensors`` / ``.npz`` snapshot file, all or nothing."""
    from .tables import write

    with db.cursor("import", write=True) as cur:
        if engine is not None:
            registry.engine(engine)  # an unknown engine: a usage error before any read
        snap = read(snapshot, engine)
        state = registry.engine(snap.engine).to_state(snap, convert=convert)
        return write(cur, state, snap.source, strict=strict, diagnostics=diagnostics)


def export_arrays(db: Database, engine: str) -> Export:
    """The stored relations as an engine's own arrays (its ``write(DIR)`` writes them):
    ``flashinfer`` or ``vllm`` (each face's exporter, faces.py)."""
    with db.cursor("export") as cur:
        argument(engine, "engine", str, f"an engine name: {', '.join(EXPORTS)}")
        if engine not in EXPORTS:
            registry.engine(engine)  # an unknown name gets the did-you-mean
            raise UsageError(
                f"export to {engine} is not supported; export to: {', '.join(EXPORTS)}"
            )
        exporter = faces.BY_NAME[engine].exporter
        assert exporter is not None  # EXPORTS holds the engines that have one
        return faces.part(exporter)(cur)  # type: ignore[no-any-return]


def kv_addresses(
    db: Database, seq_id: int, token_pos: int, layer: int, head: int
) -> list[KVAddress]:
    """The real byte addresses of one token's K and V for a layer and head, from the
    cache-tensor layouts an engine import recorded (``layout.KVAddress``)."""
    from .layout import token_addresses

    with db.cursor("kv addresses") as cur:
        return token_addresses(cur, seq_id, token_pos, layer, head)


__all__ = [
    "ENGINES",
    "EXPORTS",
    "CacheTensor",
    "EngineState",
    "Export",
    "Finding",
    "ImportReport",
    "Pool",
    "Snapshot",
    "check_snapshot",
    "check_state",
    "digest",
    "engine",
    "export_arrays",
    "kv_addresses",
    "load",
    "read",
]
