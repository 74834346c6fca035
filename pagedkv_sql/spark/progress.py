"""Progress of Spark jobs, read from Spark's own status tracker, on stderr.

On a terminal one line is redrawn in place; elsewhere (CI logs, pipes) a line is printed
when a stage finishes or every ``every`` seconds, so a long job is never a silent wait.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, TextIO

if TYPE_CHECKING:
    from pyspark import SparkContext


class Progress:
    def __init__(self, sc: SparkContext, stream: TextIO, *, tty: bool, every: float = 10.0):
        self.sc = sc
        self.stream = stream
        self.tty = tty
        self.every = every
        self.stop = threading.Event()
        self.thread: threading.Thread | None = None
        self.label = ""
        self.start = time.monotonic()
        self.last_print = 0.0
        self.last_line = ""

    @contextmanager
    def step(self, label: str) -> Iterator[None]:
        """Jobs run inside are tagged ``label`` and shown with it."""
        self.label = label
        self.start = time.monotonic()
        self.sc.setJobGroup(label, f"pagedkv-sql {label}", interruptOnCancel=True)
        if not self.tty:
            self._write(f"spark: {label}...")
        self.stop.clear()
        self.thread = threading.Thread(target=self._poll, daemon=True)
        self.thread.start()
        try:
            yield
        finally:
            self.stop.set()
            self.thread.join()
            elapsed = time.monotonic() - self.start
            if self.tty:
                self.stream.write("\r\x1b[2K")
            self._write(f"spark: {label}: done in {elapsed:.1f}s")
            self.sc.setLocalProperty("spark.jobGroup.id", None)  # type: ignore[arg-type, unused-ignore]

    def _write(self, line: str) -> None:
        self.stream.write(line + "\n")
        self.stream.flush()

    def status(self) -> str:
        """'stage S: done/total tasks (n running)' for the active stages of this step."""
        tracker = self.sc.statusTracker()
        parts = []
        done_jobs = 0
        jobs = tracker.getJobIdsForGroup(self.label)
        for job_id in jobs:
            job = tracker.getJobInfo(job_id)
            if job is not None and job.status == "SUCCEEDED":
                done_jobs += 1
        for stage_id in sorted(tracker.getActiveStageIds()):
            info = tracker.getStageInfo(stage_id)
            if info is None:
                continue
            parts.append(
                f"stage {stage_id} {info.numCompletedTasks}/{info.numTasks} tasks"
                + (f" ({info.numActiveTasks} running)" if info.numActiveTasks else "")
            )
        jobs_text = f"{done_jobs}/{len(jobs)} jobs" if jobs else "planning"
        return f"{jobs_text}; {', '.join(parts)}" if parts else jobs_text

    def _poll(self) -> None:
        while not self.stop.wait(0.5):
            try:
                line = f"spark: {self.label}: {self.status()}"
            except Exception:  # the context is stopping: no status to show
                return
            elapsed = time.monotonic() - self.start
            if self.tty:
                self.stream.write(f"\r\x1b[2K{line} {elapsed:.0f}s")
                self.stream.flush()
            elif line != self.last_line and time.monotonic() - self.last_print >= self.every:
                self._write(f"{line} [{elapsed:.0f}s]")
                self.last_print = time.monotonic()
                self.last_line = line
