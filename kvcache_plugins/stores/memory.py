"""The in-process snapshot store (``memory:``): nothing to start, nothing shared between processes.

It is the embedded default: two engine instances in one process (a test, ``kvcache demo
--instances 2 --store memory:``) share it by URL, ``memory:`` or ``memory:NAME``, as if it were
a server. Values are immutable bytes, so ``get`` returns the stored object without a copy.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Mapping, Sequence

from kvcache_core import StoreSpec, hookimpl

from ._common import check_key, check_ttl, check_value

__all__ = ["MemoryStore", "kvcache_store_specs", "open_memory"]


class MemoryStore:
    """Bytes under string keys in a dict, behind a lock; expiry by a monotonic deadline."""

    def __init__(self, name: str = "") -> None:
        self.name = name
        self._lock = threading.Lock()
        self._values: dict[str, tuple[bytes, float | None]] = {}

    def __repr__(self) -> str:
        return f"MemoryStore(memory:{self.name})"

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

    def get(self, key: str) -> bytes | None:
        """The value under ``key``, or None."""
        return self.get_many([key])[0]

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
        deadline = None if seconds is None else time.monotonic() + seconds
        with self._lock:
            for key, value in checked:
                self._values[key] = (value, deadline)

    def get_many(self, keys: Sequence[str]) -> list[bytes | None]:
        """The values under ``keys``, in order (None for a missing one)."""
        checked = [check_key(k) for k in keys]
        with self._lock:
            return [self._live(k) for k in checked]

    def delete_many(self, keys: Sequence[str]) -> int:
        """Remove every key; how many held a value."""
        checked = [check_key(k) for k in keys]
        with self._lock:
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
