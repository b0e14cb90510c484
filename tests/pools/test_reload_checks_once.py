"""A reload checks each snapshot once: check, then a load that trusts what was checked.

Counted where every snapshot check ends, ``expect_snapshot`` as each pool module calls it:
through the SWA allocator (which checks, re-creates window slots, then loads), the hybrid
Mamba pool and a plain MHA pool, each snapshot (and child snapshot) is checked exactly once,
and the trusted load writes the same rows a checked one does."""

from __future__ import annotations

from collections import Counter

import pytest
import torch

from kvcache_core import PoolConfig, SnapshotMismatchError
from kvcache_plugins import _mamba_state, _swa_pool, mamba, mha, swa


@pytest.fixture
def checks(monkeypatch: pytest.MonkeyPatch) -> Counter[int]:
    """id(snapshot) -> how many times a pool checked it."""
    seen: Counter[int] = Counter()
    for module in (_swa_pool, mha, mamba, _mamba_state):
        original = module.expect_snapshot

        def counting(snapshot, *args, _original=original, **kwargs):
            seen[id(snapshot)] += 1
            return _original(snapshot, *args, **kwargs)

        monkeypatch.setattr(module, "expect_snapshot", counting)
    return seen


def _fill(pool, slots: torch.Tensor) -> None:
    gen = torch.Generator().manual_seed(int(slots.sum()))
    for layer in range(pool.layer_num):
        k, _v = pool.get_kv_buffer(layer)
        shape = (slots.numel(), *k.shape[1:])
        pool.set_kv_buffer(
            type("L", (), {"layer_id": layer})(),
            slots,
            torch.randn(shape, generator=gen),
            torch.randn(shape, generator=gen),
        )


def _snapshots(snapshot) -> list[object]:
    out = [snapshot]
    for child in snapshot.children.values():
        if child is not None:
            out += _snapshots(child)
    return out


@pytest.mark.parametrize("page_size", [1, 4])
def test_an_swa_reload_checks_each_snapshot_once(checks, page_size):
    pool, alloc = swa.create(
        PoolConfig(
            size=32,
            swa_size=16,
            page_size=page_size,
            layer_num=2,
            head_num=1,
            head_dim=2,
            swa_layer_ids=(1,),
        )
    )
    src = alloc.alloc(8)
    _fill(pool, src)
    snapshot = alloc.get_cpu_copy(src)
    alloc.free(src)
    dst = alloc.alloc(8)
    checks.clear()
    alloc.load_cpu_copy(snapshot, dst)
    assert {checks[id(s)] for s in _snapshots(snapshot)} == {1}
    assert len(checks) == 3  # the SWA snapshot, its full and its window child
    again = alloc.get_cpu_copy(dst)
    for name in ("full", "swa"):
        for part in ("k", "v"):
            assert torch.equal(
                again.children[name].parts[part], snapshot.children[name].parts[part]
            )


def test_the_swa_pool_still_checks_a_load_it_was_not_told_to_trust(checks):
    pool, alloc = swa.create(
        PoolConfig(size=16, swa_size=16, layer_num=2, head_num=1, head_dim=2, swa_layer_ids=(1,))
    )
    src = alloc.alloc(4)
    snapshot = alloc.get_cpu_copy(src)
    checked = pool.check_cpu_copy(snapshot, src)
    other = alloc.alloc(3)
    with pool.trusting(checked), pytest.raises(SnapshotMismatchError):
        pool.load_cpu_copy(snapshot, other)  # other indices: checked, and refused
    with pytest.raises(SnapshotMismatchError):
        pool.load_cpu_copy(snapshot, other)  # no trust outside the block
    assert pool._trusted is None


def test_a_hybrid_mamba_reload_checks_each_snapshot_once(checks):
    _pool, alloc = mamba.create(
        PoolConfig(
            size=16,
            layer_num=2,
            head_num=1,
            head_dim=1,
            mamba_layer_ids=(1,),
            mamba_size=4,
            temporal_state_shape=(1,),
        )
    )
    src, requests = alloc.alloc(4), alloc.mamba_allocator.alloc(1)
    snapshot = alloc.get_cpu_copy(src, mamba_indices=requests)
    dst, new_requests = alloc.alloc(4), alloc.mamba_allocator.alloc(1)
    checks.clear()
    alloc.load_cpu_copy(snapshot, dst, mamba_indices=new_requests)
    assert {checks[id(s)] for s in _snapshots(snapshot)} == {1}
    assert len(checks) == 3  # the hybrid snapshot, its attention and its state child


def test_an_mha_reload_checks_its_snapshot_once(checks):
    _pool, alloc = mha.create(PoolConfig(size=16, layer_num=2, head_num=1, head_dim=2))
    src = alloc.alloc(4)
    snapshot = alloc.get_cpu_copy(src)
    checks.clear()
    alloc.load_cpu_copy(snapshot, alloc.alloc(4))
    assert dict(checks) == {id(snapshot): 1}
