"""Compressed inputs and outputs, gzip and zstd, as DuckDB reads and writes them.

- Reading, a file or a stream is told by its first bytes (gzip ``1f 8b``, zstd
  ``28 b5 2f fd``), whatever its name: `open_input` a path, `reader` a stream (stdin, a
  FIFO). What comes back is a binary reader of the plain bytes (with ``peek``), so every
  reader of the package, and ``live``'s, reads compressed input as it reads plain input.
  Corrupt or truncated data is an InputError naming the input, never a codec's traceback.
- The name still counts: ``virtual_token.facts.gz`` is a facts file of ``virtual_token``
  once its compression suffix is set aside (`strip`).
- Writing, the name decides, as DuckDB's ``COPY ... TO 'r.csv.gz'`` does: ``.gz`` gzip,
  ``.zst`` zstd (`output`: the file written whole or not at all, compressed by its suffix).

Standard library only at import (``--help`` reads `strip`); zstd goes through pyarrow's
codec, imported when a zstd stream is read or written.
"""

from __future__ import annotations

import contextlib
import io
import os
from collections.abc import Iterator
from pathlib import PurePath
from typing import IO, Any, cast

from .errors import InputError, UsageError

GZIP, ZSTD = "gzip", "zstd"
SUFFIXES = {".gz": GZIP, ".zst": ZSTD}  # DuckDB's COPY TO reads the same two from a name
MAGIC = {GZIP: b"\x1f\x8b", ZSTD: b"\x28\xb5\x2f\xfd"}
HEAD = 4  # bytes `sniff` needs
_BUFFER = 1 << 20


def sniff(head: bytes) -> str | None:
    """The compression the first bytes of a file or stream name (``gzip``, ``zstd``), or
    None for anything else."""
    for kind, magic in MAGIC.items():
        if head.startswith(magic):
            return kind
    return None


def strip(name: str | os.PathLike[str]) -> tuple[str, str | None]:
    """``name`` without its compression suffix, and the compression that suffix names:
    ``r.csv.gz`` is ``("r.csv", "gzip")``, ``r.csv`` is ``("r.csv", None)``."""
    text = os.fspath(name)
    suffix = PurePath(text).suffix.lower()
    kind = SUFFIXES.get(suffix)
    return (text[: -len(suffix)], kind) if kind is not None else (text, None)


class _Decompressed(io.RawIOBase):
    """The plain bytes of a compressed stream; a codec's error is an InputError naming
    ``label``."""

    def __init__(self, inner: Any, kind: str, label: str, owned: IO[bytes] | None) -> None:
        self._inner = inner
        self._kind = kind
        self._label = label
        self._owned = owned  # the file under the codec, closed with this stream

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        import zlib

        try:
            return int(self._inner.readinto(buffer))
        except (OSError, EOFError, ValueError, zlib.error) as e:
            raise corrupt(self._label, self._kind, e) from None

    def close(self) -> None:
        if not self.closed:
            try:
                self._inner.close()
            finally:
                if self._owned is not None:
                    self._owned.close()
        super().close()


def corrupt(label: str, kind: str, error: BaseException) -> InputError:
    """The error for compressed data a codec refused."""
    why = str(error) or type(error).__name__
    return InputError(
        f"{label}: its {kind} data is corrupt or truncated ({why})",
        hint=f"a file cut short (a copy or a download that did not finish) reads so; "
        f"`{'gzip' if kind == GZIP else 'zstd'} -t FILE` tests it",
    )


def _codec_stream(stream: IO[bytes], kind: str) -> Any:
    if kind == GZIP:
        import gzip

        return gzip.GzipFile(fileobj=stream, mode="rb")
    pa = _pyarrow_with(kind)
    return pa.CompressedInputStream(pa.PythonFile(stream, mode="r"), kind)


def _pyarrow_with(kind: str) -> Any:
    import pyarrow as pa

    if not pa.Codec.is_available(kind):  # pragma: no cover - every pyarrow wheel has zstd
        raise UsageError(f"this pyarrow has no {kind} codec", hint="pip install -U pyarrow")
    return pa


def decompressing(
    stream: IO[bytes], kind: str, label: str, owned: IO[bytes] | None = None
) -> io.BufferedReader:
    """The plain bytes of ``stream``, compressed with ``kind``, as a buffered binary reader
    (``peek`` included); closing it closes ``owned`` (the file under ``stream``) too."""
    return io.BufferedReader(
        _Decompressed(_codec_stream(stream, kind), kind, label, owned), _BUFFER
    )


def reader(stream: IO[bytes], label: str) -> IO[bytes]:
    """A binary stream that may be compressed (stdin, a FIFO, an open file), read as its
    plain bytes: decompressed when its first bytes say gzip or zstd, else as it is (with
    ``peek``, which the readers use to tell a format by its first bytes)."""
    raw: Any = stream
    buffered: Any = raw if hasattr(raw, "peek") else io.BufferedReader(raw)
    kind = sniff(buffered.peek(HEAD)[:HEAD])
    return buffered if kind is None else decompressing(buffered, kind, label)


def open_input(path: str | os.PathLike[str], label: str | None = None) -> IO[bytes]:
    """Open a file (or a FIFO, a device) for reading its plain bytes: decompressed when
    its first bytes say gzip or zstd, whatever its name. OSError as ``open`` raises it;
    a corrupt stream is an InputError (``label``, default the path) when it is read."""
    f: Any = open(path, "rb", buffering=_BUFFER)  # noqa: SIM115 - returned, or closed below
    try:
        kind = sniff(f.peek(HEAD)[:HEAD])
        if kind is None:
            return cast(IO[bytes], f)
        return decompressing(f, kind, label or os.fspath(path), owned=f)
    except BaseException:
        f.close()
        raise


def compressed_file(path: str | os.PathLike[str]) -> str | None:
    """The compression of a regular file's content (``gzip``, ``zstd``), or None (plain,
    or not a regular file, or unreadable: the reader that opens it says why)."""
    import stat

    try:
        if not stat.S_ISREG(os.stat(path).st_mode):
            return None  # before opening: the open of a FIFO waits for its writer
        with open(path, "rb") as f:
            if not stat.S_ISREG(os.fstat(f.fileno()).st_mode):
                return None  # replaced since
            return sniff(f.read(HEAD))
    except OSError:
        return None


class _Unclosed(io.RawIOBase):
    """A writable view of a file that a codec's close leaves open (the file is fsynced
    and renamed after the codec has written its end)."""

    def __init__(self, out: IO[bytes]) -> None:
        self._out = out

    def writable(self) -> bool:
        return True

    def write(self, data: Any) -> int:
        self._out.write(data)
        return len(memoryview(data).cast("B"))

    def flush(self) -> None:
        self._out.flush()


@contextlib.contextmanager
def compressing(out: IO[bytes], kind: str | None) -> Iterator[IO[bytes]]:
    """Write through ``kind`` (None: as it is) into ``out``, the codec's end written when
    the block ends without an error; ``out`` stays open."""
    if kind is None:
        yield out
        return
    if kind == GZIP:
        import gzip

        # level 6, as gzip(1) and DuckDB's writer; no name or time inside: the same rows
        # give the same bytes
        with gzip.GzipFile(fileobj=out, mode="wb", compresslevel=6, filename="", mtime=0) as z:
            yield z  # type: ignore[misc]
        return
    pa = _pyarrow_with(kind)
    stream = pa.CompressedOutputStream(pa.PythonFile(_Unclosed(out), mode="w"), kind)
    try:
        yield stream
    except BaseException:
        with contextlib.suppress(Exception):  # the file is dropped: its end does not matter
            stream.close()
        raise
    stream.close()


@contextlib.contextmanager
def output(path: str | os.PathLike[str]) -> Iterator[IO[bytes]]:
    """``paths.atomic_output(path)``, compressed as its suffix says (``.gz``, ``.zst``)."""
    from .paths import atomic_output

    with atomic_output(path) as f, compressing(f, strip(path)[1]) as stream:
        yield stream


__all__ = [
    "GZIP",
    "HEAD",
    "MAGIC",
    "SUFFIXES",
    "ZSTD",
    "compressed_file",
    "compressing",
    "corrupt",
    "decompressing",
    "open_input",
    "output",
    "reader",
    "sniff",
    "strip",
]
