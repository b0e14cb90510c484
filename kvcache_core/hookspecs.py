"""The pluggy hook specifications of kvcache (project name ``kvcache``).

One hook is enough: a plugin module returns the ``PoolSpec``s it provides. Keeping the hook
surface this small is what lets the contract evolve without breaking every plugin's import.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import pluggy

if TYPE_CHECKING:  # annotations only: importing the markers must not import torch
    from .contracts.spec import PoolSpec
    from .stores.spec import StoreSpec

__all__ = ["PROJECT_NAME", "hookimpl", "hookspec", "kvcache_pool_specs", "kvcache_store_specs"]

PROJECT_NAME = "kvcache"
# The entry-point groups ("kvcache.pools", "kvcache.stores") are named once, in plugin_loader,
# which loads plugins by them; this module only declares the hooks.

hookspec = pluggy.HookspecMarker(PROJECT_NAME)
hookimpl = pluggy.HookimplMarker(PROJECT_NAME)
"""Marks a plugin's ``kvcache_pool_specs()`` hook, which returns a list of
[`PoolSpec`][kvcache_core.PoolSpec].

pluggy only calls functions carrying the marker of its own project, so a plain function named
``kvcache_pool_specs`` is not picked up (discovery rejects such a plugin and says why):

    from kvcache_core import PoolSpec, hookimpl

    @hookimpl
    def kvcache_pool_specs() -> list[PoolSpec]:
        return [PoolSpec(name="my-pool", ...)]
"""


@hookspec
def kvcache_pool_specs() -> list[PoolSpec]:  # type: ignore[empty-body]
    """Return the pool kinds this plugin provides."""


@hookspec
def kvcache_store_specs() -> list[StoreSpec]:  # type: ignore[empty-body]
    """Return the snapshot stores this plugin provides (read by
    [`discover_stores`][kvcache_core.stores.discover_stores], group ``kvcache.stores``)."""
