"""transformers generating on kvcache pools gives the tokens and logits of its own cache.

Every (model, dtype, batch, page size) combination: greedy generation on a ``KVPoolCache``
with three retractions of the last row in the middle of generation (its old slots taken away
and every free slot overwritten with garbage before each resume) must equal transformers'
``DynamicCache`` bit for bit, tokens and every step's logits. The negative controls are pools
with one defect each: the same harness must see them differ.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest
import torch
from transformers import DynamicCache

from kvcache_core import discover
from kvcache_core.integrations._hf_drill import poison_free_slots
from kvcache_core.integrations._hf_layout import probe_layout
from kvcache_core.integrations._hf_pool_choice import pool_config
from kvcache_core.integrations.transformers import KVPoolCache

from . import hf_broken_pools
from .hf_harness import Retractor, generate, identical, reference

MODELS = {"llama": "mha", "qwen2-swa": "swa", "deepseek-v3": "mla", "bamba": "mamba"}
STEPS = frozenset({2, 5, 8})  # between forward passes 2|3, 5|6 and 8|9 of 10


def retracting_run(
    model: Any,
    batch: int,
    *,
    page_size: int = 1,
    pool: str | None = None,
    registry: Any = None,
    sample: bool = False,
) -> tuple[Any, KVPoolCache, Retractor]:
    cache = KVPoolCache.for_model(model, pool, size=96, page_size=page_size, registry=registry)
    retractor = Retractor(cache, STEPS, row=batch - 1)
    out = generate(model, cache, batch, processors=[retractor], sample=sample)
    return out, cache, retractor


@pytest.mark.parametrize("page_size", [1, 4])
@pytest.mark.parametrize("batch", [1, 2])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("name", list(MODELS))
def test_identical_to_dynamic_cache_through_retractions(
    tiny: Any, name: str, dtype: torch.dtype, batch: int, page_size: int
) -> None:
    model = tiny(name, dtype)
    want = reference(model, batch)
    got, cache, retractor = retracting_run(model, batch, page_size=page_size)
    assert cache.pool_name == MODELS[name]
    assert cache.retractions == 3 and retractor.moved == [True, True, True]
    assert cache.bytes_offloaded > 0
    assert torch.equal(got.sequences, want.sequences)
    assert identical(got, want)


@pytest.mark.parametrize("batch", [1, 2])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("name", list(MODELS))
def test_sampled_generation_is_identical(
    tiny: Any, name: str, dtype: torch.dtype, batch: int
) -> None:
    """Seeded sampling (the same seed before each run) draws the same tokens from the same
    logits, through three retractions, in both dtypes."""
    model = tiny(name, dtype)
    want = reference(model, batch, sample=True)
    got, cache, retractor = retracting_run(model, batch, sample=True)
    assert cache.retractions == 3 and retractor.moved == [True, True, True]
    assert identical(got, want)


def test_generate_accepts_past_key_values(tiny: Any) -> None:
    model = tiny("llama")
    cache = KVPoolCache.for_model(model, size=64)
    ids = torch.tensor([[5, 6, 7, 8]])
    with pytest.warns(FutureWarning):
        out = model.generate(
            ids, past_key_values=cache, max_new_tokens=4, min_new_tokens=4, do_sample=False
        )
    ref = model.generate(ids, max_new_tokens=4, min_new_tokens=4, do_sample=False)
    assert torch.equal(out, ref) and cache.get_seq_length() == 7


@pytest.fixture(scope="module")
def broken() -> Any:
    return discover(plugins=[hf_broken_pools], allow=[])


@pytest.mark.parametrize(
    ("name", "pool"),
    [
        ("llama", "mha-skips-load"),
        ("bamba", "mamba-drops-state"),
        ("qwen2-swa", "swa-window-leaks"),
    ],
)
def test_negative_controls_differ(tiny: Any, broken: Any, name: str, pool: str) -> None:
    model = tiny(name)
    want = reference(model, 2)
    got, cache, _ = retracting_run(model, 2, pool=pool, registry=broken)
    assert cache.pool_name == pool
    assert not identical(got, want)


@pytest.mark.parametrize("batch_release", [1, 8, 32])
def test_window_slots_are_released_in_batches(tiny: Any, batch_release: int) -> None:
    """Tokens that left every window give their window slots back (``free_swa``), once
    ``window_release_batch`` of them have: never more than that many held beyond the window."""
    model = tiny("qwen2-swa")
    cache = KVPoolCache.for_model(model, size=160)
    cache.window_release_batch = batch_release
    window = model.config.sliding_window
    calls: list[int] = []
    real = cache.allocator.free_swa

    def counting(indices: torch.Tensor) -> None:
        calls.append(indices.numel())
        real(indices)

    cache.allocator.free_swa = counting  # type: ignore[method-assign]
    generate(model, cache, 2, new_tokens=60)
    length = cache.rows.length
    held = cache.allocator.size - cache.allocator.full_available_size()
    assert held == 2 * length  # the full side keeps every token
    window_held = cache.allocator.size - cache.allocator.swa_available_size()
    per_row = window_held // 2
    assert window - 1 <= per_row < window + batch_release
    assert calls and all(n >= 2 * batch_release for n in calls)  # two rows per call


def test_a_retraction_after_window_slots_went_back_is_identical(tiny: Any) -> None:
    """A row whose oldest positions have no window slot any more is offloaded and resumed:
    its snapshot carries only the window rows still held, and the logits stay the same."""
    model = tiny("qwen2-swa")
    want = reference(model, 2)
    cache = KVPoolCache.for_model(model, size=96)
    cache.window_release_batch = 1
    retractor = Retractor(cache, STEPS, row=1)
    got = generate(model, cache, 2, processors=[retractor])
    assert cache.retractions == 3 and cache._window_freed > 0
    assert identical(got, want)


def test_a_sliding_only_model_runs_on_an_mha_kind_pool() -> None:
    """Every layer sliding: the MHA-kind pool keeps every token; the window is read from it."""
    import transformers

    config = transformers.Qwen2Config(
        vocab_size=128,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        pad_token_id=0,
        use_sliding_window=True,
        sliding_window=5,
        max_window_layers=0,
        layer_types=["sliding_attention"] * 2,
    )
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(config).eval()
    want = reference(model, 2)
    got, cache, _ = retracting_run(model, 2, page_size=4)
    assert cache.pool_name == "mha" and cache.retractions == 3
    assert identical(got, want)


@pytest.mark.parametrize("head_major", [False, True], ids=["row-major", "head-major"])
@pytest.mark.parametrize("copy_from", [0, 10**9])
def test_in_place_and_copied_reads_are_both_identical(
    tiny: Any, copy_from: int, head_major: bool
) -> None:
    """A one-row batch on consecutive slots is read in place (a head-major pool always; a
    row-major one below ``copy_from`` positions) or copied head-major out of a row-major pool:
    every path gives ``DynamicCache``'s logits."""
    model = tiny("llama")
    want = reference(model, 1)
    layout = probe_layout(model)
    config = pool_config(layout, size=96, page_size=1, max_batch=1, device=layout.device)
    pool, allocator = discover().create("mha", replace(config, options={"head_major": head_major}))
    cache = KVPoolCache(layout, pool, allocator, "mha")
    cache.copy_from = copy_from
    got = generate(model, cache, 1)
    assert cache.rows.run_start is not None  # the read path under test was taken
    assert identical(got, want)


def test_for_model_builds_an_mha_pool_head_major(tiny: Any) -> None:
    """What the per-step read relies on: each head's slots contiguous, read as a view."""
    cache = KVPoolCache.for_model(tiny("llama"), size=16)
    assert cache.pool.head_major
    assert cache.pool.get_key_buffer(0).transpose(0, 1).is_contiguous()


def test_a_decode_slot_off_the_run_switches_reads_to_the_table(tiny: Any) -> None:
    """A one-row batch reads its run of consecutive slots in place only while every new slot
    extends the run. Here the prefill gets slots 11..20 and the first decode step slot 30:
    from then on reads must go through the slot table (slot 21, never written by this row,
    holds garbage), and the logits stay ``DynamicCache``'s."""
    model = tiny("llama")
    want = reference(model, 1)
    cache = KVPoolCache.for_model(model, "mha", size=96)
    for layer in range(len(cache.layers)):
        for buffer in cache.pool.get_kv_buffer(layer):
            buffer.normal_(generator=torch.Generator().manual_seed(layer))
    allocator = cache.allocator
    everything = allocator.alloc(96)
    assert torch.equal(everything, torch.arange(1, 97))
    order = torch.randperm(56, generator=torch.Generator().manual_seed(0))
    allocator.free(everything[40:][order])  # handed out last, in a shuffled order
    allocator.free(torch.tensor([30]))  # the first decode step's slot
    allocator.free(torch.arange(11, 21))  # the prefill's ten slots, consecutive
    got = generate(model, cache, 1)
    slots = cache.row_slots(0)
    assert slots[:10].tolist() == list(range(11, 21)) and int(slots[10]) == 30
    assert cache.rows.run_start is None
    assert identical(got, want)


def _shift_window_side(cache: KVPoolCache, count: int) -> torch.Tensor:
    """Take ``count`` window slots directly, so the window slot of every token allocated next
    differs from its full slot (a fresh allocator hands both sides out in the same order)."""
    taken: torch.Tensor = cache.allocator.swa_attn_allocator.alloc(count)
    assert taken is not None
    return taken


def test_window_slots_that_differ_from_full_slots_are_written_and_read(tiny: Any) -> None:
    """Window layers write and read the window side's own slots, translated through the
    pool's table once per forward pass, not the full slots; then the cache is released and
    reused with the window side shifted again: nothing translated for the first generation
    may be reused for the second."""
    model = tiny("qwen2-swa")
    want = reference(model, 2)
    cache = KVPoolCache.for_model(model, size=96)
    _shift_window_side(cache, 7)
    retractor = Retractor(cache, STEPS, row=1)
    assert identical(generate(model, cache, 2, processors=[retractor]), want)
    table = cache.pool.full_to_swa_index_mapping
    live = cache.row_slots(0)
    assert not torch.equal(table[live], live)  # the sides really differ
    cache.release()
    _shift_window_side(cache, 3)
    assert identical(generate(model, cache, 2), want)


def test_a_released_cache_translates_its_window_slots_again(tiny: Any) -> None:
    """One-token generations (a prefill only) on one cache, released in between and the window
    side shifted: the second prefill reads the same positions as the first, through new
    window slots, so a translation kept from the first would read the wrong rows."""
    model = tiny("qwen2-swa")
    want = generate(model, DynamicCache(config=model.config), 2, new_tokens=1)
    cache = KVPoolCache.for_model(model, size=96)
    for shift in (5, 3):
        _shift_window_side(cache, shift)
        assert identical(generate(model, cache, 2, new_tokens=1), want)
        cache.release()
        poison_free_slots(cache)  # what the first generation left in its slots is gone


@pytest.mark.parametrize("by_row_from", [0, 10**9], ids=["row-by-row", "one-gather"])
@pytest.mark.parametrize("name", ["llama", "qwen2-swa"])
def test_both_gathers_of_a_batch_are_identical(tiny: Any, name: str, by_row_from: int) -> None:
    """Several rows on a head-major pool are gathered either row by row into the result or
    in one gather and a copy (by length); both give ``DynamicCache``'s logits, retractions
    included."""
    model = tiny(name)
    want = reference(model, 2)
    cache = KVPoolCache.for_model(model, size=96)
    cache.gather_by_row_from = by_row_from
    retractor = Retractor(cache, STEPS, row=1)
    assert identical(generate(model, cache, 2, processors=[retractor]), want)
