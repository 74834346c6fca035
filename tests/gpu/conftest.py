"""The GPU tier (`make test-gpu`): FlashInfer's attention kernels on a CUDA device, driven
by the exported state (tests/gpu/attention.py, docs/engines.md "The GPU tier").

Every test here is marked ``gpu``. Where torch sees no CUDA device, or FlashInfer is not
installed, every test skips, all with the one reason on one line (CI has no GPU: the tier
neither fails nor waits there). Under ``PAGEDKV_GPU_TIER=1`` (set by tools/gpu_run.sh, the
prepared run on a GPU machine) a missing piece is an error, so the tier cannot pass by
skipping."""

from __future__ import annotations

import importlib
import os
import warnings
from pathlib import Path
from types import SimpleNamespace

import pytest

REQUIRED = os.environ.get("PAGEDKV_GPU_TIER") == "1"
GPU_CODE = r"(torch|flashinfer|tvm_ffi|triton|cuda)\b"
HOW = "it runs where torch sees a CUDA device and flashinfer-python is installed (docs/engines.md)"


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    here = Path(__file__).resolve().parent
    for item in items:
        if here in Path(str(item.fspath)).resolve().parents:
            item.add_marker(pytest.mark.gpu)
            # the libraries' own deprecations and JIT notices are theirs, not ours
            for kind in ("DeprecationWarning", "FutureWarning", "UserWarning"):
                item.add_marker(pytest.mark.filterwarnings(f"ignore::{kind}:{GPU_CODE}"))


def missing() -> tuple[str | None, SimpleNamespace]:
    """Why the tier cannot run here (None: it can), and the modules it runs with."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            torch = importlib.import_module("torch")
        except ImportError:
            return "no torch", SimpleNamespace()
        if not torch.cuda.is_available():
            return f"no CUDA device (torch {torch.__version__})", SimpleNamespace()
        try:
            flashinfer = importlib.import_module("flashinfer")
        except ImportError as e:
            return f"no FlashInfer ({e})", SimpleNamespace()
    name = torch.cuda.get_device_name()
    return None, SimpleNamespace(torch=torch, flashinfer=flashinfer, device="cuda", name=name)


@pytest.fixture(scope="session", autouse=True)
def gpu() -> SimpleNamespace:
    why, modules = missing()
    if why is not None:
        message = f"GPU tier: {why}; {HOW}"
        if REQUIRED:
            pytest.fail(message, pytrace=False)
        pytest.skip(message)
    return modules
