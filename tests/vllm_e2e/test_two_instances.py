"""Instance A saves, instance B (a new process) loads, through a ``dir:`` store; then the
negative controls on a spoiled copy of that store, and portability to an ``mha`` pool.

Prompts (block size 32, one token per word): P1 300 tokens (9 whole blocks and 12 more), P2
the first 5 blocks of P1 and 100 other tokens, P3 200 tokens, P4 250 tokens. A (model m1)
saves P1 and P3; A2 (model m2, same geometry) saves P4 into the same store.
"""

from __future__ import annotations

import shutil
from typing import Any

import pytest
import torch

from kvcache_core import KVSnapshot, PoolConfig, discover
from kvcache_core.integrations._vllm_keys import BlockKeys
from kvcache_core.integrations._vllm_models import prompt_words
from kvcache_core.stores import open_store

from .conftest import connector, run_instance

BS = 32
P1 = prompt_words(300, seed=11)
P2 = " ".join(P1.split()[: 5 * BS] + prompt_words(100, seed=12).split())
P3 = prompt_words(200, seed=13)
P4 = prompt_words(250, seed=14)
PROMPTS = [P1, P2, P3, P4]


def token_ids(prompt: str) -> list[int]:
    """The tiny tokenizer's ids: word ``w<i>`` is token ``i``, nothing added."""
    return [int(word[1:]) for word in prompt.split()]


def spec(model: str, prompts: list[str], conn: dict[str, Any] | None, **kw: Any) -> dict[str, Any]:
    return {
        "model": model,
        "prompts": prompts,
        "max_tokens": 12,
        "block_size": BS,
        "measure_ttft": False,
        "reset_prefix_cache": True,
        "connector": conn,
        **kw,
    }


@pytest.fixture(scope="module")
def scenario(models: dict[str, str], tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    work = tmp_path_factory.mktemp("dir-scenario")
    store = f"dir:{work / 'store'}"
    base = run_instance(spec(models["m1"], PROMPTS, None))
    a = run_instance(spec(models["m1"], [P1, P3], connector("kv_producer", store, work / "a")))
    a2 = run_instance(spec(models["m2"], [P4], connector("kv_producer", store, work / "a2")))
    snapshot = work / "before-b"
    shutil.copytree(work / "store", snapshot)
    b = run_instance(
        spec(models["m1"], [P1, P2, P4], connector("kv_consumer", store, work / "b", by_name=True))
    )
    return {
        "work": work,
        "store": store,
        "pristine": snapshot,
        "base": base,
        "a": a,
        "a2": a2,
        "b": b,
    }


def test_a_producer_serves_the_tokens_of_a_run_without_connector(scenario):
    base, a = scenario["base"], scenario["a"]
    assert a.tokens == [base.tokens[0], base.tokens[2]]
    assert a.side("worker")["saved_blocks"] == 300 // BS + 200 // BS
    assert a.side("worker")["save_errors"] == 0


def test_b_loads_the_stored_prefix_and_computes_only_the_tail(scenario):
    base, b = scenario["base"], scenario["b"]
    assert b.tokens == [base.tokens[0], base.tokens[1], base.tokens[3]]
    # P1: 9 whole blocks stored; the 12 tokens after them are computed
    assert (b.loaded(0), b.computed(0)) == (9 * BS, 300 - 9 * BS)
    # P2 shares P1's first 5 blocks only
    assert (b.loaded(1), b.computed(1)) == (5 * BS, len(P2.split()) - 5 * BS)
    # P4 was stored by another model (m2): not matched, all computed
    assert (b.loaded(2), b.computed(2)) == (0, 250)
    assert b.side("worker")["loaded_blocks"] == 14 and b.side("worker")["load_errors"] == 0
    assert b.side("worker")["saved_blocks"] == 0  # a consumer saves nothing


def _keys(scenario: dict[str, Any], prompt: str) -> list[str]:
    """The prompt's keys under m1's fingerprint (A's connector reports it)."""
    fingerprint = scenario["a"].side("worker")["fingerprint"]
    return BlockKeys(fingerprint, BS).keys(token_ids(prompt))


def test_spoiled_blocks_are_refused_and_a_valid_forgery_changes_the_tokens(scenario, models):
    """Negative controls on a copy of the store as A left it: P1's third block overwritten
    with noise (the checksum catches it: identical tokens, a warning naming the key), and
    every block of P3 replaced by noise sealed with a valid checksum (what a loader without
    the checksum would accept): the tokens must change, so B really uses what it loads."""
    work = scenario["work"]
    spoiled = work / "spoiled"
    shutil.copytree(scenario["pristine"], spoiled)
    store = open_store(f"dir:{spoiled}")
    p1_keys, p3_keys = _keys(scenario, P1), _keys(scenario, P3)
    assert store.exists(p1_keys[0]), "the keys computed here are not the keys A stored"
    blob = bytearray(store.get(p1_keys[2]))
    gen = torch.Generator().manual_seed(0)
    blob[-len(blob) // 2 :] = bytes(
        torch.randint(0, 256, (len(blob) // 2,), generator=gen).tolist()
    )
    store.put(p1_keys[2], bytes(blob))
    for key in p3_keys:
        snap = KVSnapshot.from_bytes(store.get(key))
        noise = {k: torch.randn(v.shape, generator=gen).to(v.dtype) for k, v in snap.parts.items()}
        forged = KVSnapshot(snap.pool_kind, snap.dtype, snap.token_count, noise, meta=snap.meta)
        store.put(key, forged.to_bytes())
    store.close()
    b = run_instance(
        spec(models["m1"], [P1, P3], connector("kv_consumer", f"dir:{spoiled}", work / "bs"))
    )
    base = scenario["base"]
    assert b.tokens[0] == base.tokens[0], "a block the checksum refused changed the output"
    assert p1_keys[2] in b.stderr and "checksum mismatch" in b.stderr
    assert b.side("worker")["load_errors"] >= 1
    assert b.tokens[1] != base.tokens[2], "forged KV was loaded but did not change the output"
    assert p3_keys[0] not in b.stderr  # the forgery passed every check: it was used


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("block_size", [32, 128])
def test_vllm_writes_the_layout_the_pool_reads(dtype, block_size, monkeypatch):
    """vLLM's own cache kernel writes K transposed per block and head, then V: the check the
    connector runs at start-up passes, and catches a pool that reads K and V swapped."""
    from kvcache_core.integrations._vllm_connector import layout_problem
    from kvcache_core.integrations.vllm import VLLMBlockPool

    pool = VLLMBlockPool([torch.zeros(4, 2, block_size, 128, dtype=dtype)])
    assert layout_problem(pool) is None
    honest = VLLMBlockPool.get_cpu_copy

    def swapped(self: VLLMBlockPool, indices: torch.Tensor, mamba_indices: Any = None) -> Any:
        snap = honest(self, indices)
        parts = {"k": snap.parts["v"], "v": snap.parts["k"]}
        return KVSnapshot(snap.pool_kind, snap.dtype, snap.token_count, parts, meta=snap.meta)

    monkeypatch.setattr(VLLMBlockPool, "get_cpu_copy", swapped)
    assert "another KV layout" in str(layout_problem(pool))


def test_a_block_saved_by_vllm_loads_into_an_mha_pool_and_matches_transformers(scenario, models):
    """P1's 9 stored blocks, loaded into kvcache's own mha pool, hold what transformers'
    own ``past_key_values`` holds for the same 288 tokens and weights (fp32)."""
    from transformers import LlamaForCausalLM

    store = open_store(scenario["store"])
    keys = _keys(scenario, P1)
    snaps = [KVSnapshot.from_bytes(store.get(key)) for key in keys]
    store.close()
    first = snaps[0]
    layers, _, heads, dim = first.parts["k"].shape
    pool, allocator = discover(strict=True).create(
        "mha",
        PoolConfig(size=16 * BS, layer_num=layers, head_num=heads, head_dim=dim, page_size=BS,
                   dtype=torch.float32),
    )  # fmt: skip
    slots = [allocator.alloc(BS) for _ in snaps]
    for snap, where in zip(snaps, slots, strict=True):
        allocator.load_cpu_copy(snap, where, mamba_indices=None)
    model = LlamaForCausalLM.from_pretrained(models["m1"], torch_dtype=torch.float32).eval()
    ids = torch.tensor([token_ids(P1)[: 9 * BS]])
    with torch.no_grad():
        cache = model(ids, use_cache=True).past_key_values
    every = torch.cat(slots)
    worst = 0.0
    for layer in range(layers):
        k_ref = cache.layers[layer].keys[0].transpose(0, 1)  # [tokens, heads, dim]
        v_ref = cache.layers[layer].values[0].transpose(0, 1)
        k_got, v_got = pool.get_key_buffer(layer)[every], pool.get_value_buffer(layer)[every]
        worst = max(worst, float((k_got - k_ref).abs().max()), float((v_got - v_ref).abs().max()))
    print(f"largest |vLLM KV - transformers KV| over {layers} layers, 288 tokens: {worst:.2e}")
    assert worst < 1e-4  # fp32 rounding of two different kernels; measured ~1e-6


def test_a_three_node_redis_cluster_carries_the_blocks(scenario, models):
    from kvcache_core.stores.local_redis import LocalRedisCluster

    work = scenario["work"]
    with LocalRedisCluster(masters=3, timeout=10.0) as cluster:
        a = run_instance(
            spec(models["m1"], [P1], connector("kv_producer", cluster.url, work / "ca"))
        )
        b = run_instance(
            spec(models["m1"], [P1], connector("kv_consumer", cluster.url, work / "cb"))
        )
        held = [cluster.node_client(i).dbsize() for i in range(3)]
    base = scenario["base"]
    assert a.tokens == b.tokens == [base.tokens[0]]
    assert (b.loaded(0), b.computed(0)) == (9 * BS, 300 - 9 * BS)
    # 9 keys over 3 nodes' hash slots: all on one node would be a 1-in-6,500 chance
    assert sum(held) == 9 and sum(1 for n in held if n) >= 2, f"blocks per node: {held}"


def test_a_store_that_is_not_there_never_stops_serving(scenario, models):
    import socket

    with socket.socket() as s:  # a free port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    url = f"redis://127.0.0.1:{port}/0?timeout=0.5&connect_timeout=0.5"
    b = run_instance(
        spec(models["m1"], [P1, P3], connector("kv_both", url, scenario["work"] / "down"))
    )
    base = scenario["base"]
    assert b.tokens == [base.tokens[0], base.tokens[2]]
    assert (b.loaded(0), b.computed(0)) == (0, 300)
    assert "failed during" in b.stderr
