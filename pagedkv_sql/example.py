"""The README's example data, shipped in the wheel: the spec's test facts (``data/*.facts``)
and a FlashInfer snapshot (``data/engines/flashinfer.npz``), so that its first session works
from a pip install (`pagedkv-sql example DIR`)."""

from __future__ import annotations

import shutil
from importlib import resources
from pathlib import Path

from .errors import UsageError

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
    """Copy the example files into ``directory`` (made if missing). A file already there is
    never replaced: all are refused, naming them, before anything is written."""
    target = Path(directory)
    there = [name for name in FILES if (target / name).exists()]
    if there:
        raise UsageError(
            f"{target} already has {', '.join(there)}; nothing was written",
            hint="name a new or empty directory",
        )
    if target.exists() and not target.is_dir():
        raise UsageError(f"{target} is not a directory; nothing was written")
    origin = source()
    written = []
    for name in FILES:
        (target / name).parent.mkdir(parents=True, exist_ok=True)
        written.append(Path(shutil.copyfile(origin / name, target / name)))
    return written
