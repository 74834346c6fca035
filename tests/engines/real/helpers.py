"""The real-engine tier's imports, set up when this module is imported (Triton's interpreter,
the torchvision stand-in): a real engine module, or a skip outside the tier and an error
inside it (PAGEDKV_ENGINES_TIER=1); and what its tests share (check's findings of a
snapshot, a prompt prefix of two full blocks)."""

from __future__ import annotations

import importlib.util
import os
import sys
import warnings
from pathlib import Path
from typing import Any

import pytest

STANDINS = Path(__file__).resolve().parent / "standins"


REQUIRED = os.environ.get("PAGEDKV_ENGINES_TIER") == "1"

# SGLang's allocator (alloc_extend / alloc_decode) is Triton kernels: on a CPU they run in
# Triton's interpreter, chosen before anything imports triton (vLLM does too), or
# triton.language's own jit functions (tl.sum) refuse to run in an interpreted kernel
os.environ.setdefault("TRITON_INTERPRET", "1")


def torchvision_standin() -> None:
    """SGLang 0.5.21 imports torchvision at module import; no CPU torchvision works beside
    torch 2.13.0+cpu here. Put the import-only stand-in on sys.path, and only when no
    torchvision is installed."""
    if importlib.util.find_spec("torchvision") is None and str(STANDINS) not in sys.path:
        sys.path.insert(0, str(STANDINS))


def engine_module(name: str) -> object:
    """Import a real engine module, or skip (outside the tier) / fail (inside it)."""
    with warnings.catch_warnings():
        # importing torch and the engines raises their own deprecation warnings, which
        # the suite's filterwarnings = error would turn into collection errors
        warnings.simplefilter("ignore")
        if REQUIRED:
            return importlib.import_module(name)
        return pytest.importorskip(name)


def sql_findings(snap: Any) -> dict[str, list[str]]:
    """The reasons each check of `check` gives after `import` of ``snap`` (the SQL views,
    the reference), by check name; the checks that find nothing left out."""
    import pagedkv_sql

    with pagedkv_sql.connect(":memory:") as db:
        db.load_engine(snap)
        return {
            r.name: r.rows.column("reason").to_pylist()
            for r in db.check(limit=None).results
            if r.count
        }


def engine_modules(*names: str) -> list[Any]:
    """``engine_module`` of each name, in order (a driver's imports)."""
    return [engine_module(name) for name in names]


if importlib.util.find_spec("torch") is not None:
    torchvision_standin()


PREFIX = list(range(32))  # two full blocks of 16
