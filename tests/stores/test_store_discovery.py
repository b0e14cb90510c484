"""Store plugins are found by entry point (group ``kvcache.stores``) and isolated like pools:
each broken plugin is rejected with its reason, and the good ones still load."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from kvcache_core.errors import PluginRejectedError, StoreError
from kvcache_core.stores import discover_stores, store_drift

GROUP = "kvcache.stores"

GOOD = """
from kvcache_core.hookspecs import hookimpl
from kvcache_core.stores import StoreSpec
from kvcache_plugins.stores.memory import MemoryStore

@hookimpl
def kvcache_store_specs():
    return [StoreSpec("{name}", ("{name}",), MemoryStore, MemoryStore, shared=False)]
"""

DRIFTED = """
from kvcache_core.hookspecs import hookimpl
from kvcache_core.stores import StoreSpec
from kvcache_plugins.stores.memory import MemoryStore

class NoTtl(MemoryStore):
    def put(self, key, value):
        super().put(key, value)

@hookimpl
def kvcache_store_specs():
    return [StoreSpec("drifted", ("drifted",), lambda url: NoTtl(), NoTtl)]
"""

PLUGINS = {
    "raises_at_import": "raise RuntimeError('boom while importing')",
    "raises_in_hook": (
        "from kvcache_core.hookspecs import hookimpl\n"
        "@hookimpl\ndef kvcache_store_specs():\n    raise ValueError('boom in the hook')\n"
    ),
    "no_marker": "def kvcache_store_specs():\n    return []\n",
    "returns_junk": (
        "from kvcache_core.hookspecs import hookimpl\n"
        "@hookimpl\ndef kvcache_store_specs():\n    return ['not a spec']\n"
    ),
    "drifted": DRIFTED,
}


def test_broken_store_plugins_are_rejected_with_reasons(fake_site: Callable[..., Path]) -> None:
    modules = {f"st_{k}": v for k, v in PLUGINS.items()}
    modules["st_good"] = GOOD.format(name="goodstore")
    fake_site("broken-stores", entry_points={m: m for m in modules}, modules=modules, group=GROUP)
    registry = discover_stores()
    assert "goodstore" in registry.names() and "memory" in registry.names()
    reasons = {r.plugin.name: r.reason for r in registry.rejected}
    assert reasons["st_raises_at_import"].startswith("import failed: RuntimeError: boom")
    assert reasons["st_raises_in_hook"].startswith("kvcache_store_specs() raised ValueError")
    assert "without the @hookimpl marker" in reasons["st_no_marker"]
    assert reasons["st_returns_junk"] == "hook returned a str, expected a StoreSpec"
    assert reasons["st_drifted"] == "contract drift: NoTtl.put() lacks parameter 'ttl'"
    assert registry.open("goodstore:").get("k") is None
    with pytest.raises(StoreError, match=r"drifted:.*contract drift"):
        registry.open("drifted:")
    with pytest.raises(PluginRejectedError, match="5 kvcache plugin"):
        discover_stores(strict=True)


def test_a_scheme_claimed_twice_rejects_both(fake_site: Callable[..., Path]) -> None:
    fake_site(
        "two-stores",
        entry_points={"st_one": "st_one", "st_two": "st_two"},
        modules={"st_one": GOOD.format(name="twin"), "st_two": GOOD.format(name="twin")},
        group=GROUP,
    )
    registry = discover_stores()
    assert "twin" not in registry.names()
    assert [r.reason.split(",")[0] for r in registry.rejected] == ["duplicate name 'twin'"] * 2


def test_allow_and_deny_lists(monkeypatch: pytest.MonkeyPatch) -> None:
    assert discover_stores(allow=["memory"]).names() == ["memory"]
    assert "dir" not in discover_stores(deny=["dir"]).names()
    monkeypatch.setenv("KVCACHE_DISABLE_STORES", "redis")
    assert "redis" not in discover_stores().names()


class Lax:
    def put(self, key, value, *, ttl=None, **extra): ...  # type: ignore[no-untyped-def]
    def get(self, key, **kw): ...  # type: ignore[no-untyped-def]
    def delete(self, key): ...  # type: ignore[no-untyped-def]
    def exists(self, key): ...  # type: ignore[no-untyped-def]
    def put_many(self, items, **kw): ...  # type: ignore[no-untyped-def]
    def get_many(self, keys, limit=10): ...  # type: ignore[no-untyped-def]
    def delete_many(self, keys): ...  # type: ignore[no-untyped-def]
    def close(self): ...  # type: ignore[no-untyped-def]


def test_drift_accepts_any_class_every_call_fits() -> None:
    assert store_drift(Lax) is None

    class Positional(Lax):
        def put(self, key, value, ttl, /): ...  # type: ignore[no-untyped-def, override]

    class Required(Lax):
        def get(self, key, namespace, **kw): ...  # type: ignore[no-untyped-def, override]

    class NoLimit(Lax):  # a store written before get took max_bytes
        def get(self, key): ...  # type: ignore[no-untyped-def, override]

    class Missing:
        pass

    assert store_drift(Positional) == "Positional.put() takes 'key' as positional-only"
    assert store_drift(Required) == "Required.get() requires 'namespace', which callers never pass"
    assert store_drift(NoLimit) == "NoLimit.get() lacks parameter 'max_bytes'"
    assert store_drift(Missing) == "Missing has no method put()"
    assert store_drift(42) == "store_class is int, not a class"
