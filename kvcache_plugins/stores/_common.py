"""Argument checks every built-in store shares, so each refuses bad input with the same words
before it touches its backend."""

from __future__ import annotations

import math

from kvcache_core import StoreError, StoreValueTooLargeError

__all__ = [
    "MAX_KEY_LENGTH",
    "check_key",
    "check_max_bytes",
    "check_ttl",
    "check_value",
    "too_large",
]

#: Longest key accepted (in characters): keys name requests, not data.
MAX_KEY_LENGTH = 1024


def check_key(key: object) -> str:
    """``key`` if it is a non-empty string of at most ``MAX_KEY_LENGTH`` characters."""
    if not isinstance(key, str):
        raise StoreError(f"store keys are strings, got {type(key).__name__}")
    if not key or len(key) > MAX_KEY_LENGTH:
        raise StoreError(f"store keys are 1 to {MAX_KEY_LENGTH} characters, got {len(key)}")
    try:
        key.encode("utf-8")
    except UnicodeEncodeError as exc:
        # A lone surrogate: no file name, Redis key or other process could hold it the same.
        raise StoreError(
            f"store keys are text that UTF-8 can encode; character {exc.start} of this key is "
            f"a lone surrogate ({key[exc.start]!r})"
        ) from None
    return key


def check_value(value: object) -> bytes:
    """``value`` as immutable bytes (a bytearray or memoryview is copied once, so a caller
    changing its buffer later cannot change what was stored)."""
    if isinstance(value, bytes):
        return value
    if isinstance(value, (bytearray, memoryview)):
        return bytes(value)
    raise StoreError(f"store values are bytes, got {type(value).__name__}")


def check_ttl(ttl: object) -> float | None:
    """``ttl`` in seconds if it is None or a positive finite number."""
    if ttl is None:
        return None
    if (
        isinstance(ttl, bool)
        or not isinstance(ttl, (int, float))
        or not math.isfinite(ttl)
        or ttl <= 0
    ):
        raise StoreError(f"ttl must be a positive number of seconds or None, got {ttl!r}")
    return float(ttl)


def check_max_bytes(max_bytes: object) -> int | None:
    """``max_bytes`` if it is None or a non-negative integer."""
    if max_bytes is None:
        return None
    if isinstance(max_bytes, bool) or not isinstance(max_bytes, int) or max_bytes < 0:
        raise StoreError(f"max_bytes must be a non-negative integer or None, got {max_bytes!r}")
    return max_bytes


def too_large(key: str, size: int | None, limit: int, where: str) -> StoreValueTooLargeError:
    """The error for a value over ``max_bytes``, in the same words on every store."""
    what = f"{size} bytes" if size is not None else f"more than {limit} bytes"
    return StoreValueTooLargeError(
        f"the value of {key!r} in {where} is {what}, more than the max_bytes={limit} allowed "
        "(not read)",
        size=size,
        limit=limit,
    )
