"""The engine registry: each serving engine's module by name (``ENGINES``), imported only
when asked for (``engine(name)``), an unknown name a ``UsageError`` with a did-you-mean.
Below every engine module and the package's entry points, so that they look an engine up
without importing the package that holds them (engines/__init__.py re-exports both)."""

from __future__ import annotations

import difflib
import importlib
from types import ModuleType

from .. import faces
from ..arguments import argument
from ..errors import UsageError

PACKAGE = __name__.rpartition(".")[0]  # pagedkv_sql.engines

# engine name -> module in this package: each engine's state reader (faces.py)
ENGINES: dict[str, str] = {e.name: e.state.removeprefix(f"{PACKAGE}.") for e in faces.ENGINES}


def engine(name: str) -> ModuleType:
    """The module of one engine, imported on first use."""
    argument(name, "engine", str, f"an engine name: {', '.join(ENGINES)}")
    if name not in ENGINES:
        close = difflib.get_close_matches(name, list(ENGINES), n=1, cutoff=0.6)
        hint = f" (did you mean '{close[0]}'?)" if close else ""
        raise UsageError(f"unknown engine '{name}'{hint}; engines: {', '.join(ENGINES)}")
    module = f"{PACKAGE}.{ENGINES[name]}"
    try:
        return importlib.import_module(module)
    except ModuleNotFoundError as e:
        if e.name != module:
            raise
        raise UsageError(f"engine '{name}' is not available in this build") from None
