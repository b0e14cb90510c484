"""Bad input to the transformers integration: a clear kvcache error, raised before any write."""

from __future__ import annotations

import subprocess
import sys
from typing import Any

import pytest
import torch

from kvcache_core import Capability, KVCacheError, UnknownPoolError, discover
from kvcache_core.integrations._hf_layout import LayerKind, LayerPlan, ModelLayout
from kvcache_core.integrations._hf_pool_choice import required_capabilities
from kvcache_core.integrations.transformers import (
    KVPoolCache,
    MissingCapabilityError,
    OutOfSlotsError,
    PoolDtypeError,
    RowRetractedError,
    RowStateError,
    UnknownHandleError,
    UnsupportedLayerError,
)

from . import hf_broken_pools
from .hf_harness import PROMPTS, generate


@pytest.fixture(scope="module")
def third_party() -> Any:
    return discover(plugins=[hf_broken_pools])


def _pool_bytes(cache: KVPoolCache) -> list[torch.Tensor]:
    return [t.clone() for i in range(cache.pool.layer_num) for t in cache.pool.get_kv_buffer(i)]


def _same(before: list[torch.Tensor], cache: KVPoolCache) -> bool:
    return all(torch.equal(a, b) for a, b in zip(before, _pool_bytes(cache), strict=True))


def test_too_few_slots_names_need_and_free_and_writes_nothing(tiny: Any) -> None:
    model = tiny("llama")
    cache = KVPoolCache.for_model(model, size=16)
    before = _pool_bytes(cache)
    with pytest.raises(OutOfSlotsError, match=r"need 20 token slots.*16 free of 16"):
        generate(model, cache, 2)
    assert _same(before, cache) and cache.allocator.available_size() == 16


def test_model_dtype_changed_after_build_is_refused_before_writing(tiny: Any) -> None:
    model = tiny("llama")
    cache = KVPoolCache.for_model(model, size=32)
    before = _pool_bytes(cache)
    model_bf16 = tiny("llama", torch.bfloat16)
    with pytest.raises(KVCacheError, match=r"computes in torch.bfloat16 but the pool stores"):
        generate(model_bf16, cache, 1)
    assert _same(before, cache) and cache.allocator.available_size() == 32


def test_a_factory_that_ignores_the_dtype_is_refused(tiny: Any, third_party: Any) -> None:
    with pytest.raises(PoolDtypeError, match=r"stores torch.float64 but the model computes in"):
        KVPoolCache.for_model(tiny("llama"), "acme-float64", size=32, registry=third_party)


def test_named_pool_lacking_a_capability_is_refused(tiny: Any, third_party: Any) -> None:
    with pytest.raises(
        MissingCapabilityError, match=r"'mha' lacks .*sliding-window \(layers \[1, 3\]"
    ):
        KVPoolCache.for_model(tiny("qwen2-swa"), "mha", size=32)
    with pytest.raises(MissingCapabilityError, match=r"'acme-unpaged' lacks .*paged"):
        KVPoolCache.for_model(
            tiny("llama"), "acme-unpaged", size=32, page_size=4, registry=third_party
        )
    with pytest.raises(MissingCapabilityError, match=r"'acme-unpaged' lacks .*mla"):
        KVPoolCache.for_model(tiny("deepseek-v3"), "acme-unpaged", size=32, registry=third_party)
    with pytest.raises(UnknownPoolError):
        KVPoolCache.for_model(tiny("llama"), "no-such-pool", size=32)


def test_a_third_party_pool_with_the_capabilities_serves(tiny: Any, third_party: Any) -> None:
    model = tiny("llama")
    cache = KVPoolCache.for_model(model, "acme-unpaged", size=64, registry=third_party)
    out = generate(model, cache, 1, new_tokens=3)
    assert out.sequences.shape[1] == PROMPTS.shape[1] + 3 and cache.pool_name == "acme-unpaged"


def test_no_accepted_pool_with_the_capabilities(tiny: Any) -> None:
    only_mha = discover(allow=["mha"])
    with pytest.raises(MissingCapabilityError, match=r"no accepted pool declares.*mla"):
        KVPoolCache.for_model(tiny("deepseek-v3"), size=32, registry=only_mha)


class _IndexedToy(torch.nn.Module):
    """A model whose second layer transformers caches with its DSA (indexer) layer class."""

    def __init__(self) -> None:
        import transformers

        super().__init__()
        self.config = transformers.Qwen2Config(
            num_hidden_layers=2, layer_types=["full_attention", "indexed_attention"]
        )
        self.weight = torch.nn.Parameter(torch.zeros(1))

    def forward(self, input_ids: torch.Tensor, cache: Any, use_cache: bool) -> None:
        states = torch.zeros(1, 1, input_ids.shape[1], 8)
        for layer in range(2):
            cache.update(states, states, layer)


def test_unserved_layer_type_is_named() -> None:
    with pytest.raises(
        UnsupportedLayerError, match=r"layer 1 \('indexed_attention'.*DynamicIndexedLayer"
    ):
        KVPoolCache.for_model(_IndexedToy(), size=32)


@pytest.mark.parametrize(
    ("kinds", "message"),
    [
        ({LayerKind.MLA, LayerKind.FULL}, "MLA latent, full attention"),
        ({LayerKind.SLIDING, LayerKind.MAMBA}, "Mamba / linear-attention state, sliding-window"),
        ({LayerKind.MLA, LayerKind.MAMBA}, "MLA latent, Mamba / linear-attention state"),
    ],
)
def test_unserved_combinations_are_named(kinds: set[LayerKind], message: str) -> None:
    plans = tuple(LayerPlan(i, kind) for i, kind in enumerate(sorted(kinds)))
    layout = ModelLayout(plans, torch.float32, torch.device("cpu"), None)
    with pytest.raises(UnsupportedLayerError, match=f"mixing {message}"):
        required_capabilities(layout, 1)


def test_a_recurrent_only_model_is_refused_and_layers_caching_nothing_do_not_count() -> None:
    """Mamba layers beside layers that cache nothing are still a recurrent-only model."""
    plans = (LayerPlan(0, LayerKind.MAMBA), LayerPlan(1, LayerKind.NONE))
    layout = ModelLayout(plans, torch.float32, torch.device("cpu"), None)
    with pytest.raises(UnsupportedLayerError, match="no pool kind serves a recurrent-only model"):
        required_capabilities(layout, 1)
    served = ModelLayout((*plans, LayerPlan(2, LayerKind.FULL)), torch.float32, layout.device, None)
    assert required_capabilities(served, 1).needs == {Capability.OFFLOAD, Capability.MAMBA_STATE}


@pytest.mark.parametrize("value", [0, -4, 2.5, True])
def test_bad_sizes(tiny: Any, value: Any) -> None:
    with pytest.raises(ValueError, match="must be a positive int"):
        KVPoolCache.for_model(tiny("llama"), size=value)


def test_retract_and_resume_misuse(tiny: Any) -> None:
    model = tiny("llama")
    cache = KVPoolCache.for_model(model, size=64)
    with pytest.raises(RowStateError, match="no forward pass"):
        cache.retract(0)
    generate(model, cache, 2, new_tokens=2)
    other = KVPoolCache.for_model(model, size=64)
    generate(model, other, 2, new_tokens=2)
    foreign = other.retract(0)
    with pytest.raises(RowStateError, match="out of range"):
        cache.retract(2)
    handle = cache.retract(1)
    with pytest.raises(RowStateError, match="already retracted"):
        cache.retract(1)
    free = cache.allocator.available_size()
    with pytest.raises(UnknownHandleError):
        cache.resume(1, foreign)
    with pytest.raises(RowStateError, match="row 0 is live"):
        cache.resume(0, handle)
    assert cache.allocator.available_size() == free
    with pytest.raises(RowRetractedError, match=r"rows \[1\] are retracted"):
        model(input_ids=torch.tensor([[3], [4]]), cache=cache, use_cache=True)
    cache.resume(1, handle)
    with pytest.raises(UnknownHandleError):
        cache.resume(1, handle)


def test_resume_without_room_keeps_the_handle(tiny: Any) -> None:
    model = tiny("llama")
    cache = KVPoolCache.for_model(model, size=32)
    generate(model, cache, 1, new_tokens=2)
    handle = cache.retract(0)
    hog = cache.allocator.alloc(cache.allocator.available_size() - 4)
    before = _pool_bytes(cache)
    with pytest.raises(OutOfSlotsError, match=r"needs 11 token slots.*4 free"):
        cache.resume(0, handle)
    assert _same(before, cache) and cache.allocator.available_size() == 4
    cache.allocator.free(hog)
    cache.resume(0, handle)
    assert cache.rows.live == [True]


def test_release_gives_every_slot_back(tiny: Any) -> None:
    model = tiny("bamba")
    cache = KVPoolCache.for_model(model, size=64)
    generate(model, cache, 2, new_tokens=2)
    requests = cache.rows.requests
    assert cache.allocator.available_size() < 64 and requests.available_size() == 6
    cache.flush_state()
    cache.release()
    assert cache.allocator.available_size() == 64 and requests.available_size() == 8


def test_flush_state_puts_the_staged_mamba_state_in_the_pool(tiny: Any) -> None:
    model = tiny("bamba")
    cache = KVPoolCache.for_model(model, size=64)
    generate(model, cache, 2, new_tokens=2)
    cache.flush_state()
    slots = cache.rows.request_slots
    for layer in cache.layers:
        if hasattr(layer, "conv_states"):
            conv, temporal = cache.pool.get_mamba_state(layer.plan.index)
            assert torch.equal(conv[0][slots], layer.conv_states[0])
            assert torch.equal(temporal[slots], layer.recurrent_states[0])


def test_unsupported_search_strategies_say_so(tiny: Any) -> None:
    model = tiny("llama")
    cache = KVPoolCache.for_model(model, size=64)
    with pytest.raises(NotImplementedError, match="beam search"):
        model.generate(PROMPTS[:1], cache=cache, num_beams=2, max_new_tokens=3, do_sample=False)


def test_kvcache_core_does_not_import_transformers() -> None:
    code = (
        "import sys, kvcache_core, kvcache_core.integrations, kvcache_core.cli\n"
        "from kvcache_core import discover; discover()\n"
        "assert 'transformers' not in sys.modules, 'transformers imported'\n"
        "import kvcache_core.integrations.transformers\n"
        "assert 'transformers' in sys.modules\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


class _RecurrentToy(torch.nn.Module):
    """Layer 0 keeps a recurrent state and no conv state; layer 1 is full attention."""

    def __init__(self) -> None:
        import transformers

        super().__init__()
        self.config = transformers.Qwen2Config(
            num_hidden_layers=2, layer_types=["linear_attention", "full_attention"]
        )
        self.weight = torch.nn.Parameter(torch.zeros(1))

    def forward(self, input_ids: torch.Tensor, cache: Any, use_cache: bool) -> None:
        batch, tokens = input_ids.shape
        state = input_ids.float().mean(1)[:, None, None] * torch.arange(6.0).view(1, 2, 3)
        cache.update_recurrent_state(state, 0)
        kv = torch.ones(batch, 1, tokens, 8)
        cache.update(kv, kv, 1)


def test_a_recurrent_state_without_a_conv_state_round_trips_through_the_mamba_pool() -> None:
    toy = _RecurrentToy()
    cache = KVPoolCache.for_model(toy, size=32)
    assert cache.pool_name == "mamba" and cache.pool.get_mamba_state(0)[0] == ()
    toy(input_ids=torch.tensor([[5, 6, 7], [8, 9, 10]]), cache=cache, use_cache=True)
    staged = cache.layers[0].recurrent_states[0]
    before = staged.clone()
    assert staged[1].any()
    handle = cache.retract(1)
    assert not staged[1].any()  # the snapshot is the row's only copy now
    cache.resume(1, handle)
    assert torch.equal(staged, before)
