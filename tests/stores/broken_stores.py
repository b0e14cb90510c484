"""Store plugins each broken in one way, so that each check of the store battery is shown to
catch its own defect (who checks the checker). Registered with ``plugins=``, never installed."""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence

from kvcache_core.errors import StoreUnavailableError
from kvcache_core.hookspecs import hookimpl
from kvcache_core.stores import StoreSpec
from kvcache_plugins.stores._common import check_ttl
from kvcache_plugins.stores.memory import MemoryStore
from kvcache_plugins.stores.redis_store import RedisStore, open_redis


class TornWrites(MemoryStore):
    """Publishes the first half of a value before the whole of it."""

    def put(self, key: str, value: bytes, *, ttl: float | None = None) -> None:
        super().put(key, value[: len(value) // 2], ttl=ttl)
        time.sleep(0.001)
        super().put(key, value, ttl=ttl)


class KeepsFirst(MemoryStore):
    """Never replaces a value."""

    def put_many(self, items: Mapping[str, bytes], *, ttl: float | None = None) -> None:
        super().put_many({k: v for k, v in items.items() if self.get(k) is None}, ttl=ttl)


class IgnoresTtl(MemoryStore):
    """Checks a ttl, then keeps the value forever."""

    def put_many(self, items: Mapping[str, bytes], *, ttl: float | None = None) -> None:
        check_ttl(ttl)
        super().put_many(items)


class TakesAnything(MemoryStore):
    """Stores whatever it is given, as the repr's bytes."""

    def put_many(self, items: Mapping[str, bytes], *, ttl: float | None = None) -> None:
        with self._lock:
            for k, v in items.items():
                self._values[str(k)] = (v if isinstance(v, bytes) else str(v).encode(), None)


class EmptyForMissing(MemoryStore):
    def get(self, key: str, *, max_bytes: int | None = None) -> bytes | None:
        value = super().get(key, max_bytes=max_bytes)
        return b"" if value is None else value


class Truncates(MemoryStore):
    """Keeps at most 8 MiB of a value."""

    def put_many(self, items: Mapping[str, bytes], *, ttl: float | None = None) -> None:
        super().put_many({k: v[: 8 << 20] for k, v in items.items()}, ttl=ttl)


class SortsBatches(MemoryStore):
    def get_many(self, keys: Sequence[str]) -> list[bytes | None]:
        return super().get_many(sorted(keys, key=str))


class IgnoresMaxBytes(MemoryStore):
    """Takes ``max_bytes`` and returns the whole value anyway."""

    def get(self, key: str, *, max_bytes: int | None = None) -> bytes | None:
        return super().get(key)


class DeletesExpiredByName(MemoryStore):
    """Finds a value expired, then (a moment later) deletes whatever the key holds by then:
    the directory store's old read path, which lost newer values."""

    def get(self, key: str, *, max_bytes: int | None = None) -> bytes | None:
        entry = self._values.get(key)
        if entry is not None and entry[1] is not None and time.monotonic() >= entry[1]:
            time.sleep(0.0005)
            self._values.pop(key, None)
            return None
        return super().get(key, max_bytes=max_bytes)


class EncodesKeysUnchecked(MemoryStore):
    """Encodes keys without checking them: a lone surrogate raises UnicodeEncodeError."""

    def put_many(self, items: Mapping[str, bytes], *, ttl: float | None = None) -> None:
        for key in items:
            if isinstance(key, str):
                key.encode("utf-8")
        super().put_many(items, ttl=ttl)


class HidesOutages(RedisStore):
    """Answers None when the server is gone: a request would be lost, not reported."""

    def get(self, key: str, *, max_bytes: int | None = None) -> bytes | None:
        try:
            return super().get(key, max_bytes=max_bytes)
        except StoreUnavailableError:
            return None


def _memory(cls: type[MemoryStore]) -> StoreSpec:
    name = cls.__name__.lower()
    return StoreSpec(name, (name,), lambda url: cls(url), cls, shared=False)


def _hides(url: str) -> HidesOutages:
    real = open_redis("redis" + url.removeprefix("hidesoutages"))
    return HidesOutages(real._client, where=real.where, timeout=real.timeout)


@hookimpl
def kvcache_store_specs() -> list[StoreSpec]:
    stores = [
        TornWrites,
        KeepsFirst,
        IgnoresTtl,
        TakesAnything,
        EmptyForMissing,
        Truncates,
        SortsBatches,
        IgnoresMaxBytes,
        DeletesExpiredByName,
        EncodesKeysUnchecked,
    ]
    return [
        *(_memory(c) for c in stores),
        StoreSpec("hidesoutages", ("hidesoutages",), _hides, HidesOutages, shared=False),
    ]
