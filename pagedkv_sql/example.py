"""The README's example data, shipped in the wheel: the spec's test facts (``data/*.facts``)
and a FlashInfer snapshot (``data/engines/flashinfer.npz``), so that its first session works
from a pip install (`pagedkv-sql example DIR`)."""

from __future__ import annotations

import os
import shutil
from importlib import resources
from pathlib import Path

from .errors import PagedKVError, UsageError
from .filesets import file_set, new_directory, refuse_existing

# the wheel carries data/ as pagedkv_sql/example (pyproject.toml); a checkout has data/
FILES = (
    "root_table.facts",
    "block_table_entry.facts",
    "virtual_token.facts",
    "swapped_block.facts",
    "engines/flashinfer.npz",
)


def source() -> Path:
    """Where the example data is: in the installed package, else the checkout's data/."""
    packaged = Path(str(resources.files("pagedkv_sql") / "example"))
    if packaged.is_dir():
        return packaged
    return Path(__file__).resolve().parent.parent / "data"


def write(directory: str | Path) -> list[Path]:
    """Copy the example files into ``directory`` (made if missing), all or none. Nothing
    is replaced and nothing is written through a link: a name already there (a dangling
    symlink counts) or a symlinked ``engines`` refuses all, naming them, before anything is
    written; the files go in with a rename that never replaces (filesets.file_set). A
    failure (a full disk) leaves nothing behind, not even the directory it made."""
    if str(directory) == "":
        raise UsageError(
            "DIR is empty (an unset variable?); nothing was written",
            hint="name the directory to write, e.g. `pagedkv-sql example demo`",
        )
    target = Path(directory)
    origin = source()
    if os.path.lexists(target) and not target.is_dir():
        raise UsageError(f"{target} is not a directory; nothing was written")
    refuse_existing(target, list(FILES))
    with new_directory(target), file_set(target, FILES, replace=False) as draft:
        for name in FILES:
            (draft / name).parent.mkdir(parents=True, exist_ok=True)
            try:
                shutil.copyfile(origin / name, draft / name)
            except OSError as e:
                raise PagedKVError(f"cannot write {target / name}: {e.strerror or e}") from None
    return [target / name for name in FILES]
