"""Tiny seeded random-weight transformers models, built from configs (nothing is downloaded).

What the demo and the integration's tests generate with: one model per layer kind the
integration maps to a pool (full attention with GQA, alternating full and sliding-window
attention, an MLA latent, a Mamba hybrid). Each is a few layers of hidden size 64 (or what the
caller asks for) with a vocabulary of 128, so a build takes well under a second on a CPU.
"""

from __future__ import annotations

from typing import Any

import torch

__all__ = ["TINY_MODELS", "tiny_config", "tiny_model"]

#: The names ``kvcache demo --engine transformers --model`` accepts, in display order.
TINY_MODELS = ("llama", "qwen2-swa", "deepseek-v3", "bamba")

_VOCAB = 128


def tiny_config(name: str, *, hidden: int = 64, layers: int = 4) -> Any:
    """The transformers config of the tiny model ``name`` (one of [`TINY_MODELS`]).

    :raises ValueError: ``name`` is not a tiny model.
    """
    import transformers

    common: dict[str, Any] = {
        "vocab_size": _VOCAB,
        "hidden_size": hidden,
        "intermediate_size": 2 * hidden,
        "num_hidden_layers": layers,
        "max_position_embeddings": 4096,
        "pad_token_id": 0,
        "bos_token_id": 1,
        "eos_token_id": 2,
    }
    if name == "llama":
        return transformers.LlamaConfig(
            **common, num_attention_heads=4, num_key_value_heads=2, head_dim=hidden // 4
        )
    if name == "qwen2-swa":
        kinds = ["full_attention" if i % 2 == 0 else "sliding_attention" for i in range(layers)]
        return transformers.Qwen2Config(
            **common,
            num_attention_heads=4,
            num_key_value_heads=2,
            use_sliding_window=True,
            sliding_window=6,
            max_window_layers=0,
            layer_types=kinds,
        )
    if name == "deepseek-v3":
        return transformers.DeepseekV3Config(
            **common,
            moe_intermediate_size=hidden,
            num_attention_heads=4,
            num_key_value_heads=4,
            kv_lora_rank=32,
            q_lora_rank=None,
            qk_rope_head_dim=8,
            qk_nope_head_dim=16,
            v_head_dim=16,
            n_routed_experts=4,
            n_shared_experts=1,
            num_experts_per_tok=2,
            n_group=1,
            topk_group=1,
            first_k_dense_replace=1,
        )
    if name == "bamba":
        return transformers.BambaConfig(
            **common,
            num_attention_heads=4,
            num_key_value_heads=2,
            attn_layer_indices=[i for i in range(layers) if i % 2 == 1],
            mamba_n_heads=4,
            mamba_d_head=(2 * hidden) // 4,
            mamba_n_groups=1,
            mamba_d_state=16,
            mamba_d_conv=4,
            mamba_expand=2,
            mamba_chunk_size=16,
        )
    raise ValueError(f"unknown tiny model {name!r}; choose one of {', '.join(TINY_MODELS)}")


def tiny_model(
    name: str,
    *,
    dtype: torch.dtype = torch.float32,
    seed: int = 0,
    hidden: int = 64,
    layers: int = 4,
    attn_implementation: str = "sdpa",
) -> Any:
    """A seeded random-weight causal LM for ``name``, in eval mode, in ``dtype``."""
    import transformers

    config = tiny_config(name, hidden=hidden, layers=layers)
    config._attn_implementation = attn_implementation
    torch.manual_seed(seed)
    model = transformers.AutoModelForCausalLM.from_config(config)
    return model.to(dtype).eval()
