"""What the checker checks: one class, where it lives, and which contract Protocols it claims."""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["ClassTarget"]


@dataclass(frozen=True)
class ClassTarget:
    """A class to check against contract Protocols.

    ``path`` is its source file (the source and types levels read it without importing);
    ``module`` is its importable module name when known (the signature level imports it).
    ``protocols`` are names exported by ``kvcache_core.contracts`` (e.g. ``"OffloadablePool"``).
    ``plugin``/``pool`` say which plugin and pool name the class came from, if any.
    ``serves`` lists every (plugin, pool) pair the class serves: one allocator class often
    serves several pools (of several plugins), and the behaviour level must run each pool.
    """

    name: str
    class_name: str
    protocols: tuple[str, ...]
    path: str | None = None
    module: str | None = None
    plugin: str | None = None
    pool: str | None = None
    serves: tuple[tuple[str, str], ...] = ()
