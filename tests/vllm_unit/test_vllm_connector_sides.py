"""The connector's scheduler and worker halves with a fake scheduler and worker (no vLLM).

Instance A computes (random KV written into its blocks), plans a step and saves; instance B,
with other block ids, matches the stored prefix, loads it and must hold A's bits. Then every
way a stored block can be unusable, and a store that fails, each caught by its own test.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Sequence

import pytest
import torch

from kvcache_core import KVSnapshot, StoreUnavailableError
from kvcache_core.integrations._vllm_keys import BlockKeys, fingerprint_of
from kvcache_core.integrations._vllm_plan import BlockTransfer, StepPlan
from kvcache_core.integrations._vllm_sides import (
    ScheduledRequest,
    SchedulerSide,
    StoreLink,
    WorkerSide,
)
from kvcache_core.integrations.vllm import VLLMBlockPool
from kvcache_core.stores import open_store

BS, HEADS, D, LAYERS, BLOCKS = 32, 2, 8, 2, 12
FP = fingerprint_of({"model": "tiny", "dtype": "float32", "block_size": BS})


def new_pool(seed: int | None = None) -> VLLMBlockPool:
    g = torch.Generator().manual_seed(seed or 0)
    make = (
        (lambda: torch.randn(BLOCKS, HEADS, BS, 2 * D, generator=g))
        if seed is not None
        else (lambda: torch.zeros(BLOCKS, HEADS, BS, 2 * D))
    )
    return VLLMBlockPool([make() for _ in range(LAYERS)])


class Instance:
    """One engine: its scheduler half, its worker half, one pool, one store link."""

    def __init__(
        self,
        store: object,
        *,
        load: bool,
        save: bool,
        seed: int | None = None,
        fingerprint: str = FP,
    ) -> None:
        self.link = StoreLink("memory:", lambda url: store, retry_after=60.0)  # type: ignore[arg-type, return-value]
        self.scheduler = SchedulerSide(self.link, fingerprint, BS, load=load, save=save)
        self.worker = WorkerSide(self.link, fingerprint, BS)
        self.pool = new_pool(seed)
        self.worker.register(self.pool)

    def step(self, scheduled: Sequence[ScheduledRequest]) -> StepPlan:
        plan = self.scheduler.plan_step(scheduled)
        self.worker.load(plan)
        self.worker.save(plan)
        self.worker.flush()  # the writes run on a thread: this engine's step is over
        return plan

    def prefill(self, rid: str, tokens: Sequence[int], blocks: Sequence[int]) -> int:
        """vLLM's admission: match, allocate, then one step computing the rest."""
        matched = self.scheduler.matched_tokens(rid, tokens, 0)
        self.scheduler.after_alloc(rid, blocks, matched)
        self.step([ScheduledRequest(rid, matched, len(tokens) - matched, blocks, tokens)])
        return matched


def tokens(n: int, seed: int = 0) -> list[int]:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, 1000, (n,), generator=g).tolist()


def block_bits(pool: VLLMBlockPool, block: int) -> list[torch.Tensor]:
    return [c[block].clone() for c in pool.caches]


@pytest.fixture
def store(request: pytest.FixtureRequest) -> object:
    """A store of this test's own (``memory:NAME`` stores live as long as the process)."""
    return open_store(f"memory:vllm-sides-{request.node.name}")


def test_keys_chain_over_whole_blocks_and_the_fingerprint():
    a = BlockKeys(FP, BS).keys(tokens(3 * BS + 5))
    assert len(a) == 3  # the partial fourth block has no key
    assert BlockKeys(FP, BS).keys(tokens(3 * BS + 5), 2) == a[:2]
    changed = tokens(3 * BS + 5)
    changed[BS + 1] += 1  # one token of block 1: its key and every later one change
    b = BlockKeys(FP, BS).keys(changed)
    assert b[0] == a[0] and b[1] != a[1] and b[2] != a[2]
    assert set(BlockKeys(fingerprint_of({"model": "other"}), BS).keys(tokens(3 * BS))).isdisjoint(a)
    assert BlockKeys(FP, 2 * BS).keys(tokens(2 * BS))[0] not in a


def test_fingerprint_ignores_key_order_and_sees_every_value():
    assert fingerprint_of({"a": 1, "b": 2}) == fingerprint_of({"b": 2, "a": 1})
    assert fingerprint_of({"a": 1, "b": 2}) != fingerprint_of({"a": 1, "b": 3})


def test_a_prefix_saved_by_a_loads_bit_for_bit_into_other_blocks_of_b(store):
    a = Instance(store, load=False, save=True, seed=1)
    prompt = tokens(4 * BS + 3)
    a.prefill("r", prompt, [1, 2, 3, 4, 5])
    b = Instance(store, load=True, save=False)
    matched = b.prefill("r", prompt, [7, 9, 8, 10, 11])
    assert matched == 4 * BS
    for src, dst in zip([1, 2, 3, 4], [7, 9, 8, 10], strict=True):
        for got, want in zip(block_bits(b.pool, dst), block_bits(a.pool, src), strict=True):
            assert torch.equal(got, want)
    assert not any(c[11].any() for c in b.pool.caches)  # the tail block is computed, not loaded
    assert b.worker.take_load_errors() == set()


@pytest.mark.parametrize(
    ("length", "local", "expected"),
    [
        (4 * BS + 3, 0, 4 * BS),  # every whole block
        (4 * BS, 0, 3 * BS),  # the last token is left to compute, so its block is too
        (4 * BS + 3, BS, 3 * BS),  # beyond a local hit of one block
        (4 * BS + 3, 4 * BS, 0),  # nothing beyond a full local hit
        (BS, 0, 0),
    ],
)
def test_the_match_counts_whole_stored_blocks_after_the_local_hit(store, length, local, expected):
    a = Instance(store, load=False, save=True, seed=1)
    a.prefill("r", tokens(5 * BS), [1, 2, 3, 4, 5, 6])
    b = Instance(store, load=True, save=False)
    assert b.scheduler.matched_tokens("q", tokens(5 * BS)[:length], local) == expected


def test_a_partly_shared_prompt_matches_only_the_shared_blocks(store):
    a = Instance(store, load=False, save=True, seed=1)
    a.prefill("r", tokens(4 * BS + 1), [1, 2, 3, 4, 5])
    other = tokens(4 * BS + 1)
    other[2 * BS + 5] += 1  # differs inside block 2
    b = Instance(store, load=True, save=False)
    assert b.prefill("q", other, [6, 7, 8, 9, 10]) == 2 * BS


def test_a_decoding_request_saves_each_block_once_as_it_fills(store):
    a = Instance(store, load=False, save=True, seed=1)
    prompt = tokens(2 * BS + 30)
    a.prefill("r", prompt, [1, 2, 3])
    saved = []
    for extra in range(1, 5):  # decode steps: the block fills at the second one
        plan = a.step(
            [
                ScheduledRequest(
                    "r", len(prompt) + extra - 1, 1, [1, 2, 3, 4], tokens(2 * BS + 30 + extra)
                )
            ]
        )
        saved.append([len(t.keys) for t in plan.saves])
    assert saved == [[], [1], [], []]


def test_a_consumer_saves_nothing_and_a_producer_loads_nothing(store):
    a = Instance(store, load=False, save=True, seed=1)
    a.prefill("r", tokens(3 * BS + 1), [1, 2, 3, 4])
    assert a.scheduler.matched_tokens("q", tokens(3 * BS + 1), 0) == 0
    b = Instance(store, load=True, save=False, seed=2)
    plan = b.scheduler.plan_step([ScheduledRequest("x", 0, 3 * BS, [5, 6, 7], tokens(3 * BS, 9))])
    assert plan.saves == ()


def _stored(store: object) -> tuple[list[str], list[int]]:
    """A stores 3 blocks; B's prompt is those 3 blocks, one more block and one token."""
    a = Instance(store, load=False, save=True, seed=1)
    prompt = tokens(4 * BS + 1)
    a.prefill("r", prompt[: 3 * BS + 1], [1, 2, 3, 4])
    return BlockKeys(FP, BS).keys(prompt), prompt


def _reseal(blob: bytes, **meta: object) -> bytes:
    snap = KVSnapshot.from_bytes(blob)
    noise = {k: torch.randn_like(v) for k, v in snap.parts.items()}
    return KVSnapshot(
        snap.pool_kind, snap.dtype, snap.token_count, noise, meta={**snap.meta, **meta}
    ).to_bytes()


def _corrupt(blob: bytes) -> bytes:
    data = bytearray(blob)
    data[-100:] = bytes(100)  # the payload's last bytes: the checksum no longer matches
    return bytes(data)


@pytest.mark.parametrize(
    ("spoil", "reason"),
    [
        (lambda store, key: store.delete(key), "missing from the store"),
        (lambda store, key: store.put(key, _corrupt(store.get(key))), "checksum mismatch"),
        (lambda store, key: store.put(key, store.get(key)[:-1000]), "unreadable"),
        (lambda store, key: store.put(key, b"\x00" * 64), "unreadable"),
        (
            lambda store, key: store.put(key, _reseal(store.get(key), vllm_fingerprint="x")),
            "foreign",
        ),
        (
            lambda store, key: store.put(key, _reseal(store.get(key), vllm_key="elsewhere")),
            "wrong key",
        ),
        (
            lambda store, key: store.put(key, _reseal(store.get(key), layer_num=LAYERS + 1)),
            "does not fit",
        ),
    ],
    ids=["missing", "corrupted", "truncated", "noise", "foreign", "misplaced", "misfit"],
)
def test_an_unusable_block_is_reported_with_every_block_after_it(store, caplog, spoil, reason):
    keys, prompt = _stored(store)
    b = Instance(store, load=True, save=True)
    matched = b.scheduler.matched_tokens("q", prompt, 0)
    spoil(store, keys[1])  # between the match and the load: the worker must still refuse
    assert matched == 3 * BS
    b.scheduler.after_alloc("q", [4, 5, 6, 7, 8], matched)
    before = [block_bits(b.pool, blk) for blk in (5, 6)]
    with caplog.at_level(logging.WARNING, logger="kvcache.vllm"):
        plan = b.step([ScheduledRequest("q", matched, BS + 1, [4, 5, 6, 7, 8], prompt)])
    assert b.worker.take_load_errors() == {5, 6}
    assert b.worker.take_load_errors() == set()  # reported once
    assert all(
        torch.equal(x, y)
        for blk, old in zip((5, 6), before, strict=True)
        for x, y in zip(block_bits(b.pool, blk), old, strict=True)
    ), "a refused block was written"
    message = " ".join(r.getMessage() for r in caplog.records)
    assert keys[1] in message and reason in message
    assert plan.saves and b.worker.stats.saved_blocks == 0  # its step ran on bad KV: no save


class DownStore:
    """A store whose backend is gone: every call times out."""

    calls = 0

    def __getattr__(self, name: str) -> object:
        def fail(*args: object, **kwargs: object) -> None:
            DownStore.calls += name != "close"
            raise StoreUnavailableError("redis://127.0.0.1:1/0 did not answer in 1.0 s")

        return fail


def test_a_store_that_goes_away_costs_a_warning_and_a_recompute_never_a_request(caplog):
    store = DownStore()
    b = Instance(store, load=True, save=True, seed=3)
    with caplog.at_level(logging.WARNING, logger="kvcache.vllm"):
        assert b.scheduler.matched_tokens("q", tokens(3 * BS + 1), 0) == 0
        plan = b.step([ScheduledRequest("q", 0, 3 * BS + 1, [1, 2, 3, 4], tokens(3 * BS + 1))])
        b.worker.load(StepPlan(loads=(BlockTransfer("q", ("k1",), (2,)),)))
        b.worker.flush()
    assert len(plan.saves) == 1 and b.worker.stats.save_errors == 3
    assert b.worker.take_load_errors() == {2}
    assert DownStore.calls == 1, "a down store is left alone until retry_after has passed"
    assert "did not answer" in caplog.text


def test_a_store_that_cannot_be_opened_is_the_same_as_an_empty_one(caplog):
    def opener(url: str) -> object:
        raise StoreUnavailableError(f"{url}: connection refused")

    link = StoreLink("redis://127.0.0.1:1/0", opener)  # type: ignore[arg-type]
    side = SchedulerSide(link, FP, BS, load=True, save=True)
    with caplog.at_level(logging.WARNING, logger="kvcache.vllm"):
        assert side.matched_tokens("q", tokens(2 * BS + 1), 0) == 0
    assert "connection refused" in caplog.text


def test_a_transfer_whose_keys_and_blocks_do_not_pair_is_refused():
    with pytest.raises(ValueError, match="2 keys for 1 blocks"):
        BlockTransfer("r", ("a", "b"), (1,))


class SlowStore:
    """A store whose ``put_many`` waits until the test lets it finish."""

    def __init__(self) -> None:
        self.release = threading.Event()
        self.values: dict[str, bytes] = {}

    def put_many(self, items: dict[str, bytes], *, ttl: float | None = None) -> None:
        assert self.release.wait(10)
        self.values.update(items)

    def close(self) -> None:
        pass


def test_saves_are_written_behind_the_step_and_flush_waits_for_them():
    store = SlowStore()
    a = Instance(store, load=False, save=True, seed=1)
    plan = a.scheduler.plan_step(
        [ScheduledRequest("r", 0, 2 * BS + 1, [1, 2, 3], tokens(2 * BS + 1))]
    )
    copied = [c[1].clone() for c in a.pool.caches]
    a.worker.save(plan)  # returns while the store still holds the write
    for c in a.pool.caches:
        c[1].fill_(7.0)  # vLLM reuses the block: the save must have taken its own copy
    assert store.values == {} and a.worker.stats.saved_blocks == 0
    store.release.set()
    a.worker.flush()
    assert a.worker.stats.saved_blocks == 2 and len(store.values) == 2
    first = KVSnapshot.from_bytes(store.values[plan.saves[0].keys[0]])
    want = VLLMBlockPool([c.unsqueeze(0).expand(2, *c.shape).clone() for c in copied])
    assert torch.equal(first.parts["k"], want.get_cpu_copy(torch.arange(BS, 2 * BS)).parts["k"])
