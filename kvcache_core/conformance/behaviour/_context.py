"""What a check gets: the spec under test, a small CPU config, and a way to write reproductions.

Why a default config per capability set: the battery must build tiny pools of any kind through
the plugin's own factory without the author writing anything; a plugin whose pool needs other
settings declares ``PoolSpec.behaviour_config`` and the battery uses that instead.
"""

from __future__ import annotations

import dataclasses
import sys
from dataclasses import dataclass, field
from typing import Any

import torch

from ...contracts.spec import Capability, PoolConfig, PoolSpec

__all__ = [
    "DEFAULT_TIMEOUT_S",
    "CheckContext",
    "Layer",
    "config_source",
    "default_config",
    "factory_source",
]

#: Seconds one check may run before it counts as hung. The whole battery takes seconds.
DEFAULT_TIMEOUT_S = 30.0


@dataclass(frozen=True)
class Layer:
    """The smallest ``LayerLike``: what the battery passes as ``layer``."""

    layer_id: int


def default_config(spec: PoolSpec) -> PoolConfig:
    """A small float32 CPU config fitting the capabilities ``spec`` declares."""
    if spec.behaviour_config is not None:
        return spec.behaviour_config
    caps = spec.capabilities
    fields: dict[str, Any] = {
        "size": 32,
        "layer_num": 2,
        "head_num": 2,
        "head_dim": 4,
        "page_size": 4 if Capability.PAGED in caps else 1,
        "dtype": torch.float32,
    }
    if caps & {Capability.MLA, Capability.INDEXER, Capability.HISPARSE}:
        fields.update(kv_lora_rank=8, qk_rope_head_dim=4, index_head_dim=8)
    if Capability.SLIDING_WINDOW in caps:
        fields.update(layer_num=3, swa_layer_ids=(1,), swa_size=16)
    if Capability.MAMBA_STATE in caps:
        fields.update(
            layer_num=3,
            mamba_layer_ids=(1,),
            mamba_size=4,
            conv_state_shapes=((2, 3),),
            temporal_state_shape=(2, 2),
        )
    return PoolConfig(**fields)


def _value_source(value: object) -> str:
    if isinstance(value, torch.dtype):
        return str(value)  # "torch.float32"
    if isinstance(value, torch.device):
        return repr(str(value))
    if isinstance(value, dict) or hasattr(value, "items"):
        return repr(dict(value))  # type: ignore[call-overload]
    return repr(value)


def config_source(config: PoolConfig) -> str:
    """``PoolConfig(...)`` as Python source, naming only the fields that differ from defaults."""
    parts = [f"size={config.size}", f"layer_num={config.layer_num}"]
    for f in dataclasses.fields(PoolConfig):
        if f.name in ("size", "layer_num"):
            continue
        value = getattr(config, f.name)
        if f.default is not dataclasses.MISSING:
            default: object = f.default
        elif f.default_factory is not dataclasses.MISSING:
            default = f.default_factory()
        else:  # pragma: no cover - every other field has a default
            default = None
        if f.name == "options" and not value:
            continue
        if value != default:
            parts.append(f"{f.name}={_value_source(value)}")
    return f"PoolConfig({', '.join(parts)})"


@dataclass
class CheckContext:
    """Everything one check run needs; a fresh context per check, so checks never share state.

    ``build()`` makes a new (pool, allocator) pair through the plugin's own factory (overriding
    config fields when a check needs, say, page size 1). ``reproduction(lines)`` turns the
    check's steps into a runnable snippet for the finding.
    """

    spec: PoolSpec
    config: PoolConfig
    seed: int = 0
    timeout_s: float = DEFAULT_TIMEOUT_S
    built: list[tuple[Any, Any]] = field(default_factory=list)

    @property
    def capabilities(self) -> frozenset[Capability]:
        return self.spec.capabilities

    def config_with(self, **overrides: Any) -> PoolConfig:
        return dataclasses.replace(self.config, **overrides) if overrides else self.config

    def build(self, **overrides: Any) -> tuple[Any, Any]:
        pool, allocator = self.spec.factory(self.config_with(**overrides))
        self.built.append((pool, allocator))
        return pool, allocator

    def generator(self, salt: int = 0) -> torch.Generator:
        """A seeded CPU generator: every check draws the same values on every run."""
        return torch.Generator().manual_seed(self.seed * 1_000_003 + salt)

    def reproduction(self, steps: list[str], **overrides: Any) -> str:
        """A runnable snippet: build this pool the way the check did, then ``steps``.

        The snippet names ``config``, ``factory`` (call ``factory(config)`` for another pool),
        ``pool``, ``allocator`` and ``Layer``. ``factory`` is the spec's own factory imported by
        name when it is a module-level function (so the snippet also runs for a spec that is not
        installed, such as a test's broken pool), else the installed plugin's spec as its hook
        returns it (``installed_spec``: a plugin that discovery rejects still reproduces).
        """
        head = [
            "import torch",
            "from kvcache_core import KVWriteLoc, PoolConfig, discover",
            "",
            "class Layer:",
            "    def __init__(self, layer_id): self.layer_id = layer_id",
            "",
            *factory_source(self.spec),
            f"config = {config_source(self.config_with(**overrides))}",
            "pool, allocator = factory(config)",
        ]
        return "\n".join(head + steps)


def factory_source(spec: PoolSpec) -> list[str]:
    """Source lines binding ``factory`` to ``spec.factory``, the most direct way available."""
    module_name = getattr(spec.factory, "__module__", None)
    qualname = getattr(spec.factory, "__qualname__", "")
    module = sys.modules.get(module_name) if isinstance(module_name, str) else None
    if (
        module is not None
        and qualname.isidentifier()
        and getattr(module, qualname, None) is (spec.factory)
    ):
        return [f"from {module_name} import {qualname} as factory"]
    return [
        "from kvcache_core.conformance.targets.plugins import installed_spec",
        f"factory = installed_spec({spec.name!r}).factory",
    ]
