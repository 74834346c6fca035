"""The vLLM plugin: record an unmodified vLLM server's scheduler as a step log.

``pip install 'pagedkv-sql[vllm]'`` registers ``register`` as the entry point
``pagedkv_sql`` in vLLM's group ``vllm.general_plugins``; vLLM calls it in every process it
starts (the API server, each EngineCore, the workers). It does nothing unless
``PAGEDKV_STEP_LOG`` is set. Then every ``Scheduler`` built in that process (one per
EngineCore process: one per data-parallel rank) records to that path, ``{pid}`` replaced by
the process id, one line a step, each line flushed (a killed server leaves a complete prefix:
``pagedkv_sql.replay.record_vllm``). ``PAGEDKV_SNAPSHOT_EVERY=N`` also writes a capture
snapshot (``engines.vllm.capture``) beside the log every N steps, ``LOG.step<N>.npz``.

A recorder error never reaches the engine: it is logged once, the recorder puts the engine's
methods back and stops, the server keeps serving.

Without the plugin (``VLLM_PLUGINS`` excluding it, or an install without entry points):
``--scheduler-cls pagedkv_sql.plugins.vllm.RecordingScheduler`` with ``PAGEDKV_STEP_LOG``
set does the same for that server.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Any

STEP_LOG = "PAGEDKV_STEP_LOG"
SNAPSHOT_EVERY = "PAGEDKV_SNAPSHOT_EVERY"
log = logging.getLogger("pagedkv_sql.plugins.vllm")
_PATCHED = "_pagedkv_sql_recording"


def register() -> None:
    """vLLM's general-plugin hook: patch ``Scheduler.__init__`` to attach a recorder
    (once per process; inert without ``PAGEDKV_STEP_LOG``)."""
    if not os.environ.get(STEP_LOG):
        return
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


def start(scheduler: Any) -> Any:
    """Attach a recorder to a live ``Scheduler`` as the environment says; None when
    ``PAGEDKV_STEP_LOG`` is unset or the recorder cannot start (logged, never raised)."""
    template = os.environ.get(STEP_LOG)
    if not template:
        return None
    if getattr(scheduler, "_pagedkv_recorder", None) is not None:  # RecordingScheduler
        return scheduler._pagedkv_recorder
    try:
        from ..replay.record_vllm import attach

        path = log_path(template)
        every = int(os.environ.get(SNAPSHOT_EVERY) or 0)
        recorder = attach(scheduler, path, safe=True)
        if every > 0:
            _snapshot_every(recorder, scheduler, path, every)
    except Exception as e:
        log.error("pagedkv-sql: not recording this engine's steps: %s", e)
        return None
    scheduler._pagedkv_recorder = recorder
    log.info("pagedkv-sql: recording the scheduler's steps to %s", path)
    return recorder


def _snapshot_every(recorder: Any, scheduler: Any, path: Path, every: int) -> None:
    """After each ``every``-th written step, ``capture`` the manager beside the log."""
    from ..engines import vllm

    step = type(recorder).step
    failed: list[Exception] = []  # a snapshot that cannot be taken stops the snapshots only

    def step_and_snapshot() -> int:
        before = recorder.step_no
        after = int(step(recorder))
        if after != before and after % every == 0 and recorder.failed is None and not failed:
            try:
                snap = vllm.capture(scheduler.kv_cache_manager, scheduler.requests)
                snap.save(path.with_name(f"{path.name}.step{after - 1}.npz"))
            except Exception as e:
                failed.append(e)
                log.error("pagedkv-sql: no more snapshots (the step log goes on): %r", e)
        return after

    recorder.step = step_and_snapshot


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
