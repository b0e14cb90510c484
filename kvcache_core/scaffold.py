"""The files ``kvcache new-pool`` writes, as text with ``__NAME__``-style placeholders.

Why templates in a module and not package data: they travel with every install of kvcache
(wheel, editable, a bare checkout on ``PYTHONPATH``) without a data-file lookup, and a test
renders, installs and checks them end to end, so they cannot rot unnoticed.

The pool they describe uses only ``kvcache_core``'s public names (``LayerRows``,
``PagedSlotAllocator``, ``check_slots``, ``check_rows``, ``expect_snapshot``, ...); a test
enforces that for the scaffold and every example.
"""

from __future__ import annotations

__all__ = ["KINDS", "render"]

#: Kinds ``new-pool`` can scaffold. Others (mla, dsa, swa, mamba, hisparse) are "not yet".
KINDS = ("mha",)

_PYPROJECT = """\
[build-system]
requires = ["setuptools>=68"]
build-backend = "setuptools.build_meta"

[project]
name = "__NAME__"
version = "0.1.0"
description = "A kvcache pool plugin: __NAME__"
readme = "README.md"
requires-python = ">=3.10"
dependencies = ["kvcache"]

[project.optional-dependencies]
test = ["pytest"]

# How kvcache finds the pool: discovery loads every entry point of this group.
[project.entry-points."kvcache.pools"]
__NAME__ = "__MODULE__"

[tool.setuptools]
packages = ["__MODULE__"]

[tool.pytest.ini_options]
testpaths = ["tests"]
# torch warns at import when NumPy is missing; neither kvcache nor this pool needs NumPy.
filterwarnings = ["ignore:Failed to initialize NumPy:UserWarning"]
"""

_POOL_MHA = '''\
"""``__NAME__``: an MHA pool, K and V of each layer as ``[size + page_size, H, D]``.

Scaffolded by ``kvcache new-pool``. It already satisfies the contract (docs/contract.md) and
passes ``kvcache check __NAME__`` at every level; change the storage, keep the rules:

- check every input before writing anything (``check_slots``, ``check_rows``,
  ``expect_snapshot``), so a bad call leaves the pool untouched;
- accept ``loc`` as a bare tensor or a ``KVWriteLoc`` (``unwrap_write_loc``);
- layer ids are global: subtract ``start_layer``;
- ``get_cpu_copy`` copies every per-slot buffer; ``load_cpu_copy`` validates the snapshot first.

Import only ``kvcache_core``'s public names: they are what every checker level can see.
"""

from __future__ import annotations

import torch

from kvcache_core import (
    Capability,
    InvalidLayerError,
    KVSnapshot,
    KVWriteLoc,
    LayerLike,
    LayerRows,
    PagedSlotAllocator,
    PoolConfig,
    PoolSpec,
    check_rows,
    check_slots,
    expect_snapshot,
    hookimpl,
    unwrap_write_loc,
)

__all__ = ["__CLASS__", "create", "kvcache_pool_specs"]


class __CLASS__:
    """Per-layer K and V rows; slot 0 is the padding slot."""

    kind = "__NAME__"

    def __init__(self, config: PoolConfig) -> None:
        self.size = config.size
        self.page_size = config.page_size
        self.dtype = config.dtype
        self.device = config.device
        self.layer_num = config.layer_num
        self.start_layer = config.start_layer
        self.head_num = config.head_num
        self.head_dim = config.head_dim
        rows = config.size + config.page_size
        shape = (config.head_num, config.head_dim)
        self._k, self._v = (
            LayerRows(
                config.layer_num,
                rows,
                shape,
                config.dtype,
                config.device,
                page_size=config.page_size,  # whole-page offloads copy a page at a time
            )
            for _ in range(2)
        )

    def _local(self, layer_id: int) -> int:
        local = layer_id - self.start_layer
        if not 0 <= local < self.layer_num:
            last = self.start_layer + self.layer_num - 1
            raise InvalidLayerError(f"layer {layer_id} is not in {self.start_layer}..{last}")
        return local

    def get_key_buffer(self, layer_id: int) -> torch.Tensor:
        return self._k.layer(self._local(layer_id))

    def get_value_buffer(self, layer_id: int) -> torch.Tensor:
        return self._v.layer(self._local(layer_id))

    def get_kv_buffer(self, layer_id: int) -> tuple[torch.Tensor, torch.Tensor]:
        return self.get_key_buffer(layer_id), self.get_value_buffer(layer_id)

    def get_kv_size_bytes(self) -> int:
        return self._k.nbytes + self._v.nbytes

    def set_kv_buffer(
        self,
        layer: LayerLike,
        loc: KVWriteLoc | torch.Tensor,
        cache_k: torch.Tensor,
        cache_v: torch.Tensor,
        k_scale: float | None = None,
        v_scale: float | None = None,
    ) -> None:
        local = self._local(layer.layer_id)
        slots, _ = unwrap_write_loc(loc)
        slots = check_slots(slots, limit=self.size + self.page_size, allow_zero=True, name="loc")
        shape = (self.head_num, self.head_dim)
        k = check_rows(cache_k, name="cache_k", rows=slots.numel(), row_shape=shape)
        v = check_rows(cache_v, name="cache_v", rows=slots.numel(), row_shape=shape)
        slots = slots.to(self.device)
        # LayerRows.to_storage applies the scale the way the contract says and never in place.
        self._k.write(local, slots, self._k.to_storage(k, k_scale))
        self._v.write(local, slots, self._v.to_storage(v, v_scale))

    def get_cpu_copy(
        self, indices: torch.Tensor, mamba_indices: torch.Tensor | None = None
    ) -> KVSnapshot:
        """Host copy of ``indices``; ``mamba_indices`` is accepted and ignored (no state)."""
        slots = check_slots(indices, limit=self.size + self.page_size, allow_duplicates=False)
        slots = slots.to(self.device)
        parts = {"k": self._k.gather(slots), "v": self._v.gather(slots)}
        return KVSnapshot(self.kind, self.dtype, slots.numel(), parts)

    def load_cpu_copy(
        self,
        snapshot: KVSnapshot,
        indices: torch.Tensor,
        mamba_indices: torch.Tensor | None = None,
    ) -> None:
        """Write a snapshot back at new ``indices``; ``mamba_indices`` is ignored."""
        slots = check_slots(indices, limit=self.size + self.page_size, allow_duplicates=False)
        n = slots.numel()
        layouts = {"k": self._k.part_layout(n), "v": self._v.part_layout(n)}
        expect_snapshot(snapshot, kind=self.kind, dtype=self.dtype, token_count=n, parts=layouts)
        slots = slots.to(self.device)
        self._k.scatter(slots, snapshot.parts["k"])
        self._v.scatter(slots, snapshot.parts["v"])


def create(config: PoolConfig) -> tuple[__CLASS__, PagedSlotAllocator]:
    pool = __CLASS__(config)
    return pool, PagedSlotAllocator(config.size, config.page_size, pool)


@hookimpl
def kvcache_pool_specs() -> list[PoolSpec]:
    return [
        PoolSpec(
            name="__NAME__",
            pool_class=__CLASS__,
            allocator_class=PagedSlotAllocator,
            factory=create,
            capabilities=frozenset({Capability.OFFLOAD, Capability.PAGED}),
            description="__NAME__ (scaffolded by kvcache new-pool)",
        )
    ]
'''

_TEST = '''\
"""The behaviour battery on this pool, one test per check, from this package's own suite."""

from __future__ import annotations

import pytest

from kvcache_core.testing import check_conformance, conformance_cases


@pytest.mark.parametrize(("spec", "check_id"), conformance_cases("__NAME__"))
def test_conformance(spec, check_id):
    check_conformance(spec, check_id)
'''

_WORKFLOW = """\
name: kvcache
on: [push, pull_request]
jobs:
  check:
    runs-on: ubuntu-latest
    steps:
      - uses: actions/checkout@v4
      - uses: actions/setup-python@v5
        with: {python-version: "3.11"}
      - run: pip install -e ".[test]" --extra-index-url https://download.pytorch.org/whl/cpu
      - run: kvcache check __NAME__ --format github
      - run: pytest -q
"""

_README = """\
# __NAME__

A kvcache pool plugin (kind: __KIND__), scaffolded by `kvcache new-pool __NAME__`.

```console
$ pip install -e ".[test]"
$ kvcache list                # __NAME__ is listed, accepted
$ kvcache check __NAME__      # every level: source, signature, types, behaviour
$ pytest                      # the behaviour battery, one test per check
```

The pool is in `__MODULE__/__init__.py`; the entry point that registers it is in
`pyproject.toml` (`[project.entry-points."kvcache.pools"]`). CI (`.github/workflows/kvcache.yml`)
runs the same commands on every push.
"""

_GITIGNORE = """\
__pycache__/
*.egg-info/
build/
"""


def _class_name(module: str) -> str:
    return "".join(part.capitalize() for part in module.split("_") if part) + "Pool"


def render(name: str, module: str, kind: str) -> dict[str, str]:
    """``{relative path: text}`` of the package for pool ``name`` in importable ``module``."""
    if kind not in KINDS:
        raise ValueError(f"kind {kind!r} is not scaffolded yet (supported: {', '.join(KINDS)})")
    files = {
        "pyproject.toml": _PYPROJECT,
        f"{module}/__init__.py": _POOL_MHA,
        "tests/test_conformance.py": _TEST,
        ".github/workflows/kvcache.yml": _WORKFLOW,
        "README.md": _README,
        ".gitignore": _GITIGNORE,
    }
    values = {
        "__NAME__": name,
        "__MODULE__": module,
        "__CLASS__": _class_name(module),
        "__KIND__": kind,
    }
    out: dict[str, str] = {}
    for path, text in files.items():
        for key, value in values.items():
            text = text.replace(key, value)
        out[path] = text
    return out
