"""How many times ``free`` reads ids back to the host, per call, counted without a GPU.

On an accelerator every such read waits for the device queue to drain (a sync). This machine has
no CUDA, so the ids are a :class:`DeviceIds` tensor: CPU data standing for device data, that
records each operation that would force a device -> host read on CUDA:

- an explicit read: ``bool(t)``, ``int(t)``, ``t.item()``, ``t.tolist()``, ``t.numpy()``;
- a copy to the host: ``t.cpu()``, ``t.to("cpu")`` (the result is an ordinary host tensor);
- an operation whose output size depends on the values: ``nonzero``, ``torch.unique``,
  ``masked_select``, indexing with a boolean mask.

Everything computed from the ids stays a ``DeviceIds`` (torch keeps the subclass), so the count
follows the data the way it would flow on a device. The numbers are pinned: a change that adds a
sync to ``free`` fails here and has to say why (docs/pools/hisparse.md, docs/pools/swa.md).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, ClassVar

import pytest
import torch

from . import _factories as fx

_READS = {"__bool__", "__int__", "__index__", "item", "tolist", "numpy", "nonzero", "unique"}
_READS |= {"masked_select"}


def _is_host(device: object) -> bool:
    return device is not None and torch.device(device).type == "cpu"  # type: ignore[arg-type]


class DeviceIds(torch.Tensor):
    """CPU ids that stand for ids on an accelerator and count host syncs (see the module doc)."""

    syncs: ClassVar[list[str]] = []

    @classmethod
    def __torch_function__(
        cls,
        func: Callable[..., Any],
        types: Any,
        args: tuple[Any, ...] = (),
        kwargs: dict[str, Any] | None = None,
    ) -> Any:
        kwargs = kwargs or {}
        name = getattr(func, "__name__", "")
        to_host = name == "cpu" or (
            name == "to"
            and (
                _is_host(kwargs.get("device"))
                or any(isinstance(a, (str, torch.device)) and _is_host(a) for a in args[1:])
            )
        )
        masked = name == "__getitem__" and any(
            isinstance(i, torch.Tensor) and i.dtype == torch.bool
            for i in (args[1] if isinstance(args[1], tuple) else (args[1],))
        )
        if name in _READS or to_host or masked:
            cls.syncs.append("to-host" if to_host else "bool-mask" if masked else name)
        out = super().__torch_function__(func, types, args, kwargs)
        if to_host and isinstance(out, torch.Tensor):
            return out.as_subclass(torch.Tensor)  # now a host tensor: reading it is free
        return out


def _count(call: Callable[[torch.Tensor], None], ids: torch.Tensor) -> list[str]:
    device_ids = ids.clone().as_subclass(DeviceIds)
    DeviceIds.syncs = []
    call(device_ids)
    return list(DeviceIds.syncs)


def test_the_proxy_counts_what_would_sync():
    ids = torch.tensor([1, 2, 3]).as_subclass(DeviceIds)
    DeviceIds.syncs = []
    _ = ids + 1, ids[1:], torch.isin(ids, ids), ids.clone()  # stay on the device
    assert DeviceIds.syncs == []
    bool((ids > 1).any())
    host = ids.to("cpu")
    host.tolist()  # a host tensor now: free
    ids[ids > 1]
    torch.unique(ids)
    assert DeviceIds.syncs == ["__bool__", "to-host", "bool-mask", "unique"]


@pytest.mark.parametrize("page_size", [1, 4])
def test_the_plain_allocators_free_reads_nothing_back(page_size):
    """The token/paged allocator only queues the ids (checked at the next settle)."""
    alloc = fx.paged(64, page_size)
    slots = alloc.alloc(8)
    assert slots is not None
    assert _count(alloc.free, slots) == []


def test_hisparse_free_syncs_once_per_call():
    """``HiSparseSlotAllocator.free``: the copy of the ids to the host, which the host page
    table needs to drop residency now; the range check runs on that copy (it used to run on
    the device first: a second sync)."""
    alloc = fx.hisparse_alloc(32, page_size=4)
    slots = alloc.alloc(8)
    assert slots is not None
    assert _count(alloc.free, slots) == ["to-host"]
    alloc.check_frees()
    assert alloc.available_size() == 32


@pytest.mark.parametrize(
    ("page_size", "expected"),
    [(1, ["tolist", "nonzero"]), (4, ["tolist", "unique", "nonzero"])],
)
def test_swa_free_syncs_per_call(page_size, expected):
    """``SWASlotAllocator.free``: one read for the range and slot-0 checks together, the
    whole-page expansion (``unique``, paged only), and one ``nonzero`` for the tokens that hold
    a window slot (it used to be five: three ``bool`` reads and two boolean-mask selections)."""
    alloc = fx.swa_alloc(32, 32, page_size=page_size)
    slots = (
        alloc.alloc(8)
        if page_size == 1
        else alloc.alloc_extend(torch.tensor([0]), torch.tensor([8]), torch.tensor([-1]), 8)
    )
    assert slots is not None
    assert _count(alloc.free, slots) == expected
    alloc.full_attn_allocator.check_frees()
    assert alloc.available_size() == 32
