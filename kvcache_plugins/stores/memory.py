"""The in-process snapshot store (``memory:``): nothing to start, nothing shared between processes.

It is the embedded default: two engine instances in one process (a test, ``kvcache demo
--instances 2 --store memory:``) share it by URL, ``memory:`` or ``memory:NAME``, as if it were
a server. Values are immutable bytes, so ``get`` returns the stored object without a copy.

Expiry: a value put with a ``ttl`` is dropped at the first call to the store (any key) after it
expired, so a snapshot nobody resumes does not hold memory for longer than its ttl plus the
time to the next call. A heap of deadlines makes that cost O(log n) per expired value.
"""

from __future__ import annotations

import heapq
import itertools
import threading
import time
from collections.abc import Mapping, Sequence

from kvcache_core import StoreSpec, hookimpl

from ._common import check_key, check_max_bytes, check_ttl, check_value, too_large

__all__ = ["MemoryStore", "kvcache_store_specs", "open_memory"]


class MemoryStore:
    """Bytes under string keys in a dict, behind a lock; expiry by a monotonic deadline."""

    def __init__(self, name: str = "") -> None:
        self.name = name
        self._lock = threading.Lock()
        self._values: dict[str, tuple[bytes, float | None]] = {}
        # (deadline, put number, key) of every value put with a ttl; an entry whose key has
        # since been overwritten or deleted is skipped when it comes up.
        self._deadlines: list[tuple[float, int, str]] = []
        self._puts = itertools.count()

    def __repr__(self) -> str:
        return f"MemoryStore(memory:{self.name})"

    def _reclaim(self, now: float) -> None:
        """Drop every value whose deadline has passed (the lock held)."""
        heap = self._deadlines
        while heap and heap[0][0] <= now:
            deadline, _, key = heapq.heappop(heap)
            entry = self._values.get(key)
            if entry is not None and entry[1] == deadline:
                del self._values[key]

    def _live(self, key: str) -> bytes | None:
        entry = self._values.get(key)
        if entry is None:
            return None
        value, deadline = entry
        if deadline is not None and time.monotonic() >= deadline:
            del self._values[key]
            return None
        return value

    def put(self, key: str, value: bytes, *, ttl: float | None = None) -> None:
        """Store ``value`` under ``key``, replacing any value."""
        self.put_many({key: value}, ttl=ttl)

    def get(self, key: str, *, max_bytes: int | None = None) -> bytes | None:
        """The value under ``key``, or None.

        :raises StoreValueTooLargeError: The value is over ``max_bytes``.
        """
        limit = check_max_bytes(max_bytes)
        value = self.get_many([key])[0]
        if limit is not None and value is not None and len(value) > limit:
            raise too_large(key, len(value), limit, repr(self))
        return value

    def delete(self, key: str) -> bool:
        """Remove ``key``; True when it held a value."""
        return self.delete_many([key]) == 1

    def exists(self, key: str) -> bool:
        """Whether ``key`` holds a value now."""
        return self.get(key) is not None

    def put_many(self, items: Mapping[str, bytes], *, ttl: float | None = None) -> None:
        """Store every item at once (all checked first, then stored under one lock)."""
        seconds = check_ttl(ttl)
        checked = [(check_key(k), check_value(v)) for k, v in items.items()]
        now = time.monotonic()
        deadline = None if seconds is None else now + seconds
        with self._lock:
            self._reclaim(now)
            for key, value in checked:
                self._values[key] = (value, deadline)
                if deadline is not None:
                    heapq.heappush(self._deadlines, (deadline, next(self._puts), key))

    def get_many(self, keys: Sequence[str]) -> list[bytes | None]:
        """The values under ``keys``, in order (None for a missing one)."""
        checked = [check_key(k) for k in keys]
        with self._lock:
            self._reclaim(time.monotonic())
            return [self._live(k) for k in checked]

    def delete_many(self, keys: Sequence[str]) -> int:
        """Remove every key; how many held a value."""
        checked = [check_key(k) for k in keys]
        with self._lock:
            self._reclaim(time.monotonic())
            return sum(
                self._live(k) is not None and self._values.pop(k) is not None for k in checked
            )

    def close(self) -> None:
        """Nothing to release: the values stay for other users of the same URL."""


_NAMED: dict[str, MemoryStore] = {}
_NAMED_LOCK = threading.Lock()


def open_memory(url: str) -> MemoryStore:
    """The process-wide store named by ``memory:NAME`` (``memory:`` is the unnamed one)."""
    scheme, _, name = url.partition(":")
    if scheme != "memory":
        raise ValueError(f"not a memory: URL: {url!r}")
    with _NAMED_LOCK:
        return _NAMED.setdefault(name, MemoryStore(name))


@hookimpl
def kvcache_store_specs() -> list[StoreSpec]:
    """The ``memory`` store."""
    return [
        StoreSpec(
            name="memory",
            schemes=("memory",),
            factory=open_memory,
            store_class=MemoryStore,
            description="in-process dict (default; shared by URL within one process only)",
            shared=False,
            example_url="memory:kvcache-check",
        )
    ]
