"""The built-in plugins satisfy every Protocol they declare, as mypy sees them."""

from __future__ import annotations

from pathlib import Path

import kvcache_plugins
from kvcache_core.conformance.results.model import Outcome
from kvcache_core.conformance.targets.plugins import plugin_targets
from kvcache_core.conformance.targets.target import ClassTarget
from kvcache_core.conformance.types import level as types_level

PLUGINS = Path(kvcache_plugins.__file__).resolve().parent


def test_mha_pool_and_allocators_pass(mypy_cache: Path) -> None:
    targets = [
        ClassTarget(
            "mha:pool",
            "MHATokenToKVPool",
            ("KVPool", "OffloadablePool"),
            path=str(PLUGINS / "mha.py"),
            module="kvcache_plugins.mha",
        ),
        ClassTarget(
            "mha:allocator",
            "PagedSlotAllocator",
            ("TokenAllocator", "PagedAllocator"),
            path=str(PLUGINS / "allocators.py"),
        ),
        # No path: the level finds the file from the module name without importing it.
        ClassTarget(
            "token-allocator",
            "TokenSlotAllocator",
            ("TokenAllocator",),
            module="kvcache_plugins.allocators",
        ),
    ]
    results = types_level.run(targets, contract_version=2, cache_dir=mypy_cache)
    assert [(r.target, r.check) for r in results] == [
        ("mha:pool", "types:KVPool"),
        ("mha:pool", "types:OffloadablePool"),
        ("mha:allocator", "types:TokenAllocator"),
        ("mha:allocator", "types:PagedAllocator"),
        ("token-allocator", "types:TokenAllocator"),
    ]
    assert all(r.outcome is Outcome.PASSED and not r.findings for r in results), results


def test_every_installed_builtin_plugin_passes(mypy_cache: Path) -> None:
    """mha now; mla, dsa, swa, mamba and hisparse as they land (whatever is installed)."""
    targets, _load_errors = plugin_targets()  # load errors are the signature level's to report
    builtin = [t for t in targets if (t.module or "").startswith("kvcache_plugins.")]
    assert any(t.class_name == "MHATokenToKVPool" for t in builtin)
    results = types_level.run(builtin, contract_version=2, cache_dir=mypy_cache)
    assert len(results) == sum(len(set(t.protocols)) for t in builtin)
    failing = [(r.target, r.check, r.outcome, r.detail, r.findings) for r in results]
    failing = [f for f in failing if f[2] is not Outcome.PASSED or f[4]]
    assert failing == []
