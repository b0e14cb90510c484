"""What the tests of the pytest plugin and of its guide share: a plugin with broken pools,
and installing a module as a real distribution (a ``.dist-info`` with entry points)."""

from __future__ import annotations

from pathlib import Path

PLUGIN = "kvcache_core.pytest_plugin"

GALLERY_PLUGIN = """
from kvcache_core import Capability, PoolSpec, check_rows, check_slots, hookimpl, unwrap_write_loc
from kvcache_plugins.allocators import PagedSlotAllocator
from kvcache_plugins.mha import MHATokenToKVPool, create as create_mha


class AliasPool(MHATokenToKVPool):
    # Checks its input like a careful pool, then writes through an alias of `loc`: only
    # write-forms-agree can tell.

    def set_kv_buffer(self, layer, loc, cache_k, cache_v, k_scale=None, v_scale=None):
        key, value = self.get_kv_buffer(layer.layer_id)
        full, _ = unwrap_write_loc(loc)
        n = check_slots(full, limit=self.rows, name="loc", allow_zero=True).numel()
        k = check_rows(cache_k, name="cache_k", rows=n, row_shape=tuple(key.shape[1:]))
        v = check_rows(cache_v, name="cache_v", rows=n, row_shape=tuple(value.shape[1:]))
        slots = loc  # never unwrapped: still a KVWriteLoc when one was passed
        key[slots] = self._k.to_storage(k, k_scale)  # scales applied as engines do
        value[slots] = self._v.to_storage(v, v_scale)


def create_alias(config):
    pool, _ = create_mha(config)
    pool.__class__ = AliasPool
    return pool, PagedSlotAllocator(config.size, config.page_size, pool)


def spec(name, factory, pool_class, **kw):
    caps = frozenset({Capability.OFFLOAD, Capability.PAGED})
    return PoolSpec(name=name, pool_class=pool_class, allocator_class=PagedSlotAllocator,
                    factory=factory, capabilities=caps, **kw)


@hookimpl
def kvcache_pool_specs():
    return [
        spec("brk-alias", create_alias, AliasPool),
        spec("brk-specxfail", create_alias, AliasPool,
             expected_failures={"write-forms-agree": "aliases loc, tracked in #7"}),
        spec("brk-tomlxfail", create_alias, AliasPool),
        spec("brk-stale", create_mha, MHATokenToKVPool,
             expected_failures={"write-forms-agree": "fixed long ago"}),
    ]
"""


def install(site: Path, dist: str, group: str, entry_points: dict[str, str]) -> None:
    """A real installed distribution: ``.dist-info`` with METADATA and entry_points.txt."""
    info = site / f"{dist.replace('-', '_')}-1.0.dist-info"  # the stem names the dist
    info.mkdir(parents=True, exist_ok=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {dist}\nVersion: 1.0\n")
    eps = "".join(f"{name} = {target}\n" for name, target in entry_points.items())
    with (info / "entry_points.txt").open("a") as fh:
        fh.write(f"[{group}]\n{eps}")
