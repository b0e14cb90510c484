"""Tiny seeded configs of transformers' decoder-only architectures, built with no download.

One generic shrink (every size field an architecture's config declares, set small) plus the
few per-architecture settings a tiny build needs (which layers are hybrid, a window that a
short prompt crosses). The sweep in ``test_transformers_architectures`` runs each one.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import torch

#: Set on every config that declares the field (directly or through its ``attribute_map``).
SHRINK: dict[str, Any] = {
    "vocab_size": 128,
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 4,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 16,
    "max_position_embeddings": 256,
    "pad_token_id": 0,
    "bos_token_id": 1,
    "eos_token_id": 2,
    "sliding_window": 6,
    # mixture of experts
    "moe_intermediate_size": 32,
    "shared_expert_intermediate_size": 32,
    "num_experts": 4,
    "num_local_experts": 4,
    "n_routed_experts": 4,
    "num_experts_per_tok": 2,
    "n_shared_experts": 1,
    "n_group": 1,
    "topk_group": 1,
    # Mamba mixers pad every prompt to a whole chunk
    "mamba_chunk_size": 16,
    "chunk_size": 16,
    # MLA
    "kv_lora_rank": 32,
    "q_lora_rank": 32,
    "qk_rope_head_dim": 8,
    "qk_nope_head_dim": 16,
    "v_head_dim": 16,
}


#: Per-architecture settings beyond the shrink: hybrids get attention layers among their
#: recurrent ones, fields the shrink leaves inconsistent are made consistent.
OVERRIDES: dict[str, dict[str, Any]] = {
    "codegen": {"rotary_dim": 8},
    "gptj": {"rotary_dim": 8},
    "gpt_neo": {"attention_types": [[["global", "local"], 2]], "window_size": 6},
    "bamba": {"attn_layer_indices": [1, 3]},
    "jamba": {"attn_layer_period": 2, "attn_layer_offset": 1},
    "granitemoehybrid": {"layer_types": ["mamba", "attention"] * 2},
    "bailing_hybrid": {"layer_types": ["linear_attention", "full_attention"] * 2},
    "kimi_linear": {"layer_types": ["linear_attention", "full_attention"] * 2},
    "lfm2": {"full_attn_idxs": [1, 3]},
    "lfm2_moe": {"layer_types": ["conv", "full_attention"] * 2},
    "mamba2": {"num_heads": 4, "head_dim": 32, "n_groups": 1, "state_size": 16, "chunk_size": 16},
    "zamba2": {"layers_block_type": ["mamba", "hybrid"] * 2},
    "zaya": {"num_experts_per_tok": 1},
    "dbrx": {
        "d_model": 64,
        "n_heads": 4,
        "n_layers": 4,
        "attn_config": {"kv_n_heads": 2, "rope_theta": 10000.0, "clip_qkv": 8.0},
        "ffn_config": {"ffn_hidden_size": 64, "moe_num_experts": 4, "moe_top_k": 2},
    },
    "reformer": {
        "is_decoder": True,
        "axial_pos_shape": [4, 8],
        "axial_pos_embds_dim": [32, 32],
        "attn_layers": ["local", "local"],
        "max_position_embeddings": 32,
    },
    "dots3_note_text": {"num_key_value_heads": 4},
    "cohere_compass_text": {
        "rope_parameters": {"full_attention": {"rope_type": "default", "rope_theta": 10000.0}}
    },
    "gemma3_text": {"layer_types": ["sliding_attention", "full_attention"] * 2},
    "gemma3n_text": {
        "layer_types": ["sliding_attention", "full_attention"] * 2,
        "num_kv_shared_layers": 2,
        "hidden_size_per_layer_input": 16,
        "vocab_size_per_layer_input": 128,
        "intermediate_size": [128] * 4,
        "activation_sparsity_pattern": [0.0] * 4,
    },
    "gemma4_text": {
        "global_head_dim": 16,
        "layer_types": ["sliding_attention", "full_attention"] * 2,
        "num_kv_shared_layers": 2,
        "hidden_size_per_layer_input": 16,
        "vocab_size_per_layer_input": 128,
    },
}


def _declared(config_class: Any) -> set[str]:
    names = {f.name for f in dataclasses.fields(config_class)}
    return names | set(getattr(config_class, "attribute_map", {}))


def tiny_config(model_type: str, **overrides: Any) -> Any:
    """The config of ``model_type`` with every declared size field shrunk, then ``overrides``."""
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING

    config_class = CONFIG_MAPPING[model_type]
    declared = _declared(config_class)
    kwargs = {k: v for k, v in SHRINK.items() if k in declared}
    if "kv_lora_rank" in declared:  # MLA: the rope width is the head dim
        kwargs["head_dim"] = SHRINK["qk_rope_head_dim"]
        kwargs["num_key_value_heads"] = SHRINK["num_attention_heads"]
    kwargs.update(OVERRIDES.get(model_type, {}))
    kwargs.update(overrides)
    return config_class(**kwargs)


def tiny_model(model_type: str, seed: int = 0, **overrides: Any) -> Any:
    """A seeded random-weight causal LM of ``model_type``, fp32, eval mode: SDPA attention
    where the architecture has it, eager otherwise."""
    import transformers

    config = tiny_config(model_type, **overrides)
    model_class = transformers.AutoModelForCausalLM._model_mapping[type(config)]
    config._attn_implementation = "sdpa" if model_class._supports_sdpa else "eager"
    torch.manual_seed(seed)
    model = transformers.AutoModelForCausalLM.from_config(config)
    return model.to(torch.float32).eval()
