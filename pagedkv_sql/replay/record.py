"""What every engine's step-log recorder shares (docs/replay.md, "Recording a real vLLM").

A recorder subclasses ``StepRecorder``: it reads the log's header fields from the engine's
objects and passes them to ``StepRecorder.__init__`` (which opens the log and writes the
header line), then ``_wrap``s the engine methods it watches. Its wrappers append ops to
``self.ops``; ``step()`` writes them as one JSON line (with ``_observed_step()``'s counts,
if the engine has any) and ``close()`` writes the last step and puts the engine's own
methods back. Engine-specific recorders: ``record_vllm``, ``record_sglang``. Never imports
an engine.

A log named by a path is written by a thread of its own (``record_writer``): the engine's
call only hands the line over. ``safe=True`` is for a recorder inside a serving engine: a
line the writer cannot take at once is dropped and the gap marked, never waited for; an
exception of the recorder's own (a wrapper's bookkeeping, a full disk) is logged once, the
log ends with a stop mark, the engine's methods are put back and the recorder stops; the
call the engine made completes as if nothing were wrapped. Without ``safe`` the hand-over
waits for room and a write error is raised at the next step. The engine's own exceptions
pass through unchanged either way. A stream given instead of a path is written in the
caller's thread and left open.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any, TextIO, TypeVar

from . import record_writer
from .record_writer import LogWriter

R = TypeVar("R", bound="StepRecorder")
log = logging.getLogger("pagedkv_sql.record")


class StepRecorder:
    """Writes a step log to ``path`` (a file name, or an open text stream left open)."""

    def __init__(
        self,
        path: str | os.PathLike[str] | TextIO,
        *,
        engine: str,
        block_size: int,
        num_gpu_blocks: int,
        reserved_blocks: list[int],
        groups: list[dict[str, Any]] | None = None,
        hash_fold: str | None = None,
        safe: bool = False,
    ) -> None:
        header: dict[str, Any] = {
            "pagedkv_step_log": 2,
            "engine": engine,
            "block_size": block_size,
            "num_gpu_blocks": num_gpu_blocks,
            "reserved_blocks": reserved_blocks,
        }
        if groups:  # absent: one full-attention group of block_size (docs/replay.md)
            header["groups"] = groups
        if hash_fold is not None:  # absent: the first 8 bytes (pagedkv_sql/hashes.py)
            header["hash"] = hash_fold
        self.writer: LogWriter | None = None
        self.out: TextIO | None = None
        if isinstance(path, str | os.PathLike):
            self.writer = LogWriter(Path(path), block=not safe)
            self.path: Path | None = self.writer.path  # the name written (never replaced)
        else:  # a stream given is written at once and left open
            self.out, self.path = path, None
        self.step_no = 0
        self.ops: list[dict[str, Any]] = []
        self._originals: list[tuple[Any, str]] = []
        self.safe = safe
        self.failed: BaseException | None = None  # what stopped a safe recorder
        self._line(header)

    def _wrap(self, obj: Any, name: str, wrapper: Callable[..., Any]) -> None:
        """Replace ``obj.name`` on the instance by ``wrapper(original, *args, **kwargs)``."""
        original = getattr(obj, name)
        if not self.safe:

            def call(*args: Any, **kwargs: Any) -> Any:
                return wrapper(original, *args, **kwargs)

        else:

            def call(*args: Any, **kwargs: Any) -> Any:
                if self.failed is not None:
                    return original(*args, **kwargs)
                ran: list[Any] = []  # [result] once the engine's call returned

                def engine(*a: Any, **kw: Any) -> Any:
                    try:
                        result = original(*a, **kw)
                    except BaseException as e:
                        ran.append(e)
                        raise
                    ran.append(result)
                    return result

                try:
                    return wrapper(engine, *args, **kwargs)
                except Exception as e:
                    if ran and ran[0] is e:  # the engine's own error
                        raise
                    self._fail(e)
                    return ran[0] if ran else original(*args, **kwargs)

        self._originals.append((obj, name))
        setattr(obj, name, call)

    def _fail(self, error: BaseException, *, said: bool = False) -> None:
        """A safe recorder's own error: log it once (unless the writer ``said`` it), end
        the log with a stop mark, unwrap, stop writing."""
        self.failed = error
        if not said:
            log.error(
                "pagedkv-sql: the step recorder stopped at step %d (the engine goes on): %r",
                self.step_no,
                error,
                exc_info=error,
            )
        self._unwrap()
        if self.writer is not None:
            self.writer.stop(f"the recorder's own error: {error!r}")

    def _line(self, obj: dict[str, Any]) -> None:
        data = record_writer.line(obj)
        if self.writer is not None:
            self.writer.put(data, obj.get("step"))
        elif self.out is not None:
            self.out.write(data.decode())
            self.out.flush()

    def _writer_error(self) -> bool:
        """The writer stopped (a full disk, a reader gone, the log deleted): a safe
        recorder stops too (the writer said why), an unsafe one raises its error."""
        error = self.writer.error if self.writer is not None else None
        if error is None or self.failed is not None:
            return self.failed is not None
        if not self.safe:
            raise error
        self._fail(error, said=True)
        return True

    def _observed_step(self) -> dict[str, Any] | None:
        """The engine's own counts at the end of a step (the ``observed`` key), or None."""
        return None

    def _start_step(self) -> None:
        """Reset what a subclass gathers per step (``ops`` is reset already)."""

    def step(self) -> int:
        """End the current step: write it (if anything happened) and start the next."""
        if self._writer_error():
            return self.step_no
        if self.ops:
            line: dict[str, Any] = {"step": self.step_no, "ops": self.ops}
            observed = self._observed_step()
            if observed is not None:
                line["observed"] = observed
            self._line(line)
            self.step_no += 1
        self.ops = []
        self._start_step()
        return self.step_no

    def _unwrap(self) -> None:
        for obj, name in reversed(self._originals):
            delattr(obj, name)
        self._originals.clear()

    def flush(self, timeout: float | None = None) -> bool:
        """Wait until every line so far is written (False: ``timeout`` seconds passed)."""
        return self.writer.flush(timeout) if self.writer is not None else True

    def close(self) -> None:
        """Write the last step, put the original methods back and close the log (a safe
        recorder waits a few seconds at most for its reader)."""
        if self.failed is None:
            self.step()
            self._unwrap()
        if self.writer is not None:
            self.writer.close()
            if not self.safe and self.writer.error is not None and self.failed is None:
                raise self.writer.error

    def __enter__(self: R) -> R:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
