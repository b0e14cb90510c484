"""Exception types shared by the contract, the built-in plugins and discovery.

Every error a pool raises on bad input derives from ``KVCacheError`` *and* from the
builtin exception a caller would naturally catch (``ValueError``, ``IndexError``,
``TypeError``), so engines can catch either the precise kvcache type or the generic one.
"""

from __future__ import annotations

__all__ = [
    "AllocatorError",
    "DoubleFreeError",
    "InvalidLayerError",
    "InvalidSlotError",
    "KVCacheError",
    "PluginRejectedError",
    "ShapeMismatchError",
    "SnapshotMismatchError",
    "StoreError",
    "StoreUnavailableError",
    "StoreValueTooLargeError",
    "UnknownPoolError",
    "UnsupportedDtypeError",
]


class KVCacheError(Exception):
    """Base class of every error raised by kvcache.

    Every error a pool raises on bad input also derives from the builtin exception a caller
    would naturally catch (``ValueError``, ``IndexError``, ``TypeError``), so an engine can
    catch either the precise kvcache type or the generic one.
    """


class InvalidSlotError(KVCacheError, IndexError):
    """Slot indices that are out of range, negative, reserved, duplicated or not integers."""


class InvalidLayerError(KVCacheError, IndexError):
    """A layer id this pool does not hold (after subtracting its ``start_layer``)."""


class ShapeMismatchError(KVCacheError, ValueError):
    """A tensor handed to a pool does not have the shape or dtype the pool stores."""


class UnsupportedDtypeError(KVCacheError, TypeError):
    """A dtype the pool cannot store on this torch build or device."""


class SnapshotMismatchError(KVCacheError, ValueError):
    """A snapshot does not fit the pool it is being loaded into (kind, dtype, shapes, count)."""


class AllocatorError(KVCacheError, ValueError):
    """An allocator was asked for something impossible (e.g. a size not a multiple of a page)."""


class DoubleFreeError(AllocatorError):
    """A slot (or page) was freed while it was already free, or slot 0 was freed."""


class UnknownPoolError(KVCacheError, KeyError):
    """``Registry.create`` was asked for a pool name that no accepted plugin provides."""


class PluginRejectedError(KVCacheError, RuntimeError):
    """Raised by strict discovery: lists every rejected plugin and why."""

    def __init__(self, rejected: list[object]) -> None:
        self.rejected = rejected
        """Every rejection, each printing as one line (plugin and reason)."""
        lines = [f"{len(rejected)} kvcache plugin(s) rejected:"]
        lines += [f"  - {r}" for r in rejected]
        super().__init__("\n".join(lines))


class StoreError(KVCacheError, RuntimeError):
    """A snapshot store could not do what was asked: an unknown store URL, a key it cannot
    hold, or a value it holds that is not one it wrote."""


class StoreUnavailableError(StoreError, ConnectionError):
    """A snapshot store did not answer within its timeout (the server went away, the
    directory vanished). Raised instead of hanging; what the failed call wrote, if anything,
    is never read back as a value (see docs/stores.md, failure semantics)."""


class StoreValueTooLargeError(StoreError):
    """A value is larger than the ``max_bytes`` its ``get`` allowed; raised before the value
    is read into memory (the store asks for its size first, or reads at most ``max_bytes + 1``
    bytes of it).

    :param message: What was refused, naming the key and both sizes.
    :param size: The value's size in bytes, or None when the store only knows it is larger.
    :param limit: The ``max_bytes`` the call allowed.
    """

    def __init__(self, message: str, *, size: int | None, limit: int) -> None:
        super().__init__(message)
        self.size = size
        """The value's size in bytes, or None when the store only knows it exceeds ``limit``."""
        self.limit = limit
        """The ``max_bytes`` the call allowed."""
