"""``Database``'s methods of the capabilities, kept for compatibility and frozen:
each is a one-line delegation to a function taking the Database (``engines.load``,
``replay.run``...), its capability imported when it is called. A new capability adds no
method here: it is a package of functions taking a Database (docs/architecture.md). The
core imports a capability nowhere else (tests/test_layering.py)."""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any, cast

if TYPE_CHECKING:  # the capabilities are imported only when used
    import pyarrow as pa

    from .database import Database
    from .engines import Export, ImportReport, Snapshot
    from .engines.layout import KVAddress
    from .replay import Materialized, ReplayReport
    from .replay.apply import ResolvedChange


def _db(methods: Delegations) -> Database:
    """The Database these methods are called on (``Database`` is the one subclass)."""
    return cast("Database", methods)


class Delegations:
    """The capability methods ``Database`` inherits: engines (docs/engines.md), then replay
    (docs/replay.md)."""

    def load_engine(
        self,
        snapshot: Snapshot | str | os.PathLike[str],
        engine: str | None = None,
        *,
        strict: bool = False,
        diagnostics: bool = True,
        convert: bool = False,
    ) -> ImportReport:
        """Replace the stored state with a serving engine's: a ``Snapshot`` (from a
        capture function) or a ``.safetensors`` / ``.npz`` snapshot file, all or nothing.
        Returns an ``engines.ImportReport``. See docs/engines.md. Delegates to
        ``engines.load``; new capabilities add no method here."""
        from . import engines

        return engines.load(
            _db(self), snapshot, engine, strict=strict, diagnostics=diagnostics, convert=convert
        )

    def export_engine(self, engine: str) -> Export:
        """The stored relations as an engine's own arrays (``engines.Export``; its
        ``write(DIR)`` writes them): ``flashinfer`` or ``vllm``. Delegates to
        ``engines.export_arrays``; new capabilities add no method here."""
        from . import engines

        return engines.export_arrays(_db(self), engine)

    def kv_addresses(self, seq_id: int, token_pos: int, layer: int, head: int) -> list[KVAddress]:
        """The real byte addresses of one token's K and V for a layer and head, from the
        cache-tensor layouts an engine import recorded (``engines.layout.KVAddress``).
        Delegates to ``engines.kv_addresses``; new capabilities add no method here."""
        from . import engines

        return engines.kv_addresses(_db(self), seq_id, token_pos, layer, head)

    # -- replay (pagedkv_sql/replay: docs/replay.md) -------------------------------------
    def replay(
        self, log: Any = None, *, keep_going: bool = False, limit: int | None = None
    ) -> ReplayReport:
        """Store a step log (a path, a stream or an event table; None: the one stored) and
        check every invariant at every step: a ReplayReport with the first finding, or all
        of them with ``keep_going``. Delegates to ``replay.run``; new capabilities add no
        method here."""
        from . import replay

        return replay.run(_db(self), log, keep_going=keep_going, limit=limit)

    def replay_at(self, step: int) -> Materialized:
        """Replace the spec's tables with the stored log's state at the end of ``step``.
        Delegates to ``replay.at``; new capabilities add no method here."""
        from . import replay

        return replay.at(_db(self), step)

    def diff(self, from_step: int, to_step: int) -> pa.Table:
        """What changed in the stored log's state from one step to another. Delegates to
        ``replay.diff``; new capabilities add no method here."""
        from . import replay

        return replay.diff(_db(self), from_step, to_step)

    def apply(self, step: Any) -> ResolvedChange:
        """Apply one step of a step log (a dict or a JSON line) in one transaction: refcount
        kept equal to the holders, only the touched keys checked, a breaking step refused
        (StepRefused, nothing written). Returns the change to resolved_kv_address
        (``.added``, ``.removed``). Delegates to ``replay.apply_step``; new capabilities
        add no method here."""
        from . import replay

        return replay.apply_step(_db(self), step)
