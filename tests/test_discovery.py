"""Discovery against real (fake-but-installed) distributions: isolation, policy, duplicates."""

from __future__ import annotations

import pytest
import torch

from kvcache_core import PluginRejectedError, PoolConfig, UnknownPoolError, discover

GOOD = """
from kvcache_core import Capability, PoolSpec, hookimpl
from kvcache_plugins.allocators import PagedSlotAllocator
from kvcache_plugins.mha import MHATokenToKVPool, create


@hookimpl
def kvcache_pool_specs():
    return [PoolSpec(name="{name}", pool_class=MHATokenToKVPool,
                     allocator_class=PagedSlotAllocator, factory=create,
                     capabilities=frozenset({{Capability.OFFLOAD}}))]
"""

RAISES_AT_IMPORT = """
raise RuntimeError("boom while importing")
"""

RAISES_IN_HOOK = """
from kvcache_core import hookimpl


@hookimpl
def kvcache_pool_specs():
    raise ValueError("boom inside the hook")
"""

DRIFTED = """
from kvcache_core import Capability, PoolSpec, hookimpl
from kvcache_plugins.allocators import PagedSlotAllocator
from kvcache_plugins.mha import MHATokenToKVPool


class OldPool(MHATokenToKVPool):
    def get_cpu_copy(self, indices):
        return super().get_cpu_copy(indices)


@hookimpl
def kvcache_pool_specs():
    return [PoolSpec(name="oldpool", pool_class=OldPool, allocator_class=PagedSlotAllocator,
                     factory=lambda c: None, capabilities=frozenset({Capability.OFFLOAD}))]
"""

FAKES = ["good", "at_import", "in_hook", "twin_a", "twin_b", "drifted"]


@pytest.fixture
def plugins(fake_site):
    fake_site(
        "kv-good",
        entry_points={"good": "kvfake_good"},
        modules={"kvfake_good": GOOD.format(name="goodpool")},
    )
    fake_site(
        "kv-at-import",
        entry_points={"at_import": "kvfake_import"},
        modules={"kvfake_import": RAISES_AT_IMPORT},
    )
    fake_site(
        "kv-in-hook",
        entry_points={"in_hook": "kvfake_hook"},
        modules={"kvfake_hook": RAISES_IN_HOOK},
    )
    fake_site(
        "kv-twin-a",
        entry_points={"twin_a": "kvfake_twin_a"},
        modules={"kvfake_twin_a": GOOD.format(name="twin")},
    )
    fake_site(
        "kv-twin-b",
        entry_points={"twin_b": "kvfake_twin_b"},
        modules={"kvfake_twin_b": GOOD.format(name="twin")},
    )
    fake_site(
        "kv-drifted",
        entry_points={"drifted": "kvfake_drifted"},
        modules={"kvfake_drifted": DRIFTED},
    )


def _reasons(registry):
    return {r.plugin.name: r for r in registry.rejected}


def test_broken_plugins_are_isolated_and_the_good_one_loads(plugins):
    registry = discover(allow=FAKES)
    assert "goodpool" in registry.accepted
    assert registry.accepted["goodpool"].plugin.distribution == "kv-good"
    reasons = _reasons(registry)
    assert "import failed: RuntimeError: boom while importing" in reasons["at_import"].reason
    assert "kvfake_import.py" in reasons["at_import"].reason  # traceback summary names the file
    assert "raised ValueError: boom inside the hook" in reasons["in_hook"].reason


def test_duplicate_pool_names_reject_both_and_name_both_distributions(plugins):
    registry = discover(allow=FAKES)
    assert "twin" not in registry.accepted
    twins = [r for r in registry.rejected if r.pool == "twin"]
    assert {r.plugin.name for r in twins} == {"twin_a", "twin_b"}
    for rejection in twins:
        assert "kv-twin-a" in rejection.reason and "kv-twin-b" in rejection.reason


def test_drifted_signature_is_rejected_with_the_finding(plugins):
    registry = discover(allow=FAKES)
    rejection = _reasons(registry)["drifted"]
    assert rejection.pool == "oldpool"
    rules = {(f.rule, f.method, f.parameter) for f in rejection.findings}
    assert ("missing-parameter", "get_cpu_copy", "mamba_indices") in rules
    assert "matches contract 1" in rejection.reason


def test_strict_mode_raises_listing_every_rejection(plugins):
    with pytest.raises(PluginRejectedError) as info:
        discover(allow=FAKES, strict=True)
    text = str(info.value)
    for name in ("at_import", "in_hook", "twin_a", "twin_b", "drifted"):
        assert f"plugin {name} " in text or f"of plugin {name} " in text


def test_deny_list_and_environment(plugins, monkeypatch):
    registry = discover(allow=FAKES, deny=["at_import", "in_hook"])
    names = {r.plugin.name for r in registry.rejected}
    assert "at_import" not in names and "in_hook" not in names
    assert {i.name for i, why in registry.skipped if "deny" in why} == {"at_import", "in_hook"}

    monkeypatch.setenv("KVCACHE_PLUGINS", "good,mha")
    registry = discover()
    assert set(registry.accepted) == {"goodpool", "mha"}
    assert not registry.rejected

    monkeypatch.delenv("KVCACHE_PLUGINS")
    monkeypatch.setenv("KVCACHE_DISABLE_PLUGINS", "at_import,in_hook,twin_a,twin_b,drifted")
    registry = discover()
    assert "goodpool" in registry.accepted
    assert not [r for r in registry.rejected if r.plugin.name in FAKES]


def test_autoload_off_loads_only_named_plugins(plugins, monkeypatch):
    monkeypatch.setenv("KVCACHE_DISABLE_PLUGIN_AUTOLOAD", "1")
    assert discover().accepted == {}
    registry = discover(allow=["good"])
    assert set(registry.accepted) == {"goodpool"}


def test_builtin_mha_is_found_through_its_entry_point():
    registry = discover(allow=["mha"])
    entry = registry.accepted["mha"]
    assert entry.plugin.value == "kvcache_plugins.mha"
    assert entry.plugin.distribution == "kvcache"
    pool, allocator = registry.create(
        "mha", PoolConfig(size=16, layer_num=2, head_num=2, head_dim=8, dtype=torch.float32)
    )
    assert pool.get_key_buffer(0).shape == (17, 2, 8)
    assert allocator.get_kvcache() is pool


def test_create_unknown_pool_names_the_accepted_ones():
    registry = discover(allow=["mha"])
    with pytest.raises(UnknownPoolError, match="accepted: mha"):
        registry.create("nope", PoolConfig(size=4, layer_num=1))
