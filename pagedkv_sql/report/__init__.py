"""Pictures of a KV cache: `pagedkv-sql map` (the physical memory of each tier, one cell a
block) and `pagedkv-sql report` (one self-contained HTML page of the whole state).

A capability of its own: it uses the core (the database, its checks and stats) and the
core never imports it. `map`'s plotting library (matplotlib) is the optional extra
``pagedkv-sql[report]``, imported only when a picture is drawn; `report` needs none: its
page carries plotly.js from the package's assets.
"""

from __future__ import annotations

from types import ModuleType

from ..errors import UsageError

INSTALL_HINT = "install it with `pip install 'pagedkv-sql[report]'` (matplotlib)"


def require(module: str) -> ModuleType:
    """Import one of the report extra's libraries, or say how to install it."""
    import importlib

    try:
        return importlib.import_module(module)
    except ImportError:
        top = module.split(".")[0]
        raise UsageError(
            f"drawing needs {top}, which is not installed", hint=INSTALL_HINT
        ) from None
