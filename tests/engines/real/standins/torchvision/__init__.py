"""A stand-in for torchvision, on sys.path only in the real-engine test tier.

SGLang 0.5.21 imports torchvision at module import (sglang.srt.configs ->
nano_nemotron_vl -> multimodal/internvl_utils: ``import torchvision.transforms as T``),
and no CPU build of torchvision that works beside torch 2.13.0+cpu can be installed here.
The code paths the tier drives (ReqToTokenPool, PagedTokenToKVPoolAllocator,
MHATokenToKVPool, RadixCache) never call torchvision: only image preprocessing for
vision-language models does. Every name imports; using any of them raises.
See docs/engines.md, "The real-engine test tier".
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import sys
import types
from typing import Any

__version__ = "0.0.0+pagedkv-standin"
STANDIN = True


class Unavailable:
    """Any torchvision name: importable, unusable."""

    def __init__(self, name: str) -> None:
        self._name = name

    def __getattr__(self, attr: str) -> Unavailable:
        if attr.startswith("__"):
            raise AttributeError(attr)
        return Unavailable(f"{self._name}.{attr}")

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        raise RuntimeError(
            f"{self._name} was called, but torchvision is only a stand-in in the pagedkv-sql "
            "real-engine test tier (tests/engines/real/standins): the tier must not reach "
            "torchvision code"
        )

    def __repr__(self) -> str:
        return f"<torchvision stand-in {self._name}>"


def _names(module: types.ModuleType) -> Any:
    def __getattr__(name: str) -> Unavailable:
        if name.startswith("__"):
            raise AttributeError(name)
        return Unavailable(f"{module.__name__}.{name}")

    return __getattr__


class _Submodules(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Every ``torchvision.X.Y`` is a stand-in module too (transforms, io, ops...)."""

    def find_spec(self, fullname: str, path: Any = None, target: Any = None) -> Any:
        if not fullname.startswith(__name__ + "."):
            return None
        return importlib.machinery.ModuleSpec(fullname, self, is_package=True)

    def create_module(self, spec: Any) -> None:
        return None

    def exec_module(self, module: types.ModuleType) -> None:
        module.__path__ = []
        module.__getattr__ = _names(module)  # type: ignore[method-assign]


__getattr__ = _names(sys.modules[__name__])
if not any(isinstance(f, _Submodules) for f in sys.meta_path):
    sys.meta_path.append(_Submodules())
