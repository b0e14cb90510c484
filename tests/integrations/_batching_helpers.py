"""Tiny seeded models and the poisoning used by the continuous-batching tests.

Poisoning makes any read of storage that should not be read show up in the tokens: the byte
arena transformers' paged cache allocates is filled with 0xFF (NaN in every float dtype), and
the pool rows of every slot its allocator frees (and the window rows of every token whose
window slot goes back) are filled with NaN before they go back, so a restore that did not
really load its snapshot, or a window read past a released page, reads NaN.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import torch
from transformers import (
    GenerationConfig,
    LlamaConfig,
    LlamaForCausalLM,
    Qwen2Config,
    Qwen2ForCausalLM,
)

from kvcache_core.integrations import _batching_cache

PROMPTS = [
    [1, 2, 3, 4, 5, 6, 7, 8, 9],
    [6, 7, 8],
    [9, 10, 11, 12, 13, 14, 15],
    [3, 3, 3, 5],
    [20, 21, 22, 23, 24, 25],
]


def llama() -> LlamaForCausalLM:
    """Llama with grouped-query attention (4 query heads share 2 KV heads), fp32."""
    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=96,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=128,
    )
    return LlamaForCausalLM(config).eval()


def qwen2_sliding() -> Qwen2ForCausalLM:
    """Qwen2 with two full and two sliding-window layers (window 5: shorter than the runs)."""
    torch.manual_seed(1)
    config = Qwen2Config(
        vocab_size=96,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=128,
        use_sliding_window=True,
        sliding_window=5,
        layer_types=["full_attention", "sliding_attention", "full_attention", "sliding_attention"],
    )
    return Qwen2ForCausalLM(config).eval()


def greedy(new_tokens: int) -> GenerationConfig:
    return GenerationConfig(
        max_new_tokens=new_tokens, do_sample=False, eos_token_id=-1, pad_token_id=0
    )


def sequential(model: Any, prompts: list[list[int]], new_tokens: int) -> list[list[int]]:
    """The reference: one ``model.generate`` per prompt, on transformers' DynamicCache."""
    out = []
    for prompt in prompts:
        ids = torch.tensor([prompt])
        tokens = model.generate(
            ids,
            attention_mask=torch.ones_like(ids),
            generation_config=greedy(new_tokens),
        )
        out.append(tokens[0, len(prompt) :].tolist())
    return out


@dataclass
class Spy:
    """What reached the pool: offload and load calls, freed slots, caches built."""

    get_cpu_copy: int = 0
    load_cpu_copy: int = 0
    frees: int = 0
    caches: list[Any] = field(default_factory=list)


def _poison_rows(cache: Any, slots: torch.Tensor, *, window_only: bool = False) -> None:
    pool = cache.kv_pool
    for layer in range(pool.layer_num):
        rows = slots
        if layer in cache._window_layers:
            rows = pool.translate_loc_from_full_to_swa(slots)
            rows = rows[rows > 0]
        elif window_only:
            continue
        k, v = pool.get_kv_buffer(layer)
        k[rows] = float("nan")
        v[rows] = float("nan")


@contextmanager
def poisoned_kvpool(monkeypatch: Any, *, load: Callable[..., None] | None = None) -> Iterator[Spy]:
    """Build every pool-backed cache poisoned, and count what reaches its allocator.

    ``load`` replaces the allocator's ``load_cpu_copy`` (a negative control passes a no-op).
    """
    spy = Spy()
    original = _batching_cache.KVPoolPagedCache.__init__

    def init(self: Any, *args: Any, **kwargs: Any) -> None:
        original(self, *args, **kwargs)
        self.cache_tensor.fill_(0xFF)
        spy.caches.append(self)
        alloc = self.kv_allocator
        real_get, real_load, real_free = alloc.get_cpu_copy, alloc.load_cpu_copy, alloc.free

        def get_cpu_copy(indices: torch.Tensor, mamba_indices: Any = None) -> Any:
            spy.get_cpu_copy += 1
            return real_get(indices, mamba_indices=mamba_indices)

        def load_cpu_copy(snapshot: Any, indices: torch.Tensor, mamba_indices: Any = None) -> None:
            spy.load_cpu_copy += 1
            (load or real_load)(snapshot, indices, mamba_indices=mamba_indices)

        def free(indices: torch.Tensor) -> None:
            spy.frees += 1
            _poison_rows(self, indices)
            real_free(indices)

        alloc.get_cpu_copy, alloc.load_cpu_copy, alloc.free = get_cpu_copy, load_cpu_copy, free
        if hasattr(alloc, "free_swa"):
            real_free_swa = alloc.free_swa

            def free_swa(indices: torch.Tensor) -> None:
                spy.frees += 1
                _poison_rows(self, indices, window_only=True)
                real_free_swa(indices)

            alloc.free_swa = free_swa

    monkeypatch.setattr(_batching_cache.KVPoolPagedCache, "__init__", init)
    yield spy
