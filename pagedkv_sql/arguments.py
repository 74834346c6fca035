"""Library arguments of the wrong type: one check, a ``UsageError`` naming the argument.

A notebook user who passes ``load_engine(123)`` or ``replay([{"step": 0}])`` gets the
project's error saying which argument is wrong and what it should be, never Python's
AttributeError from somewhere inside.
"""

from __future__ import annotations

import json
import numbers
from typing import Any

from .errors import UsageError

SHOWN = 60  # characters of a value quoted in an error


def shown(value: Any) -> str:
    """A value as an error quotes it: as JSON when it is JSON, cut at SHOWN characters."""
    try:
        text = json.dumps(value, allow_nan=True)
    except (TypeError, ValueError, RecursionError):
        text = repr(value) if not isinstance(value, list | tuple | dict | set) else "[...]"
    return text if len(text) <= SHOWN else f"{text[: SHOWN - 8]}... ({len(text):,} characters)"


def is_int(value: Any) -> bool:
    """An integer of Python or numpy, not a boolean."""
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def argument(value: Any, name: str, types: type | tuple[type, ...], what: str) -> Any:
    """``value`` when it is one of ``types`` (a bool is not an int here unless ``types``
    names bool), else a UsageError naming the argument; ``what`` says what it should be."""
    allowed = types if isinstance(types, tuple) else (types,)
    if not isinstance(value, allowed) or (isinstance(value, bool) and bool not in allowed):
        given = "None" if value is None else f"{type(value).__name__} {shown(value)}"
        raise UsageError(f"{name} must be {what}, not {given}")
    return value
