"""Installed plugins read from source (``plugin_source``) give what importing them gives.

The source level reads a plugin's ``kvcache_pool_specs()`` hook instead of importing the plugin
when the hook is a plain list of ``PoolSpec(...)`` calls; anything else falls back to the
import path for that plugin. Either way the targets, load errors and source-level results must
be those of the import path (``plugins.plugin_targets``), which these tests compare whole.
"""

from __future__ import annotations

import dataclasses
import importlib
import shutil
from collections.abc import Callable, Sequence
from importlib import metadata
from pathlib import Path

import pytest

from kvcache_core.conformance.members.sources import SourceIndex
from kvcache_core.conformance.results.model import CheckResult
from kvcache_core.conformance.runner import run_levels
from kvcache_core.conformance.targets.plugin_source import (
    CAPABILITY_COMPANION_NAMES,
    CAPABILITY_PROTOCOL_NAMES,
    static_specs,
)
from kvcache_core.conformance.targets.plugins import plugin_targets, source_plugin_targets
from kvcache_core.conformance.targets.resolve import resolve_targets
from kvcache_core.plugin_loader import POOL_ENTRY_POINT_GROUP
from kvcache_core.plugin_loader import entry_points as group_entry_points

ROOT = Path(__file__).resolve().parent.parent.parent
EXAMPLE = ROOT / "examples" / "kvcache-example-pool" / "kvcache_example_pool"
BUILTINS = ("dsa", "hisparse", "mamba", "mha", "mla", "swa")


def _timeless(results: Sequence[CheckResult]) -> list[CheckResult]:
    return [dataclasses.replace(r, duration_s=0.0) for r in results]


def _source_run(names: list[str], *, read: bool) -> tuple[object, list[CheckResult]]:
    index = SourceIndex()
    targets, errors = resolve_targets(names, against=None, index=index, read_plugins=read)
    return targets, _timeless(errors + run_levels(targets, ("source",), index=index))


def assert_same_both_ways(names: list[str] | None = None) -> list[tuple[str, str]]:
    """Both paths agree on targets, load errors and source results; returns the fallbacks."""
    fallbacks: list[tuple[str, str]] = []
    assert source_plugin_targets(names, fallbacks=fallbacks) == plugin_targets(names)
    assert _source_run(names or [], read=True) == _source_run(names or [], read=False)
    return fallbacks


def test_the_torch_free_twins_match_the_live_contract() -> None:
    from kvcache_core.contracts.spec import CAPABILITY_PROTOCOLS, Capability

    live = {c.name: (c.value, *_role_name(CAPABILITY_PROTOCOLS[c])) for c in Capability}
    assert dict(CAPABILITY_PROTOCOL_NAMES) == live
    from kvcache_core.contracts.spec import CAPABILITY_COMPANION_PROTOCOLS

    companions = {c.name: _role_name(e) for c, e in CAPABILITY_COMPANION_PROTOCOLS.items()}
    assert dict(CAPABILITY_COMPANION_NAMES) == companions


def _role_name(entry: tuple[str, type]) -> tuple[str, str]:
    return entry[0], entry[1].__name__


def test_every_builtin_plugin_is_read_without_falling_back() -> None:
    installed = {ep.name: ep for ep in entry_points()}
    for name in BUILTINS:
        specs = static_specs(installed[name])
        assert not isinstance(specs, str), (name, specs)
        assert [s.name for s in specs] == [name]


def test_all_installed_plugins_read_and_imported_agree() -> None:
    assert assert_same_both_ways() == []


@pytest.mark.parametrize("name", BUILTINS)
def test_each_builtin_plugin_read_and_imported_agree(name: str) -> None:
    assert assert_same_both_ways([name]) == []


def test_an_unknown_name_is_the_same_usage_error_both_ways() -> None:
    with pytest.raises(LookupError) as imported:
        plugin_targets(["no-such-pool"])
    with pytest.raises(LookupError) as read:
        source_plugin_targets(["no-such-pool"])
    assert str(read.value) == str(imported.value)


# -- fake plugins, installed as real distributions ----------------------------------------------

HEADER = """
from kvcache_core import Capability, PoolSpec, hookimpl, PagedSlotAllocator

class FakePool:
    def get_key_buffer(self, layer_id):
        return None

class FakeAllocator:
    def alloc(self, need_size):
        return None

def create(config):
    return FakePool(), FakeAllocator()
"""

PLAIN = (
    HEADER
    + """
@hookimpl
def kvcache_pool_specs():
    specs = [
        PoolSpec(name="plain-a", pool_class=FakePool, allocator_class=FakeAllocator,
                 factory=create, capabilities=frozenset({Capability.PAGED, Capability.OFFLOAD})),
        PoolSpec(name="plain-b", pool_class=FakePool, allocator_class=PagedSlotAllocator,
                 factory=create),
    ]
    return specs
"""
)

#: Each falls back for the reason named; the import path gives what it always gave.
FALLBACKS = {
    "comprehension": HEADER
    + """
@hookimpl
def kvcache_pool_specs():
    return [PoolSpec(name=n, pool_class=FakePool, allocator_class=FakeAllocator, factory=create)
            for n in ("c-one", "c-two")]
""",
    "computed": HEADER
    + """
CAPS = frozenset({Capability.OFFLOAD})

@hookimpl
def kvcache_pool_specs():
    return [PoolSpec(name="computed", pool_class=FakePool, allocator_class=FakeAllocator,
                     factory=create, capabilities=CAPS)]
""",
    "string_capability": HEADER
    + """
@hookimpl
def kvcache_pool_specs():
    return [PoolSpec(name="strcap", pool_class=FakePool, allocator_class=FakeAllocator,
                     factory=create, capabilities={"offload"})]
""",
    "rebound_class": HEADER
    + """
FakePool = FakeAllocator

@hookimpl
def kvcache_pool_specs():
    return [PoolSpec(name="rebound", pool_class=FakePool, allocator_class=FakeAllocator,
                     factory=create)]
""",
    "renamed_module": HEADER
    + """
class Renamed:
    __module__ = "elsewhere"

    def get_key_buffer(self, layer_id):
        return None

@hookimpl
def kvcache_pool_specs():
    return [PoolSpec(name="renamed", pool_class=Renamed, allocator_class=FakeAllocator,
                     factory=create)]
""",
    "unmarked": HEADER
    + """
def kvcache_pool_specs():
    return [PoolSpec(name="unmarked", pool_class=FakePool, allocator_class=FakeAllocator,
                     factory=create)]
""",
    "raising": HEADER
    + """
@hookimpl
def kvcache_pool_specs():
    return [PoolSpec(name="bad name!", pool_class=FakePool, allocator_class=FakeAllocator,
                     factory=create)]
""",
    "not_a_class": HEADER
    + """
@hookimpl
def kvcache_pool_specs():
    return [PoolSpec(name="nocls", pool_class=create, allocator_class=FakeAllocator,
                     factory=create)]
""",
    "broken_syntax": "def kvcache_pool_specs(:\n",
    # the class statement is not what the name holds at hook time: a loop rebinds it
    "rebound_in_loop": HEADER
    + """
for FakePool in (FakeAllocator,):
    pass

@hookimpl
def kvcache_pool_specs():
    return [PoolSpec(name="looped", pool_class=FakePool, allocator_class=FakeAllocator,
                     factory=create)]
""",
    # a decorator that returns something else replaces the class its statement reads as
    "replaced_by_decorator": HEADER
    + """
def swap(cls):
    return FakeAllocator

@swap
class Swapped:
    def get_key_buffer(self, layer_id):
        return None

@hookimpl
def kvcache_pool_specs():
    return [PoolSpec(name="swapped", pool_class=Swapped, allocator_class=FakeAllocator,
                     factory=create)]
""",
}


@pytest.fixture
def installed(fake_site: Callable[..., Path]) -> Callable[[str, str], None]:
    def install(name: str, source: str) -> None:
        module = f"kvsrc_{name}"
        fake_site(f"kvsrc-{name}", entry_points={name: module}, modules={module: source})
        importlib.invalidate_caches()

    return install


def _only(name: str) -> list[metadata.EntryPoint]:
    return [ep for ep in entry_points() if ep.name == name]


def entry_points() -> list[metadata.EntryPoint]:
    return group_entry_points(POOL_ENTRY_POINT_GROUP)


def test_a_plain_hook_with_a_local_list_is_read(installed: Callable[[str, str], None]) -> None:
    installed("plain", PLAIN)
    (ep,) = _only("plain")
    specs = static_specs(ep)
    assert not isinstance(specs, str), specs
    assert [(s.name, s.capabilities) for s in specs] == [
        ("plain-a", ("offload", "paged")),
        ("plain-b", ()),
    ]
    assert assert_same_both_ways(["plain"]) == []
    assert assert_same_both_ways(["plain-b"]) == []  # a pool name


@pytest.mark.parametrize("name", sorted(FALLBACKS))
def test_what_cannot_be_read_is_imported_with_the_same_result(
    installed: Callable[[str, str], None], name: str
) -> None:
    installed(name, FALLBACKS[name])
    (ep,) = _only(name)
    assert isinstance(static_specs(ep), str)
    fallbacks = assert_same_both_ways([name])
    assert [plugin for plugin, _why in fallbacks] == [name]


def test_load_errors_of_fallen_back_plugins_are_reported_as_before(
    installed: Callable[[str, str], None],
) -> None:
    installed("broken_syntax", FALLBACKS["broken_syntax"])
    installed("unmarked", FALLBACKS["unmarked"])
    _targets, errors = source_plugin_targets(["broken_syntax", "unmarked"])
    assert [e.findings[0].rule for e in errors] == ["load-error", "load-error"]
    assert "without the @hookimpl marker" in errors[1].detail


def test_the_example_third_party_plugin_is_read(
    fake_site: Callable[..., Path], tmp_path: Path
) -> None:
    site = fake_site(
        "kvcache-example-pool", entry_points={"int8-mha": "kvcache_example_pool"}, modules={}
    )
    shutil.copytree(EXAMPLE, site / EXAMPLE.name)
    importlib.invalidate_caches()
    (ep,) = _only("int8-mha")
    specs = static_specs(ep)
    assert not isinstance(specs, str), specs
    try:
        assert assert_same_both_ways(["int8-mha"]) == []
    finally:
        import sys

        for module in [m for m in sys.modules if m.split(".")[0] == EXAMPLE.name]:
            del sys.modules[module]


@pytest.mark.parametrize("package", ["kvcache_core", "kvcache_core.contracts"])
def test_names_exported_lazily_resolve_in_source_to_the_live_classes(
    package: str, tmp_path: Path
) -> None:
    """Plugins import from ``kvcache_core``, whose names are bound at run time through
    ``_LAZY`` and for readers through the ``TYPE_CHECKING`` block: the two must agree."""
    live_package = importlib.import_module(package)
    importer = tmp_path / "importer.py"
    names = [n for n in live_package.__all__ if isinstance(getattr(live_package, n), type)]
    importer.write_text(f"from {package} import {', '.join(names)}\n", encoding="utf-8")
    index = SourceIndex()
    module = index.load_file(str(importer))
    for name in names:
        live = getattr(live_package, name)
        found = index.resolve_name(module, name)
        assert found is not None and found.qualname == f"{live.__module__}.{live.__qualname__}"
