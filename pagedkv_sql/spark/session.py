"""A SparkSession for pagedkv-sql: local or a cluster, Java found or a clear error."""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator, Mapping
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..errors import PagedKVError, UsageError

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

EXTRA_HINT = "install the extra: pip install 'pagedkv-sql[spark]'"
LOG4J = Path(__file__).with_name("log4j2.properties")
# a local session's defaults; a --conf given by the user wins
LOCAL_DEFAULTS = {
    "spark.sql.shuffle.partitions": "8",
    "spark.driver.memory": "4g",
}
DEFAULTS = {
    "spark.ui.enabled": "false",
    "spark.ui.showConsoleProgress": "false",
    "spark.driver.extraJavaOptions": f"-Dlog4j2.configurationFile={LOG4J}",
}


class SparkError(PagedKVError):
    """Spark is missing, cannot start, or a Spark job failed."""


class SparkExtraMissing(SparkError):
    """pyspark or sqlglot is not installed: a usage error (exit 2), as every missing extra."""

    exit_code = 2


def require() -> None:
    """Raise SparkExtraMissing naming the extra when pyspark or sqlglot is not installed."""
    missing = [m for m in ("pyspark", "sqlglot") if not _importable(m)]
    if missing:
        raise SparkExtraMissing(
            f"spark needs {' and '.join(missing)}, which is not installed", hint=EXTRA_HINT
        )


def _importable(module: str) -> bool:
    import importlib.util

    try:
        return importlib.util.find_spec(module) is not None
    except ImportError:  # a finder that refuses it (a broken or blocked install)
        return False


def java_home() -> str | None:
    """Where Java is: $JAVA_HOME, or the `java` on PATH; None when there is none."""
    home = os.environ.get("JAVA_HOME")
    if home and (Path(home) / "bin" / "java").exists():
        return home
    java = shutil.which("java")
    return str(Path(java).resolve().parent.parent) if java else None


def parse_conf(items: list[str] | None) -> dict[str, str]:
    """``--conf k=v`` options as a dict, refusing an item without ``=``."""
    conf: dict[str, str] = {}
    for item in items or []:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise UsageError(
                f"--conf '{item}' is not KEY=VALUE", hint="e.g. --conf spark.executor.memory=4g"
            )
        conf[key.strip()] = value
    return conf


def session(
    master: str | None = None,
    conf: Mapping[str, str] | None = None,
    *,
    app_name: str = "pagedkv-sql",
    log: str | None = None,
) -> SparkSession:
    """Start (or join) a SparkSession: ``master`` is ``local[2]`` by default, or a
    cluster's URL (``spark://host:7077``, ``yarn``, ``k8s://...``). ``log``: a file for
    the JVM's own stderr (the CLI keeps the terminal for its own messages)."""
    require()
    if java_home() is None:
        raise SparkError(
            "Java is not installed (no $JAVA_HOME, no `java` on PATH); Spark runs on Java 17+",
            hint="install it (Debian: apt-get install openjdk-17-jre-headless) or set JAVA_HOME",
        )
    from pyspark.sql import SparkSession

    master = master or "local[2]"
    settings = {**DEFAULTS, **(LOCAL_DEFAULTS if master.startswith("local") else {})}
    settings.update(conf or {})
    builder = SparkSession.builder.appName(app_name).master(master)
    for key, value in settings.items():
        builder = builder.config(key, value)
    with spark_errors(f"cannot start Spark (master {master})"), _jvm_stderr(log):
        spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    return spark


def log_path() -> Path:
    """A new, private place for the JVM's log: ``jvm.log`` in a directory of this process's
    own (``mkdtemp``: mode 0700, a random name), never a guessable name in the shared temp
    directory. ``remove_log`` deletes both."""
    import tempfile

    return Path(tempfile.mkdtemp(prefix="pagedkv-spark-")) / "jvm.log"


def remove_log(log: Path) -> None:
    """Delete a ``log_path()`` log and its private directory."""
    log.unlink(missing_ok=True)
    with suppress(OSError):
        log.parent.rmdir()


@contextmanager
def _jvm_stderr(log: str | None) -> Iterator[None]:
    """Start the JVM with its stderr (Java's start-up notes, Spark's log) going to ``log``
    instead of the terminal; Python's own stderr is back as it was afterwards."""
    if log is None:
        yield
        return
    import sys

    sys.stderr.flush()
    try:  # a new file of this user's only: never through a planted link, never appended to
        fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    except OSError as e:
        raise SparkError(
            f"cannot write Spark's log to {log}: {e.strerror or e}",
            hint="the log must be a new file; give a path that does not exist yet",
        ) from None
    saved = os.dup(2)
    try:
        os.dup2(fd, 2)
        yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)
        os.close(fd)


@contextmanager
def spark_errors(what: str) -> Iterator[None]:
    """Turn Spark's and py4j's exceptions into one SparkError line (no Java traceback)."""
    try:
        yield
    except PagedKVError:
        raise
    except Exception as e:
        if not _is_spark_exception(e):
            raise
        raise SparkError(f"{what}: {first_line(e)}") from None


def _is_spark_exception(e: BaseException) -> bool:
    module = type(e).__module__ or ""
    return module.startswith(("pyspark", "py4j"))


def first_line(e: BaseException) -> str:
    """The message of a Spark exception without its JVM stack trace."""
    getter: Any = getattr(e, "getMessage", None)
    text = ""
    if callable(getter):
        try:
            text = str(getter())
        except Exception:
            text = ""
    text = text or str(e)
    for line in text.splitlines():
        line = line.strip()
        if line and not line.startswith(
            ("at ", "An error occurred while calling", "JVM stacktrace")
        ):
            return line[:500]
    return type(e).__name__
