"""The fleet tier: `fleet sim` over real vLLM KVCacheManagers and NVIDIA Dynamo's real
RadixTree (`make test-fleet`: the engines venv plus ai-dynamo-runtime).

Every test here is marked ``fleet``. Outside the tier's venv vLLM or Dynamo is missing and
the tests skip; inside it (``PAGEDKV_FLEET_TIER=1``, set by the make target) a missing one
is an error, so the tier can never pass by skipping."""

from __future__ import annotations

import importlib
import os
from pathlib import Path

import pytest

ENGINE_CODE = r"(torch|vllm|transformers|triton|pydantic)\b"
REQUIRED = os.environ.get("PAGEDKV_FLEET_TIER") == "1"
os.environ.setdefault("DYN_LOG", "error")  # Dynamo's index logs every event it drops


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    here = Path(__file__).resolve().parent
    for item in items:
        if here in Path(str(item.fspath)).resolve().parents:
            item.add_marker(pytest.mark.fleet)
            item.add_marker(pytest.mark.filterwarnings(f"ignore::DeprecationWarning:{ENGINE_CODE}"))
            item.add_marker(pytest.mark.filterwarnings(f"ignore::FutureWarning:{ENGINE_CODE}"))


@pytest.fixture(scope="session", autouse=True)
def engines() -> None:
    """vLLM and Dynamo, or a skip (an error inside the tier)."""
    for name in ("vllm.v1.core.kv_cache_manager", "dynamo.llm"):
        if REQUIRED:
            importlib.import_module(name)
        else:
            pytest.importorskip(name)
