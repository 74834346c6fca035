"""The JVM's log (spark/session.py): never written through a planted link, never appended
to someone's file, never at a guessable name. No pyspark needed: the
default tier runs these."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from pagedkv_sql.spark.session import SparkError, _jvm_stderr, log_path, remove_log


def test_the_log_goes_to_a_private_directory_with_a_random_name() -> None:
    first, second = log_path(), log_path()
    try:
        assert first.parent != second.parent and first.name == "jvm.log"
        assert str(os.getpid()) not in first.parent.name  # nothing to guess from the pid
        assert stat.S_IMODE(first.parent.stat().st_mode) == 0o700
        with _jvm_stderr(str(first)):
            os.write(2, b"JVM noise\n")
        assert first.read_bytes() == b"JVM noise\n"
        assert stat.S_IMODE(first.stat().st_mode) == 0o600
    finally:
        remove_log(first)
        remove_log(second)
    assert not first.parent.exists() and not second.parent.exists()


@pytest.mark.parametrize("planted", ["symlink", "dangling symlink", "file", "hard link", "fifo"])
def test_a_planted_log_is_refused_and_its_target_untouched(tmp_path: Path, planted: str) -> None:
    victim = tmp_path / "victim.txt"
    victim.write_bytes(b"victim\n")
    log = tmp_path / "pagedkv-spark-1234.log"
    if planted == "symlink":
        log.symlink_to(victim)
    elif planted == "dangling symlink":
        log.symlink_to(tmp_path / "created-by-the-jvm")
    elif planted == "file":
        log.write_bytes(b"someone's\n")
    elif planted == "hard link":
        os.link(victim, log)
    else:
        os.mkfifo(log)
    refused = pytest.raises(SparkError, match=f"cannot write Spark's log to {log}")
    with refused, _jvm_stderr(str(log)):
        os.write(2, b"JVM noise\n")
    assert victim.read_bytes() == b"victim\n"
    assert not (tmp_path / "created-by-the-jvm").exists()
    if planted == "file":
        assert log.read_bytes() == b"someone's\n"
