"""transformers' continuous batching on kvcache pool pages, against sequential ``generate``.

Every run is under block pressure (a few blocks for five requests), with transformers' own
arena filled with NaN and the pool rows of every freed slot filled with NaN, so tokens that
match the DynamicCache reference mean the keys and values really came from the pool and
really came back through ``load_cpu_copy``.
"""

from __future__ import annotations

import dataclasses
import gc
import re
import subprocess
import sys
import threading
from pathlib import Path

import pytest
import torch
from transformers.generation.continuous_batching import continuous_api
from transformers.generation.continuous_batching.cache import PagedAttentionCache

from kvcache_core import Capability, KVCacheError, UnknownPoolError, UnsupportedDtypeError
from kvcache_core.discovery import discover
from kvcache_core.integrations import _batching_cache, _hf_pool_choice
from kvcache_core.integrations._batching_cache import BatchingStats
from kvcache_core.integrations.transformers_batching import (
    BatchOutputs,
    generate_batch,
    kvpool_paged_cache,
)
from kvcache_plugins import mha

from ._batching_helpers import PROMPTS, greedy, llama, poisoned_kvpool, qwen2_sliding, sequential

NEW = 14


@pytest.fixture(scope="module", autouse=True)
def _quiet_machine():
    """One torch thread (the runs are tiny: on a shared machine, more threads only contend)
    and the objects alive before the runs frozen out of the collector: transformers' manager
    calls ``gc.collect()`` twice per run, which otherwise walks every object of the session."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    gc.freeze()
    yield
    gc.unfreeze()
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def llama_model():
    return llama()


@pytest.fixture(scope="module")
def qwen_model():
    return qwen2_sliding()


def _tokens(out: BatchOutputs) -> list[list[int]]:
    return [list(r.generated_tokens) for r in out.values()]


def test_llama_under_block_pressure_matches_sequential_generate(llama_model, monkeypatch):
    expected = sequential(llama_model, PROMPTS, NEW)
    with poisoned_kvpool(monkeypatch) as spy:
        out = generate_batch(
            llama_model, PROMPTS, greedy(NEW), num_blocks=8, block_size=4, max_batch_tokens=32
        )
    assert _tokens(out) == expected
    stats = out.stats
    assert stats.pool == "mha"
    # Block pressure really moved requests out and back, through the allocator each time.
    assert stats.offloads >= 2
    assert spy.get_cpu_copy == stats.offloads
    assert spy.load_cpu_copy == stats.restores == stats.offloads
    assert stats.offloaded_bytes > 0 and stats.offloaded_tokens > 0
    # The one cache built was pool-backed, and the name swap was put back.
    assert len(spy.caches) == 1
    assert continuous_api.PagedAttentionCache is PagedAttentionCache
    # Every page went back to the allocator at the end.
    alloc = spy.caches[0].kv_allocator
    assert alloc.available_size() == alloc.size


def test_qwen2_sliding_layers_under_block_pressure_match(qwen_model, monkeypatch):
    expected = sequential(qwen_model, PROMPTS, NEW)
    with poisoned_kvpool(monkeypatch) as spy:
        out = generate_batch(
            qwen_model, PROMPTS, greedy(NEW), num_blocks=10, block_size=4, max_batch_tokens=32
        )
    assert _tokens(out) == expected
    assert out.stats.pool == "swa"
    assert out.stats.offloads >= 2
    assert spy.get_cpu_copy == out.stats.offloads == spy.load_cpu_copy == out.stats.restores
    cache = spy.caches[0]
    assert cache._window_layers == {1, 3}
    assert cache.kv_allocator.swa_available_size() == cache.kv_allocator.swa_size


def test_eager_attention_reads_the_pool_too(monkeypatch):
    # transformers runs an eager model as "paged|eager": the same cache calls, another kernel.
    model = qwen2_sliding()
    model.set_attn_implementation("eager")
    expected = sequential(model, PROMPTS, 10)
    with poisoned_kvpool(monkeypatch) as spy:
        out = generate_batch(model, PROMPTS, greedy(10), num_blocks=8, block_size=4)
    assert _tokens(out) == expected
    assert spy.load_cpu_copy == out.stats.restores >= 1
    assert model.config._attn_implementation == "eager"  # switched back after the run


def test_empty_inputs_build_nothing(llama_model):
    out = generate_batch(llama_model, [], greedy(2), num_blocks=4)
    assert out == {} and out.stats.pool == ""
    with pytest.raises(ValueError, match="num_blocks must be a positive int"):
        generate_batch(llama_model, [], greedy(2), num_blocks=-1)


def test_window_slots_leave_with_the_window(qwen_model, monkeypatch):
    # A 9-token prompt and 14 new tokens under a 5-token window: the pages the window slid
    # past give their window slots back while the request still runs.
    released = []
    window_held = []
    original = _batching_cache.KVPoolPagedCache._release_window

    def release_window(self, req, past_length):
        before = req.window_released
        original(self, req, past_length)
        released.append(req.window_released - before)
        # The window side holds exactly the pages not released yet (one request runs).
        alloc = self.kv_allocator
        held = alloc.swa_size - alloc.swa_available_size()
        window_held.append((held, len(req.slots) - req.window_released * self.page))

    monkeypatch.setattr(_batching_cache.KVPoolPagedCache, "_release_window", release_window)
    with poisoned_kvpool(monkeypatch):
        out = generate_batch(qwen_model, PROMPTS[:1], greedy(NEW), num_blocks=16, block_size=4)
    assert _tokens(out) == sequential(qwen_model, PROMPTS[:1], NEW)
    # Tokens 0..17 left a 5-token window before the last step at 22: pages 0..3 went back.
    assert sum(released) == 4
    assert window_held and all(held == expected for held, expected in window_held), window_held


def test_restore_without_load_cpu_copy_is_caught(llama_model, monkeypatch):
    # Negative control: the same run with a load that writes nothing must go wrong, so the
    # run above passing means the restored rows were really loaded.
    expected = sequential(llama_model, PROMPTS, NEW)
    with poisoned_kvpool(monkeypatch, load=lambda *a, **k: None) as spy:
        out = generate_batch(
            llama_model, PROMPTS, greedy(NEW), num_blocks=8, block_size=4, max_batch_tokens=32
        )
    assert spy.load_cpu_copy >= 1
    assert _tokens(out) != expected


def test_a_read_of_transformers_arena_shows(llama_model, monkeypatch):
    # Negative control for the poison: the same run, but keys read back from transformers'
    # (poisoned, never written) arena instead of the pool, must go wrong.
    original = _batching_cache.KVPoolPagedCache.update

    def update(self, key_states, value_states, layer_idx, kwargs):
        allocator = self.layer_to_allocator[layer_idx]
        read = kwargs["read_index"][allocator.index]
        keys, values = original(self, key_states, value_states, layer_idx, kwargs)
        if read.numel():
            arena_keys = allocator._kv_token_views[layer_idx][0]
            keys = arena_keys.index_select(0, read).transpose(0, 1).unsqueeze(0)
        return keys, values

    monkeypatch.setattr(_batching_cache.KVPoolPagedCache, "update", update)
    with poisoned_kvpool(monkeypatch):
        out = generate_batch(llama_model, PROMPTS[:2], greedy(6), num_blocks=16, block_size=4)
    assert _tokens(out) != sequential(llama_model, PROMPTS[:2], 6)


def test_cache_swap_is_scoped_to_its_thread_and_undone_on_error(monkeypatch):
    choice = _hf_pool_choice.choose_batching_pool(
        {"full_attention": (0, 1)}, None, discover(), block_size=4
    )
    built = []

    def record(self, **kwargs):
        built.append(threading.get_ident())
        raise LookupError("pool-backed cache built")

    monkeypatch.setattr(_batching_cache.KVPoolPagedCache, "__init__", record)
    errors = {}
    with pytest.raises(RuntimeError, match="boom"), kvpool_paged_cache(choice, BatchingStats()):
        swapped = continuous_api.PagedAttentionCache
        assert swapped is not PagedAttentionCache
        with pytest.raises(LookupError):
            swapped(config=None)

        def other():  # another thread calling the swapped name gets transformers' class
            try:
                swapped(config=None)
            except Exception as exc:
                errors["other"] = exc

        thread = threading.Thread(target=other)
        thread.start()
        thread.join()
        raise RuntimeError("boom")
    assert continuous_api.PagedAttentionCache is PagedAttentionCache
    assert built == [threading.get_ident()]
    assert not isinstance(errors["other"], LookupError)


# -- bad input: each refused before a thread starts ---------------------------------------------


@pytest.mark.parametrize(
    ("inputs", "error", "match"),
    [
        (torch.tensor([[1, 2]]), TypeError, "list of token-id lists"),
        ([[1, 2], []], ValueError, r"inputs\[1\] must be a non-empty"),
        ([[1, 2.5]], ValueError, r"inputs\[0\] holds"),
        ([[1, -3]], ValueError, r"inputs\[0\] holds"),
        (["ab"], ValueError, r"inputs\[0\] must be"),
    ],
)
def test_bad_inputs_are_refused(llama_model, inputs, error, match):
    with pytest.raises(error, match=match):
        generate_batch(llama_model, inputs, greedy(2), num_blocks=4, block_size=4)


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        ({"num_blocks": 0}, ValueError, "num_blocks must be a positive int"),
        ({"block_size": True}, ValueError, "block_size must be a positive int"),
        ({"pool": "nope"}, UnknownPoolError, "no accepted pool named 'nope'"),
        ({"pool": "mla"}, KVCacheError, "'mla' declares mla"),
        ({"pool": "mamba"}, KVCacheError, "'mamba' declares mamba-state"),
        ({"max_new_tokens": 0}, ValueError, "max_new_tokens must be a positive int"),
    ],
)
def test_bad_settings_are_refused(llama_model, kwargs, error, match):
    args = {"num_blocks": 4, "block_size": 4, **kwargs}
    with pytest.raises(error, match=match):
        generate_batch(llama_model, [[1, 2]], greedy(2), **args)
    assert continuous_api.PagedAttentionCache is PagedAttentionCache


def test_forks_are_refused(llama_model):
    config = greedy(2)
    config.num_return_sequences = 2
    config.do_sample = True
    with pytest.raises(KVCacheError, match="num_return_sequences > 1"):
        generate_batch(llama_model, [[1, 2]], config, num_blocks=4, block_size=4)


def _registry_with(**changes):
    registry = discover()
    accepted = registry.accepted["mha"]
    spec = dataclasses.replace(accepted.spec, name="custom", **changes)
    registry.accepted["custom"] = dataclasses.replace(accepted, spec=spec)
    return registry


def test_pool_without_offload_is_refused(llama_model):
    registry = _registry_with(capabilities=frozenset({Capability.PAGED}))
    with pytest.raises(KVCacheError, match="'custom' lacks the capability offload"):
        generate_batch(
            llama_model,
            [[1]],
            greedy(2),
            num_blocks=4,
            block_size=4,
            pool="custom",
            registry=registry,
        )


def test_pool_storing_another_dtype_is_refused(llama_model):
    def half(config):
        return mha.create(dataclasses.replace(config, dtype=torch.float16))

    registry = _registry_with(factory=half)
    with pytest.raises(UnsupportedDtypeError, match=r"stores torch.float16.*torch.float32"):
        generate_batch(
            llama_model,
            [[1]],
            greedy(2),
            num_blocks=4,
            block_size=4,
            pool="custom",
            registry=registry,
        )


@pytest.mark.parametrize("head_major", [True, False], ids=["head-major", "row-major"])
def test_both_pool_layouts_read_the_same_under_pressure(llama_model, monkeypatch, head_major):
    """The cache asks for a head-major pool (each step gathers per head); a pool that keeps
    rows in row-major order (a third-party one ignoring the option) is read through the other
    gather. Both give sequential generation's tokens through offloads."""

    def layout(config):
        return mha.create(dataclasses.replace(config, options={"head_major": head_major}))

    registry = _registry_with(factory=layout)
    expected = sequential(llama_model, PROMPTS, NEW)
    with poisoned_kvpool(monkeypatch) as spy:
        out = generate_batch(
            llama_model,
            PROMPTS,
            greedy(NEW),
            num_blocks=8,
            block_size=4,
            max_batch_tokens=32,
            pool="custom",
            registry=registry,
        )
    assert _tokens(out) == expected and out.stats.offloads >= 2
    assert spy.caches[0].kv_pool.head_major is head_major


def test_the_default_pool_is_built_head_major(llama_model, monkeypatch):
    with poisoned_kvpool(monkeypatch) as spy:
        generate_batch(llama_model, [[1, 2, 3]], greedy(2), num_blocks=4, block_size=4)
    assert spy.caches[0].kv_pool.head_major


def test_layer_types_no_pool_serves_are_named():
    with pytest.raises(KVCacheError, match="layer 1 has type 'linear_attention'"):
        _hf_pool_choice.layer_groups(["full_attention", "linear_attention"], 2, None)
    with pytest.raises(KVCacheError, match="every layer of this model is a sliding-window"):
        _hf_pool_choice.choose_batching_pool(
            {"sliding_attention": (0, 1)}, None, discover(), block_size=4
        )


def test_default_pool_follows_layer_types_and_capabilities():
    registry = discover()
    full = _hf_pool_choice.choose_batching_pool(
        {"full_attention": (0, 1)}, None, registry, block_size=4
    )
    mixed = _hf_pool_choice.choose_batching_pool(
        {"full_attention": (0,), "sliding_attention": (1,)}, None, registry, block_size=4
    )
    assert (full.name, full.windowed) == ("mha", False)
    assert (mixed.name, mixed.windowed) == ("swa", True)
    # Named explicitly, an MHA-kind pool serves sliding layers too (without window slots).
    named = _hf_pool_choice.choose_batching_pool(
        {"full_attention": (0,), "sliding_attention": (1,)}, "mha", registry, block_size=4
    )
    assert not named.windowed


# -- the docs page's promises -------------------------------------------------------------------

DOCS = Path(__file__).resolve().parents[2] / "docs" / "integrations" / "continuous-batching.md"


def test_docs_example_runs_and_offloads(capsys):
    text = DOCS.read_text(encoding="utf-8")
    example = re.search(r"```python\n(.*?)```", text, re.S)
    assert example is not None
    exec(compile(example.group(1), str(DOCS), "exec"), {"__name__": "docs_example"})
    printed = capsys.readouterr().out
    match = re.search(r"pool='mha', pages=\d+, offloads=(\d+), restores=(\d+)", printed)
    assert match is not None, printed
    assert int(match.group(1)) > 0 and match.group(1) == match.group(2)


def test_kvcache_core_does_not_import_transformers():
    code = (
        "import sys, kvcache_core, kvcache_core.integrations; "
        "assert 'transformers' not in sys.modules, 'transformers imported'"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr


@pytest.mark.parametrize(
    ("ours", "base_module", "base_name"),
    [
        ("KVPoolPagedCache", "cache", "PagedAttentionCache"),
        ("KVPoolOffloading", "offloading_manager", "OffloadingManager"),
    ],
)
def test_every_override_still_exists_in_transformers(ours, base_module, base_name):
    # A transformers release that renames or reshapes a method this integration overrides
    # would leave the override dead (transformers' own storage used again): caught here first.
    import importlib
    import inspect

    from kvcache_core.integrations import _batching_offload

    cls = getattr(_batching_cache, ours, None) or getattr(_batching_offload, ours)
    base = getattr(
        importlib.import_module(f"transformers.generation.continuous_batching.{base_module}"),
        base_name,
    )
    overridden = [
        name
        for name, member in vars(cls).items()
        if callable(member) and name != "__init__" and hasattr(base, name)
    ]
    assert overridden, ours
    own = {n for n, m in vars(cls).items() if callable(m) and not n.startswith("__")}
    helpers = {n for n in own if not hasattr(base, n)}
    assert helpers <= {
        "_buffers_by_head",
        "_slot_tensor",
        "_grow",
        "_release_window",
        "_release",
        "capturing",
        "restore",
    }, helpers
    for name in overridden:
        theirs = list(inspect.signature(getattr(base, name)).parameters)
        mine = list(inspect.signature(getattr(cls, name)).parameters)
        assert mine == theirs or mine[-2:] == ["args", "kwargs"], (name, mine, theirs)
