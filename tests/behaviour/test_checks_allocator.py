"""allocator-state-machine: a correct allocator agrees with the model; each known allocator bug,
alone, is caught with a short runnable step sequence."""

from __future__ import annotations

import pytest
import torch

from kvcache_core import AllocatorError, PoolConfig, PoolSpec
from kvcache_plugins.allocators import PagedSlotAllocator
from kvcache_plugins.mha import MHATokenToKVPool
from kvcache_plugins.mha import create as create_mha

from ._support import builtin_specs, example_spec, exec_reproduction, run_one
from .gallery_inputs import GALLERY

GOOD = [*builtin_specs(), example_spec()]
MHA = next(s for s in GOOD if s.name == "mha")


def _spec_with(allocator_class: type) -> PoolSpec:
    def factory(config: PoolConfig) -> tuple[MHATokenToKVPool, PagedSlotAllocator]:
        pool, _ = create_mha(config)
        return pool, allocator_class(config.size, config.page_size, pool)

    return PoolSpec("allocator-probe", MHATokenToKVPool, allocator_class, factory, MHA.capabilities)


def test_a_correct_allocator_agrees_with_the_model() -> None:
    """The model is not stricter than the contract: the built-in allocator passes, on page
    size 4 and on page size 1."""
    spec = _spec_with(PagedSlotAllocator)
    result = run_one(spec, "allocator-state-machine")
    assert result.outcome.value == "passed", result.findings
    assert result.duration_s < 15  # ~1 s idle; generous for a loaded shared machine
    token = PoolSpec(
        "allocator-probe",
        spec.pool_class,
        spec.allocator_class,
        spec.factory,
        spec.capabilities,
        behaviour_config=PoolConfig(size=16, layer_num=1, head_num=1, head_dim=2, page_size=1),
    )
    assert run_one(token, "allocator-state-machine").outcome.value == "passed"


# The three allocator bugs issue 7 found, put back one at a time into the fixed allocator.


class _DropsGroup(PagedSlotAllocator):
    """Ends a free group with one merged call: one bad id takes the group's other frees down."""

    def free_group_end(self) -> None:
        group, self._group = self._group, None
        if group is None:
            raise AllocatorError("free_group_end called without free_group_begin")
        if group:
            self.free(torch.cat([g.reshape(-1).to(torch.int64) for g in group]))


class _BackupForgetsGroup(PagedSlotAllocator):
    """Backs up without the frees an open group collected before the backup."""

    def _flush_group(self) -> None:
        pass


class _DecodeMissesQueuedFrees(PagedSlotAllocator):
    """Checks ``last_loc`` against settled frees only, as if queued ones had not happened."""

    def _check_last_locs(self, requests: list[tuple[int, int]]) -> None:
        pending, self._pending = self._pending, []
        try:
            super()._check_last_locs(requests)
        finally:
            self._pending = pending + self._pending


@pytest.mark.parametrize(
    ("allocator_class", "expected"),
    [
        (_DropsGroup, "inside a free group between legitimate frees"),
        (_BackupForgetsGroup, "after restore_state (it must undo every alloc and free since)"),
        (_DecodeMissesQueuedFrees, "which is free: raise AllocatorError"),
    ],
)
def test_each_known_bug_alone_is_caught(
    allocator_class: type, expected: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    (finding,) = run_one(_spec_with(allocator_class), "allocator-state-machine").findings
    assert expected in finding.message
    assert "(shortest sequence found)" in finding.message
    # The snippet replays the steps on the real pool name; give it this allocator.
    monkeypatch.setattr("kvcache_plugins.mha.PagedSlotAllocator", allocator_class, raising=True)
    shown = exec_reproduction(
        finding.reproduction.replace("'allocator-probe'", "'mha'"), monkeypatch
    )
    assert isinstance(shown, AssertionError)


@pytest.mark.parametrize("spec", GOOD, ids=[s.name for s in GOOD])
def test_builtins_pass(spec: PoolSpec) -> None:
    result = run_one(spec, "allocator-state-machine")
    assert result.outcome.value == "passed", [str(f) for f in result.findings]
    assert result.duration_s < 10


def test_slot_handed_out_twice(monkeypatch: pytest.MonkeyPatch) -> None:
    spec = dict((s.name, s) for _, s in GALLERY)["gallery-slot-handed-out-twice"]
    (finding,) = run_one(spec, "allocator-state-machine").findings
    assert "(shortest sequence found)" in finding.message
    assert "allocator.free(torch.tensor(" in finding.reproduction
    shown = exec_reproduction(finding.reproduction, monkeypatch)
    assert isinstance(shown, AssertionError)
