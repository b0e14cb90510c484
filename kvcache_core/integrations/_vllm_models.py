"""Seeded random-weight Llama checkpoints vLLM can load offline (nothing is downloaded).

What the vLLM demo, tests and benchmark serve: a ``LlamaForCausalLM`` built from a config with
seeded weights, saved with ``save_pretrained``, next to a word-level tokenizer made with the
``tokenizers`` package. Each word ``w<i>`` is exactly one token and nothing is added around a
prompt, so a prompt of ``n`` words is ``n`` tokens: tests can place block boundaries exactly.
Needs transformers and tokenizers, which vLLM itself depends on.
"""

from __future__ import annotations

import json
import os
import random
from dataclasses import dataclass

__all__ = ["LlamaShape", "build_llama", "prompt_words", "BENCH_SHAPE", "TINY_SHAPE"]


@dataclass(frozen=True)
class LlamaShape:
    """The geometry of a built model (head size 32 or more: vLLM's CPU kernels need it)."""

    hidden: int = 128
    layers: int = 2
    heads: int = 4
    kv_heads: int = 2
    intermediate: int = 256
    vocab: int = 512
    max_positions: int = 4096
    init_range: float = 0.2
    """Weights' standard deviation: larger than a trained model's default 0.02 so that
    attention, and so the KV, visibly decides the next token (a test that loads wrong KV must
    see other tokens)."""


TINY_SHAPE = LlamaShape()
#: About 100M parameters (12 layers of 768, a 32,000-word vocabulary), for the benchmark.
BENCH_SHAPE = LlamaShape(
    hidden=768,
    layers=12,
    heads=12,
    kv_heads=4,
    intermediate=2048,
    vocab=32000,
    init_range=0.02,
)


def prompt_words(count: int, *, seed: int, vocab: int = TINY_SHAPE.vocab) -> str:
    """A prompt of exactly ``count`` tokens for a model built here, seeded."""
    rng = random.Random(seed)
    return " ".join(f"w{rng.randrange(4, vocab)}" for _ in range(count))


def build_llama(
    path: str, *, seed: int = 0, shape: LlamaShape = TINY_SHAPE, dtype: str = "float32"
) -> str:
    """Write a seeded random Llama and its tokenizer to ``path`` (created); return ``path``.

    The same seed and shape give the same weights bit for bit, so two builds are one model.
    """
    import torch
    from tokenizers import Tokenizer
    from tokenizers.models import WordLevel
    from tokenizers.pre_tokenizers import WhitespaceSplit
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    os.makedirs(path, exist_ok=True)
    specials = ["<pad>", "<s>", "</s>", "<unk>"]
    vocab = {tok: i for i, tok in enumerate(specials)}
    vocab.update({f"w{i}": i for i in range(len(specials), shape.vocab)})
    tokenizer = Tokenizer(WordLevel(vocab, unk_token="<unk>"))
    tokenizer.pre_tokenizer = WhitespaceSplit()
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tokenizer,
        pad_token="<pad>",
        bos_token="<s>",
        eos_token="</s>",
        unk_token="<unk>",
    )
    fast.save_pretrained(path)
    config = LlamaConfig(
        vocab_size=shape.vocab,
        hidden_size=shape.hidden,
        intermediate_size=shape.intermediate,
        num_hidden_layers=shape.layers,
        num_attention_heads=shape.heads,
        num_key_value_heads=shape.kv_heads,
        max_position_embeddings=shape.max_positions,
        initializer_range=shape.init_range,
        pad_token_id=0,
        bos_token_id=1,
        eos_token_id=2,
        tie_word_embeddings=False,
        torch_dtype=dtype,
    )
    torch.manual_seed(seed)
    model = LlamaForCausalLM(config).to(getattr(torch, dtype))
    model.save_pretrained(path, safe_serialization=True)
    with open(os.path.join(path, "kvcache_model.json"), "w", encoding="utf-8") as fh:
        json.dump({"seed": seed, "shape": shape.__dict__}, fh)
    return path
