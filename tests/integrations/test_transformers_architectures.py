"""The transformers integration on every decoder-only architecture a tiny config can build.

Nothing in the integration is keyed to a model's name, so each architecture whose layers map
to a pool kind must generate on a ``KVPoolCache`` exactly as on transformers' own
``DynamicCache``: greedy, a batch of two rows (the second left-padded), eight new tokens, the
padded row retracted and resumed in the middle (its old slots taken away, every free slot
overwritten with garbage first), tokens and every step's logits bit-identical. Each runs on
the pool the capabilities choose, recorded here (and in docs/integrations/transformers.md).
An architecture whose layers no pool kind serves must be refused by ``for_model`` itself, with
a ``KVCacheError`` that names the layer (or says why the model as a whole cannot be served).
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
import torch
from transformers import DynamicCache
from transformers.cache_utils import DummyLayer

from kvcache_core import KVCacheError, discover
from kvcache_core.integrations._hf_layout import LayerKind, probe_layout
from kvcache_core.integrations.transformers import KVPoolCache, UnsupportedLayerError

from . import hf_broken_pools
from .hf_architectures import tiny_model
from .hf_harness import Retractor, generate, identical

NEW_TOKENS = 8
GUIDE = Path(__file__).resolve().parents[2] / "docs" / "integrations" / "transformers.md"

#: Architecture -> the pool ``for_model`` chooses for it (by capabilities, never by name).
RUNS = {
    **dict.fromkeys(
        [
            "apertus",
            "apertus1p5_text",
            "arcee",
            "aria_text",
            "biogpt",
            "bitnet",
            "bloom",
            "codegen",
            "cohere",
            "cohere_compass_text",
            "ctrl",
            "dbrx",
            "diffllama",
            "doge",
            "dots1",
            "ernie4_5",
            "ernie4_5_moe",
            "exaone",
            "falcon",
            "flex_olmo",
            "gemma",
            "glm",
            "glm4",
            "glm4_moe",
            "gpt-sw3",
            "gpt2",
            "gpt_bigcode",
            "gpt_neo",
            "gpt_neox",
            "gpt_neox_japanese",
            "gptj",
            "granite",
            "granitemoe",
            "granitemoeshared",
            "helium",
            "hrm_text",
            "hunyuan_v1_dense",
            "hunyuan_v1_moe",
            "hy_v3",
            "hyperclovax",
            "internlm3",
            "iquestcoder",
            "jais2",
            "jetmoe",
            "kolibri1",
            "laguna",
            "llama",
            "mellum",
            "minimax_m2",
            "minimax_m3_vl_text",
            "ministral",
            "ministral3",
            "mistral",
            "mixtral",
            "moshi",
            "nanochat",
            "nemotron",
            "olmo",
            "olmo2",
            "olmoe",
            "opt",
            "persimmon",
            "phi",
            "phi3",
            "phimoe",
            "qwen2",
            "qwen2_moe",
            "qwen3",
            "qwen3_moe",
            "sarvam_moe",
            "seed_oss",
            "smollm3",
            "solar_open",
            "stablelm",
            "starcoder2",
            "xglm",
        ],
        "mha",
    ),
    **dict.fromkeys(
        [
            "afmoe",
            "beam",
            "cohere2",
            "cohere2_moe",
            "cwm",
            "exaone4",
            "exaone_moe",
            "flint",
            "gemma2",
            "gemma3_text",
            "gemma3n_text",
            "gemma4_text",
            "gpt_oss",
            "granite_swa",
            "granitemoe_swa",
            "llama4_text",
            "modernbert-decoder",
            "olmo3",
            "vaultgemma",
        ],
        "swa",
    ),
    **dict.fromkeys(
        [
            "axk1",
            "deepseek_v2",
            "deepseek_v3",
            "glm4_moe_lite",
            "longcat_flash",
            "minicpm3",
            "sarvam_mla",
            "youtu",
        ],
        "mla",
    ),
    **dict.fromkeys(
        [
            "bamba",
            "granitemoehybrid",
            "jamba",
            "lfm2",
            "lfm2_moe",
            "nemotron_h",
            "olmo_hybrid",
            "qwen3_5_moe_text",
            "qwen3_5_text",
            "qwen3_next",
        ],
        "mamba",
    ),
}

_HYBRID = r"layer 0 \('hybrid.*keeps both a linear-attention state and attention KV"
_HYBRID_SLIDING = r"layer 0 \('hybrid_sliding'.*LinearAttentionAndSlidingWindowAttentionLayer"
_DSA = r"layer 0 \('indexed_attention'.*DynamicIndexedLayer\) holds DSA indexer keys"
_NOTHING = r"wrote nothing into transformers' DynamicCache"
_OWN_CACHE = r"cannot run one token on transformers' DynamicCache"
_RECURRENT_ONLY = r"no pool kind serves a recurrent-only model"

#: id -> (architecture, config overrides, what ``for_model`` must say). Every message names
#: the layer, or says why the model as a whole has nothing a pool could hold.
REFUSALS: dict[str, tuple[str, dict[str, Any], str]] = {
    "falcon_h1": ("falcon_h1", {}, _HYBRID),
    "zamba2": ("zamba2", {}, r"layer 1 \('hybrid'.*LinearAttentionAndFullAttentionLayer"),
    "zaya": ("zaya", {}, _HYBRID),
    "inkling_text": ("inkling_text", {}, _HYBRID_SLIDING),
    "inkling2_text": ("inkling2_text", {}, _HYBRID_SLIDING),
    "inkling2_loop_text": ("inkling2_loop_text", {}, _HYBRID_SLIDING),
    "axk2": ("axk2", {}, _DSA),
    "deepseek_v32": ("deepseek_v32", {}, _DSA),
    "glm_moe_dsa": ("glm_moe_dsa", {}, _DSA),
    "dots3_note_text": ("dots3_note_text", {}, _DSA),
    "hy_v4": ("hy_v4", {}, _DSA),
    "deepseek_v4": ("deepseek_v4", {}, r"layer 0 .*DeepseekV4HCACache\) is a cache layer kind"),
    "recurrent_gemma": (
        "recurrent_gemma",
        {},
        r"layer 0 \('linear_attention'.*keeps that state outside transformers' cache",
    ),
    "lara_mini": ("lara_mini", {}, r"mixing Mamba / linear-attention state, full attention, "),
    "bailing_hybrid": ("bailing_hybrid", {}, r"mixing MLA latent, Mamba"),
    "kimi_linear": ("kimi_linear", {}, r"mixing MLA latent, Mamba"),
    "mimo_v2_flash": ("mimo_v2_flash", {}, r"window layers cache \(4, 16, 16\).*\(2, 16, 16\)"),
    "gemma4_text-wide-global-heads": (
        "gemma4_text",
        {"global_head_dim": 64},
        r"window layers cache \(2, 16, 16\) .* but full layers \(2, 64, 64\)",
    ),
    "mamba": ("mamba", {}, _RECURRENT_ONLY),
    "mamba2": ("mamba2", {}, _RECURRENT_ONLY),
    "falcon_mamba": ("falcon_mamba", {}, _RECURRENT_ONLY),
    "rwkv": ("rwkv", {}, _NOTHING),
    "reformer": ("reformer", {}, _NOTHING),
    "openai-gpt": ("openai-gpt", {}, _NOTHING),
    "minimax": ("minimax", {}, _OWN_CACHE),
    "xlstm": ("xlstm", {}, _OWN_CACHE),
}


def _reference(model: Any) -> Any:
    return generate(model, DynamicCache(config=model.config), 2, new_tokens=NEW_TOKENS)


@pytest.mark.parametrize("arch", sorted(RUNS))
def test_identical_to_dynamic_cache_through_a_retraction(arch: str) -> None:
    model = tiny_model(arch)
    want = _reference(model)
    cache = KVPoolCache.for_model(model, size=256)
    retractor = Retractor(cache, frozenset({4}), row=1)
    got = generate(model, cache, 2, processors=[retractor], new_tokens=NEW_TOKENS)
    assert cache.pool_name == RUNS[arch]
    assert cache.retractions == 1 and retractor.moved == [True]
    assert torch.equal(got.sequences, want.sequences)
    assert identical(got, want)


@pytest.mark.parametrize("case", sorted(REFUSALS))
def test_unserved_architectures_are_refused_by_for_model(case: str) -> None:
    arch, overrides, message = REFUSALS[case]
    model = tiny_model(arch, **overrides)
    with pytest.raises(UnsupportedLayerError, match=message) as refused:
        KVPoolCache.for_model(model, size=256)
    assert isinstance(refused.value, KVCacheError)


@pytest.mark.parametrize("arch", ["mistral", "ministral"])
def test_sliding_only_architectures_are_the_ones_on_an_mha_pool(arch: str) -> None:
    """What the guide says of mistral and ministral: every layer sliding, served by ``mha``."""
    layout = probe_layout(tiny_model(arch))
    assert layout.kinds == {LayerKind.SLIDING} and RUNS[arch] == "mha"


def _guide() -> str:
    return GUIDE.read_text(encoding="utf-8")


def test_the_guide_lists_exactly_the_architectures_run_and_their_pools() -> None:
    listed = _guide().split("<!-- architectures:start -->")[1].split("<!-- architectures:end -->")
    documented: dict[str, str] = {}
    for entry in listed[0].split("\n- ")[1:]:
        pool, names = entry.split(":", 1)
        for name in re.sub(r"\([^)]*\)", "", names).replace("\n", " ").split(","):
            documented[name.strip()] = pool.strip("` -\n")
    assert documented == RUNS


def test_the_guide_names_every_refused_architecture() -> None:
    text = " ".join(_guide().split("These are refused by `for_model`")[1].split("\n\n")[0].split())
    refused = {arch for arch, _, _ in REFUSALS.values()} - set(RUNS)
    named = set(re.findall(r"[a-z][a-z0-9_-]*[a-z0-9]", text))
    assert refused <= named


def test_a_layer_that_caches_nothing_keeps_its_place_and_its_buffers_stay_unused() -> None:
    """nemotron_h's MLP/MoE-only layers: transformers' placeholder in the cache, their pool
    buffers (kept, since pools index layers globally) never written by a generation."""
    model = tiny_model("nemotron_h")
    cache = KVPoolCache.for_model(model, size=256)
    idle = cache.layout.of_kind(LayerKind.NONE)
    assert idle and all(type(cache.layers[p.index]) is DummyLayer for p in idle)
    before = [t.clone() for p in idle for t in cache.pool.get_kv_buffer(p.index)]
    generate(model, cache, 2, new_tokens=NEW_TOKENS)
    after = [t for p in idle for t in cache.pool.get_kv_buffer(p.index)]
    assert all(torch.equal(a, b) for a, b in zip(before, after, strict=True))


@pytest.mark.parametrize("arch", ["lfm2", "bamba"])
def test_a_pool_that_drops_the_state_is_caught(arch: str) -> None:
    """The negative control: a pool whose offload drops the Mamba state gives other logits,
    for short-convolution layers (lfm2: a conv state only) as for Mamba ones."""
    model = tiny_model(arch)
    want = _reference(model)
    broken = discover(plugins=[hf_broken_pools], allow=[])
    cache = KVPoolCache.for_model(model, "mamba-drops-state", size=256, registry=broken)
    retractor = Retractor(cache, frozenset({4}), row=1)
    got = generate(model, cache, 2, processors=[retractor], new_tokens=NEW_TOKENS)
    assert cache.retractions == 1 and not identical(got, want)


def test_a_conv_only_layer_gets_a_placeholder_recurrent_state_never_written() -> None:
    """lfm2's short convolutions keep a conv state only: the pool's required temporal state is
    one element per request, and stays zero through generation and a retraction."""
    model = tiny_model("lfm2")
    cache = KVPoolCache.for_model(model, size=256)
    conv_layers = cache.layout.of_kind(LayerKind.MAMBA)
    assert conv_layers and all(p.state_shape == () and p.conv_shape for p in conv_layers)
    retractor = Retractor(cache, frozenset({4}), row=1)
    generate(model, cache, 2, processors=[retractor], new_tokens=NEW_TOKENS)
    cache.flush_state()
    live = cache.rows.request_slots  # (the retractor poisoned the free ones)
    assert live is not None
    for plan in conv_layers:
        (conv,), temporal = cache.pool.get_mamba_state(plan.index)
        assert temporal.shape[1:] == (1,) and not temporal[live].any()
        assert conv[live].any()  # the conv state itself did reach the pool


#: Architectures transformers' own DynamicCache cannot generate with (at these sizes): nothing
#: to compare against. The test proves that before it skips.
DYNAMIC_CACHE_FAILS = {"dory": "a looped model: its attention mask and cache disagree in length"}


@pytest.mark.parametrize(
    "arch",
    [pytest.param(a, id=f"{a}-skipped-DynamicCache-fails") for a in sorted(DYNAMIC_CACHE_FAILS)],
)
def test_architectures_dynamic_cache_cannot_run_are_skipped_only_if_it_fails(arch: str) -> None:
    model = tiny_model(arch)
    with pytest.raises(RuntimeError, match="must match the size"):
        _reference(model)
    pytest.skip(f"{arch}: transformers' DynamicCache fails too ({DYNAMIC_CACHE_FAILS[arch]})")
