"""Counting host syncs without a GPU: a test helper, also used by ``make bench``.

On an accelerator every read of device data back to the host waits for the device queue to
drain (a sync). Without CUDA, `DeviceIds` stands in: CPU data standing for device data,
that records each operation that would force a device -> host read on CUDA:

- an explicit read: ``bool(t)``, ``int(t)``, ``t.item()``, ``t.tolist()``, ``t.numpy()``;
- a copy to the host: ``t.cpu()``, ``t.to("cpu")`` (the result is an ordinary host tensor);
- an operation whose output size depends on the values: ``nonzero``, ``torch.unique``,
  ``masked_select``, indexing with a boolean mask.

Everything computed from a ``DeviceIds`` stays one (torch keeps the subclass), so the count
follows the data the way it would flow on a device. Give an allocator's device-resident tables
the same treatment with `as_device` (a view sharing storage) to count reads of them too.

Why under ``tests/`` and not in ``kvcache_core``: nothing in the library uses it; it serves the
allocator tests, and ``benchmarks/_allocator.py``, which prints the same counts the tests pin,
imports it as ``tests.allocators._host_syncs`` with the checkout on ``sys.path`` (as
``bench_drift.py`` imports the test package's generators).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, ClassVar

import torch

__all__ = ["DeviceIds", "as_device", "count_host_syncs"]

_READS = frozenset(
    {"__bool__", "__int__", "__index__", "item", "tolist", "numpy", "nonzero", "unique"}
    | {"masked_select"}
)


def _is_host(device: object) -> bool:
    return device is not None and torch.device(device).type == "cpu"  # type: ignore[call-overload]


class DeviceIds(torch.Tensor):
    """CPU data that stands for data on an accelerator and records host syncs."""

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
        out = super().__torch_function__(func, types, args, kwargs)  # type: ignore[no-untyped-call]
        if to_host and isinstance(out, torch.Tensor):
            return out.as_subclass(torch.Tensor)  # now a host tensor: reading it is free
        return out


def as_device(tensor: torch.Tensor) -> DeviceIds:
    """``tensor`` seen as device data (a view: writes through it reach ``tensor``)."""
    return tensor.as_subclass(DeviceIds)


def count_host_syncs(call: Callable[[], object]) -> list[str]:
    """The host syncs ``call()`` makes on `DeviceIds` data, in order."""
    DeviceIds.syncs = []
    try:
        call()
    finally:
        syncs, DeviceIds.syncs = list(DeviceIds.syncs), []
    return syncs
