"""The vLLM plugin: record an unmodified vLLM server's scheduler as a step log.

``pip install 'pagedkv-sql[vllm]'`` registers ``register`` as the entry point
``pagedkv_sql`` in vLLM's group ``vllm.general_plugins``; vLLM calls it in every process it
starts (the API server, each EngineCore, the workers). It does nothing unless
``PAGEDKV_STEP_LOG`` is set. Then every ``Scheduler`` built in that process (one per
EngineCore process: one per data-parallel rank) records to that path, ``{pid}`` replaced by
the process id (an existing file is kept and ``NAME.1.jsonl`` written instead, a symbolic
link refused: ``replay.record_writer``), through a writer thread: the engine's step only
hands its line over (``PAGEDKV_STEP_LOG_BUFFER``: the bytes of lines it may hold while the
reader lags, 16 MiB by default; past them lines are dropped and the gap marked).
``PAGEDKV_SNAPSHOT_EVERY=N`` also writes a capture snapshot
(``engines.vllm.capture``) beside the log every N steps, ``LOG.step<S>.npz``: the step
copies the pool's per-block fields, the writer thread builds and saves the snapshot; the
last ``PAGEDKV_SNAPSHOT_KEEP`` (default 10; 0: all) are kept.

Heard, once: vLLM configures only its own ``vllm`` logger, so ``pagedkv_sql``'s records
would reach no handler in a server. The plugin hands them to the ``vllm.pagedkv_sql``
logger (vLLM's handlers and format, or Python's last resort on stderr) unless a handler of
the host already takes them. A recorder error is said once, the recorder puts the engine's
methods back and stops, the server keeps serving.

Without the plugin (``VLLM_PLUGINS`` excluding it, or an install without entry points):
``--scheduler-cls pagedkv_sql.plugins.vllm.RecordingScheduler`` with ``PAGEDKV_STEP_LOG``
set does the same for that server.
"""

from __future__ import annotations

import logging
import os
import re
from pathlib import Path
from typing import Any

from .vllm_snapshots import Snapshots

STEP_LOG = "PAGEDKV_STEP_LOG"
SNAPSHOT_EVERY = "PAGEDKV_SNAPSHOT_EVERY"
SNAPSHOT_KEEP = "PAGEDKV_SNAPSHOT_KEEP"
BUFFER = "PAGEDKV_STEP_LOG_BUFFER"
KEEP_DEFAULT = 10
SERVER_LOGGER = "vllm.pagedkv_sql"  # a child of vLLM's own logger: its handlers, its format
log = logging.getLogger("pagedkv_sql.plugins.vllm")
_PATCHED = "_pagedkv_sql_recording"


class ToServerLog(logging.Handler):
    """On the ``pagedkv_sql`` logger: hands each record to vLLM's logger tree, unless
    another handler on the record's way up (the host's logging) takes it already."""

    def emit(self, record: logging.LogRecord) -> None:
        if not reaches_a_handler(logging.getLogger(record.name), besides=self):
            logging.getLogger(SERVER_LOGGER).handle(record)


def reaches_a_handler(logger: logging.Logger, besides: logging.Handler | None = None) -> bool:
    """Whether a record of ``logger`` meets a handler (not a NullHandler, not ``besides``)
    on its way up."""
    current: logging.Logger | None = logger
    while current is not None:
        for h in current.handlers:
            if h is not besides and not isinstance(h, logging.NullHandler):
                return True
        if not current.propagate:
            return False
        current = current.parent
    return False


def heard() -> None:
    """Make ``pagedkv_sql``'s records reach the server's output, once (idempotent). Its
    level becomes INFO where unset, so that the server says where it records."""
    package = logging.getLogger("pagedkv_sql")
    if not any(isinstance(h, ToServerLog) for h in package.handlers):
        package.addHandler(ToServerLog())
    if package.level == logging.NOTSET:
        package.setLevel(logging.INFO)


def register() -> None:
    """vLLM's general-plugin hook: patch ``Scheduler.__init__`` to attach a recorder
    (once per process; inert without ``PAGEDKV_STEP_LOG``)."""
    if not os.environ.get(STEP_LOG):
        return
    heard()
    try:
        from vllm.v1.core.sched.scheduler import Scheduler
    except Exception as e:  # an engine this plugin does not know: say so, never fail it
        log.warning("pagedkv-sql: no vLLM v1 scheduler to record (%r); not recording", e)
        return
    if getattr(Scheduler, _PATCHED, False):
        return
    original = Scheduler.__init__

    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        original(self, *args, **kwargs)
        start(self)

    Scheduler.__init__ = __init__
    setattr(Scheduler, _PATCHED, True)


def log_path(template: str, pid: int | None = None) -> Path:
    """``PAGEDKV_STEP_LOG`` with ``{pid}`` replaced by the process id."""
    return Path(template.replace("{pid}", str(os.getpid() if pid is None else pid)))


class BadSetting(ValueError):
    """An environment variable of the plugin's that is not what it must be."""


def number_setting(name: str, default: int, unit: str = "bytes") -> int:
    """A whole number >= 0 from the environment variable ``name`` (unset or blank:
    ``default``); anything else is a BadSetting naming the variable."""
    text = os.environ.get(name, "").strip()
    if not text:
        return default
    if not re.fullmatch(r"[0-9]{1,18}", text):
        raise BadSetting(f"{name}={text!r} is not a whole number of {unit} (0, 1, 2 ...)")
    return int(text)


def buffer_setting(default: int) -> int:
    """``PAGEDKV_STEP_LOG_BUFFER``: at least a page (4096 bytes)."""
    size = number_setting(BUFFER, default)
    if size < 4096:
        raise BadSetting(f"{BUFFER}={size} is less than 4096 bytes")
    return size


def start(scheduler: Any) -> Any:
    """Attach a recorder to a live ``Scheduler`` as the environment says; None when
    ``PAGEDKV_STEP_LOG`` is unset or the recorder cannot start (logged, never raised)."""
    template = os.environ.get(STEP_LOG)
    if not template:
        return None
    if getattr(scheduler, "_pagedkv_recorder", None) is not None:  # RecordingScheduler
        return scheduler._pagedkv_recorder
    heard()
    try:
        from ..replay import record_writer
        from ..replay.record_vllm import attach
        from ..replay.record_writer import LogRefused

        try:
            record_writer.BUFFER_BYTES = buffer_setting(record_writer.BUFFER_BYTES)
        except BadSetting as e:
            log.error("pagedkv-sql: %s; the buffer is %d bytes", e, record_writer.BUFFER_BYTES)
        path = log_path(template)
        recorder = attach(scheduler, path, safe=True)
    except LogRefused as e:
        log.error("pagedkv-sql: not recording this engine's steps: %s (Fix: %s)", e, e.hint)
        return None
    except Exception as e:
        hint = getattr(e, "hint", "")
        log.error(
            "pagedkv-sql: not recording this engine's steps: %s%s", e, hint and f" (Fix: {hint})"
        )
        return None
    scheduler._pagedkv_recorder = recorder
    written = recorder.path
    if written != path:
        log.warning(
            "pagedkv-sql: %s exists (a previous run's log, kept): recording this engine's "
            "steps to %s",
            path,
            written,
        )
    else:
        log.info("pagedkv-sql: recording the scheduler's steps to %s", written)
    _close_at_shutdown(scheduler, recorder)
    try:
        every = number_setting(SNAPSHOT_EVERY, 0, "steps")
        keep = number_setting(SNAPSHOT_KEEP, KEEP_DEFAULT, "snapshots") if every else KEEP_DEFAULT
    except BadSetting as e:
        log.error(
            "pagedkv-sql: %s; no snapshots are taken, the step log goes on (Fix: set %s to "
            "N >= 1 for a snapshot every N steps, or 0 or nothing for none; %s to how many "
            "to keep, 0 for all)",
            e,
            SNAPSHOT_EVERY,
            SNAPSHOT_KEEP,
        )
        return recorder
    if every > 0:
        Snapshots(recorder, scheduler, every, keep).attach()
    return recorder


def _close_at_shutdown(scheduler: Any, recorder: Any) -> None:
    """The scheduler's shutdown closes the recorder: its last lines written (a stalled
    reader is waited for a few seconds at most)."""
    original = getattr(scheduler, "shutdown", None)
    if original is None:
        return

    def shutdown(*args: Any, **kwargs: Any) -> Any:
        try:
            recorder.close()
        except Exception as e:  # never in the way of the engine's own shutdown
            log.error("pagedkv-sql: closing the step log: %r", e)
        return original(*args, **kwargs)

    scheduler.shutdown = shutdown


def __getattr__(name: str) -> Any:
    """``RecordingScheduler``, built on first use (importing vLLM only then)."""
    if name != "RecordingScheduler":
        raise AttributeError(name)
    from vllm.v1.core.sched.scheduler import Scheduler

    class RecordingScheduler(Scheduler):  # type: ignore[misc]
        """vLLM's Scheduler, recorded to ``PAGEDKV_STEP_LOG`` (``--scheduler-cls``)."""

        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            start(self)

    globals()[name] = RecordingScheduler
    return RecordingScheduler
