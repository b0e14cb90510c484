"""Continuous batching on kvcache pages, sampled and in bf16, against transformers' own run.

Sampling in transformers' continuous batching draws one ``torch.multinomial`` over every row
of a batch, so a sampled run is reproducible only on the same schedule. The reference here is
therefore transformers' own ``generate_batch`` with the settings ``generate_batch`` on kvcache
forces (no block sharing, no async batching), the same seed and the same block pressure, with
its own offload path: its pinned host buffer cannot be allocated on a machine without an
accelerator, so the reference alone allocates it unpinned. Both sides must offload, and give
the same tokens, while kvcache's run has transformers' arena filled with NaN and every freed
pool row poisoned (``poisoned_kvpool``): the tokens come from the pool and back through
``load_cpu_copy``. bf16 is compared the same way (greedy and sampled): batched bf16 matmuls
need not round like one-request ``generate``, but they round like transformers' own batches.
"""

from __future__ import annotations

import gc
from typing import Any

import pytest
import torch
from transformers import GenerationConfig
from transformers.generation.configuration_utils import ContinuousBatchingConfig
from transformers.generation.continuous_batching import offloading_manager

from kvcache_core.integrations.transformers_batching import generate_batch

from ._batching_helpers import PROMPTS, llama, poisoned_kvpool, qwen2_sliding

NEW = 10
SEED = 7
BLOCKS, BLOCK, BATCH_TOKENS = 8, 4, 32


@pytest.fixture(scope="module", autouse=True)
def _quiet_machine():
    """One torch thread, and the objects alive before the runs frozen out of the collector
    (transformers' manager calls ``gc.collect()`` twice per run)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    gc.freeze()
    yield
    gc.unfreeze()
    torch.set_num_threads(threads)


class _UnpinnedTorch:
    """``torch`` as transformers' offloading manager sees it in the reference run: host
    buffers it asks to pin are allocated unpinned (pinning needs an accelerator)."""

    def __getattr__(self, name: str) -> Any:
        return getattr(torch, name)

    @staticmethod
    def empty(*args: Any, pin_memory: bool = False, **kwargs: Any) -> torch.Tensor:
        return torch.empty(*args, **kwargs)


def _config(sample: bool) -> GenerationConfig:
    return GenerationConfig(
        max_new_tokens=NEW, do_sample=sample, top_k=0, eos_token_id=-1, pad_token_id=0
    )


def _results(out: Any) -> list[tuple[list[int], list[float]]]:
    """Each request's tokens and the log-probability of each (compared bit for bit: a token
    survives a small error in a restored key; its log-probability does not)."""
    return [(list(r.generated_tokens), list(r.logprobs)) for r in out.values()]


def _transformers_own(model: Any, sample: bool, monkeypatch: Any) -> list[Any]:
    """transformers' own paged cache and offload, on kvcache's forced schedule settings."""
    with monkeypatch.context() as patch:
        patch.setattr(offloading_manager, "torch", _UnpinnedTorch())
        cb = ContinuousBatchingConfig(
            page_size=BLOCK,
            num_blocks=BLOCKS,
            max_batch_tokens=BATCH_TOKENS,
            seed=SEED,
            allow_block_sharing=False,
            use_async_batching=False,
            cpu_offload_space=0.01,
            return_logprobs=True,
        )
        out = model.generate_batch(
            PROMPTS, generation_config=_config(sample), continuous_batching_config=cb, warmup=False
        )
    return _results(out)


def _on_kvcache(model: Any, sample: bool, monkeypatch: Any, seed: int = SEED) -> Any:
    with poisoned_kvpool(monkeypatch) as spy:
        out = generate_batch(
            model,
            PROMPTS,
            _config(sample),
            num_blocks=BLOCKS,
            block_size=BLOCK,
            max_batch_tokens=BATCH_TOKENS,
            continuous_batching_config=ContinuousBatchingConfig(seed=seed, return_logprobs=True),
        )
    return out, spy


MODELS = {"llama": llama, "qwen2-sliding": qwen2_sliding}


@pytest.mark.parametrize(
    ("name", "dtype", "sample"),
    [
        ("llama", torch.float32, True),
        ("llama", torch.bfloat16, True),
        ("llama", torch.bfloat16, False),
        ("qwen2-sliding", torch.bfloat16, True),
    ],
    ids=["llama-fp32-sampled", "llama-bf16-sampled", "llama-bf16-greedy", "qwen2-bf16-sampled"],
)
def test_under_block_pressure_matches_transformers_own_seeded_run(
    name: str, dtype: torch.dtype, sample: bool, monkeypatch: Any
) -> None:
    model = MODELS[name]().to(dtype)
    want = _transformers_own(model, sample, monkeypatch)
    out, spy = _on_kvcache(model, sample, monkeypatch)
    got = _results(out)
    assert got == want
    assert all(len(logprobs) == NEW for _, logprobs in got)
    assert out.stats.offloads >= 2
    assert spy.load_cpu_copy == out.stats.restores == out.stats.offloads
    assert spy.caches[0].kv_pool.dtype == dtype


def test_the_seed_decides_the_sampled_tokens(monkeypatch: Any) -> None:
    """What makes the comparison above mean something: another seed, other tokens."""
    model = llama()
    want = _transformers_own(model, True, monkeypatch)
    out, _ = _on_kvcache(model, True, monkeypatch, seed=SEED + 1)
    assert [tokens for tokens, _ in _results(out)] != [tokens for tokens, _ in want]
