"""A set of files written whole or not at all (`file_set`): synth's facts, export's arrays,
export parquet's partitions, the example data.

The set is written into a draft directory and moved into place only when complete. The
draft is marked as this process's (spill.py's marker: a file naming a random token and the
owner, locked with ``flock`` for as long as the draft is in use), so a draft left by a
process that was killed (SIGKILL, a power cut) is removed by the next set written into the
same place, and only such a draft: a real directory of the sweeping user, named like a
draft, its marker's token matching its name, its lock held by nobody (a live writer's is
never touched, whatever its PID namespace).

A directory the set needs and that is missing is made, and removed again when the set
fails (`new_directory`): a refused or interrupted command leaves no empty directory.
"""

from __future__ import annotations

import contextlib
import errno
import os
import re
import secrets
import shutil
import stat
from collections.abc import Iterable, Iterator
from pathlib import Path

from . import spill
from .errors import PagedKVError, UsageError
from .paths import fsync

DRAFT_MARKER = ".pagedkv-draft"
_DRAFT_MAGIC = "pagedkv-sql draft directory"
_IN_PLACE = re.compile(r"\.pagedkv-set\.([0-9a-f]{12})\.part")  # a draft inside the target


def _beside(target: Path) -> re.Pattern[str]:
    """The names of the drafts of a whole directory: ``.NAME.<12 hex>.part`` beside it."""
    return re.compile(rf"\.{re.escape(target.name)}\.([0-9a-f]{{12}})\.part", re.S)


@contextlib.contextmanager
def file_set(
    directory: str | os.PathLike[str],
    names: Iterable[str] | None = None,
    *,
    replace: bool = True,
) -> Iterator[Path]:
    """Write a set of files whole or not at all. Yields a new, empty draft directory to
    write the set into; when the block ends, all in it is fsynced and the set takes its
    place in ``directory`` (which must exist with ``names``, its parent without):

    - with ``names`` (relative paths: files, or directories such as ``root_table/x=7``),
      the draft is hidden inside ``directory`` and each name moves into place, replacing
      what ``directory`` holds under it (a directory in one atomic exchange), and only
      that; a file onto a directory, or the reverse, is refused before anything moves.
      With ``replace`` False nothing is replaced: a name that exists (a dangling symlink
      included) or a directory on the way that is a symlink is refused, before and while
      the set moves in (``RENAME_NOREPLACE``);
    - without, the draft is its sibling ``.NAME.<12 hex>.part`` and takes the whole
      directory's place in one atomic exchange; the old one goes, with what it held.

    An error or an interrupt in the block or in moving the set removes the draft and all in
    it: ``directory`` is as it was (but for names moved before a move that failed). Drafts
    of killed processes are swept first (module docstring). This function's own failures
    are a PagedKVError ``cannot write PATH: why``."""
    target = Path(directory)
    wanted = None if names is None else list(names)
    token = secrets.token_hex(6)
    before: list[str] = []
    if wanted is None:
        where, pattern = target.parent, _beside(target)
        draft = target.with_name(f".{target.name}.{token}.part")
        with contextlib.suppress(OSError):
            before = sorted(os.listdir(target)) if target.is_dir() else []
    else:
        if not replace:
            refuse_existing(target, wanted)
        where, pattern = target, _IN_PLACE
        draft = target / f".pagedkv-set.{token}.part"
    sweep(where, pattern)
    try:
        os.mkdir(draft, 0o777)
    except OSError as e:
        raise _cannot(target / wanted[0] if wanted else target, e) from None
    held = spill.mark(str(draft), token, DRAFT_MARKER, _DRAFT_MAGIC)
    old = None
    try:
        yield draft
        if wanted is None:  # the draft becomes the directory: its marker goes first
            with contextlib.suppress(FileNotFoundError):
                os.unlink(draft / DRAFT_MARKER)
        _fsync_tree(draft)
        if wanted is None:
            old = _swap_in(draft, target)
        else:
            _move_in(draft, target, wanted, replace)
    except BaseException:
        shutil.rmtree(draft, ignore_errors=True)  # after a swap: the old directory
        raise
    finally:
        if held is not None:
            os.close(held)
    if old is None:
        shutil.rmtree(draft, ignore_errors=True)  # what the exchanges took out of place
        return
    for path in [old / name for name in before]:  # the old directory: what it held
        with contextlib.suppress(OSError):
            shutil.rmtree(path) if path.is_dir() and not path.is_symlink() else path.unlink()
    with contextlib.suppress(OSError):
        os.rmdir(old)


def sweep(where: Path, pattern: re.Pattern[str]) -> list[str]:
    """Remove the drafts in ``where`` whose name matches ``pattern`` (its group 1 the
    token) and that killed processes left (module docstring); the names removed."""
    removed: list[str] = []
    try:
        parent_fd = os.open(where, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError:
        return removed
    try:
        for name in sorted(os.listdir(parent_fd)):
            match = pattern.fullmatch(name)
            if match is None:
                continue
            fd = spill.leftover(parent_fd, name, match[1], DRAFT_MARKER, _DRAFT_MAGIC)
            if fd is None:
                continue
            try:
                shutil.rmtree(where / name)  # by fd: a symlink inside is removed, not followed
                removed.append(name)
            except OSError:
                pass
            finally:
                os.close(fd)
    except OSError:
        pass
    finally:
        os.close(parent_fd)
    return removed


def refuse_existing(directory: Path, names: list[str]) -> None:
    """For a set that replaces nothing: refuse, naming them, the names that exist (a
    dangling symlink counts) and the directories on their way that are symlinks (which
    would take the set elsewhere)."""
    there, linked = [], []
    for name in names:
        if os.path.lexists(directory / name):
            there.append(name)
        parts = Path(name).parts[:-1]
        for i in range(len(parts)):
            step = directory.joinpath(*parts[: i + 1])
            if os.path.islink(step) and str(step) not in linked:
                linked.append(str(step))
    if linked:
        raise UsageError(
            f"{', '.join(linked)}: a symbolic link where a directory of the set goes; "
            "nothing was written",
            hint="name a new or empty directory",
        )
    if there:
        raise UsageError(
            f"{directory} already has {', '.join(there)}; nothing was written",
            hint="name a new or empty directory",
        )


@contextlib.contextmanager
def new_directory(path: str | os.PathLike[str]) -> Iterator[Path]:
    """``path`` as a directory for the block: made (with its missing parents) if missing,
    and removed again, with the parents made, if the block fails while it is empty."""
    target = Path(path)
    made: list[Path] = []
    for parent in reversed([target, *target.parents]):
        if os.path.lexists(parent):
            continue
        try:
            os.mkdir(parent, 0o777)
        except FileExistsError:
            continue
        except OSError as e:
            for done in reversed(made):
                with contextlib.suppress(OSError):
                    os.rmdir(done)
            raise PagedKVError(f"cannot create {target}: {e.strerror or e}") from None
        made.append(parent)
    if not target.is_dir():
        raise UsageError(f"{target} exists and is not a directory", hint="name a directory")
    try:
        yield target
    except BaseException:
        for done in reversed(made):
            with contextlib.suppress(OSError):  # only while empty: never what others put
                os.rmdir(done)
        raise


def _cannot(path: Path, error: OSError) -> PagedKVError:
    return PagedKVError(f"cannot write {path}: {error.strerror or error}")


def _fsync_tree(top: Path) -> None:
    """Every regular file under ``top`` on disk, then each directory, ``top`` last."""
    try:
        for here, _, files in os.walk(top, topdown=False):
            for path in [os.path.join(here, name) for name in files]:
                if not os.path.islink(path):
                    fsync(path, 0)  # a file
            fsync(here)
    except OSError as e:
        raise _cannot(top, e) from None


def _swap_in(draft: Path, target: Path) -> Path | None:
    """``draft`` in ``target``'s place: where the old directory is now (None: none was)."""
    old = None
    try:
        if not target.exists():
            os.rename(draft, target)
        elif exchange(draft, target):
            old = draft
        else:  # pragma: no cover - no RENAME_EXCHANGE here
            old = Path(f"{draft}.old")
            os.rename(target, old)
            os.rename(draft, target)
        fsync(target.parent)
    except OSError as e:
        raise _cannot(target, e) from None
    return old


def _move_in(draft: Path, directory: Path, names: list[str], replace: bool) -> None:
    """Each name of ``draft`` in its place; a directory replaced goes into the draft."""
    replaces = []
    for name in names:
        dst = directory / name
        is_dir = stat.S_ISDIR(os.lstat(draft / name).st_mode)
        try:
            there = os.lstat(dst).st_mode
            there = os.stat(dst).st_mode if stat.S_ISLNK(there) and not is_dir else there
        except OSError:
            there = None
        if there is not None and is_dir != stat.S_ISDIR(there):
            code = errno.ENOTDIR if is_dir else errno.EISDIR
            raise _cannot(dst, OSError(code, os.strerror(code)))
        replaces.append(is_dir and there is not None)
    parents: list[Path] = []
    dst = directory
    try:
        for i, (name, replace_directory) in enumerate(zip(names, replaces, strict=True)):
            dst = directory / name
            dst.parent.mkdir(parents=True, exist_ok=True)
            if not replace:
                refuse_existing(directory, [name])  # what appeared since the first look
                _rename_new(draft / name, dst)
            elif not replace_directory:
                os.replace(draft / name, dst)
            elif not exchange(draft / name, dst):  # pragma: no cover - no RENAME_EXCHANGE
                os.rename(dst, draft / f".replaced.{i}")
                os.rename(draft / name, dst)
            parents += [] if dst.parent in parents else [dst.parent]
        for dst in parents:
            fsync(dst)
    except OSError as e:
        raise _cannot(dst, e) from None


def _renameat2(a: Path, b: Path, flags: int) -> bool:
    """Linux renameat2; False where the system or the file system cannot do ``flags``."""
    import ctypes

    try:
        libc = ctypes.CDLL(None, use_errno=True)
        renameat2 = libc.renameat2
    except (OSError, AttributeError):  # pragma: no cover - not glibc
        return False
    at_fdcwd = -100
    if renameat2(at_fdcwd, os.fsencode(a), at_fdcwd, os.fsencode(b), flags) == 0:
        return True
    code = ctypes.get_errno()
    if code in (errno.EINVAL, errno.ENOSYS, errno.EOPNOTSUPP):  # pragma: no cover
        return False
    raise OSError(code, os.strerror(code), str(b))


def exchange(a: Path, b: Path) -> bool:
    """Swap two names atomically (RENAME_EXCHANGE); False where that cannot be done."""
    return _renameat2(a, b, 2)


def _rename_new(a: Path, b: Path) -> None:
    """Rename ``a`` to ``b`` only if ``b`` does not exist, in one step (RENAME_NOREPLACE;
    else a hard link, which fails on an existing name, then the old name's unlink)."""
    if _renameat2(a, b, 1):
        return
    os.link(a, b, follow_symlinks=False)  # pragma: no cover - no RENAME_NOREPLACE here
    os.unlink(a)  # pragma: no cover


__all__ = ["DRAFT_MARKER", "exchange", "file_set", "new_directory", "refuse_existing", "sweep"]
