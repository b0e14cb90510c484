"""Every published contract version, as data, so a finding can say *which* contract an
implementation was written against ("matches contract 1; contract 2 added `mamba_indices`").

Version 2 is also what the Protocols in ``pool.py`` say; a test keeps the two in step.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType

from .signature import MethodSig, Param, ParamKind

__all__ = ["CONTRACT_VERSION", "VERSIONS", "ContractVersion"]

CONTRACT_VERSION = 2
"""The contract version this kvcache release defines (here, with the history, and not in
``spec``, so that source-only commands can name it without importing torch).

A [`PoolSpec`][kvcache_core.PoolSpec] declares the version it was written against, so
discovery can tell a plugin written for an older contract (and say what changed since, from
[`VERSIONS`][kvcache_core.VERSIONS]) from one that simply drifted.
"""

_KW = ParamKind.POSITIONAL_OR_KEYWORD
_T = "torch.Tensor"


def _m(name: str, returns: str, *params: Param) -> MethodSig:
    return MethodSig(name=name, params=params, returns=returns)


_LAYER_GETTERS = {
    "get_key_buffer": _m("get_key_buffer", _T, Param("layer_id", _KW, None, "int")),
    "get_value_buffer": _m("get_value_buffer", _T, Param("layer_id", _KW, None, "int")),
    "get_kv_buffer": _m("get_kv_buffer", f"tuple[{_T}, {_T}]", Param("layer_id", _KW, None, "int")),
    "get_kv_size_bytes": _m("get_kv_size_bytes", "int"),
}


def _set_kv_buffer(loc_annotation: str) -> MethodSig:
    return _m(
        "set_kv_buffer",
        "None",
        Param("layer", _KW, None, "LayerLike"),
        Param("loc", _KW, None, loc_annotation),
        Param("cache_k", _KW, None, _T),
        Param("cache_v", _KW, None, _T),
        Param("k_scale", _KW, "None", "float | None"),
        Param("v_scale", _KW, "None", "float | None"),
    )


@dataclass(frozen=True)
class ContractVersion:
    """One published contract: its methods, and what changed from the version before."""

    number: int
    methods: Mapping[str, MethodSig]
    changes: Mapping[str, str]


_V1 = ContractVersion(
    number=1,
    methods=MappingProxyType(
        {
            **_LAYER_GETTERS,
            "set_kv_buffer": _set_kv_buffer(_T),
            "get_cpu_copy": _m("get_cpu_copy", "KVSnapshot", Param("indices", _KW, None, _T)),
            "load_cpu_copy": _m(
                "load_cpu_copy",
                "None",
                Param("snapshot", _KW, None, "KVSnapshot"),
                Param("indices", _KW, None, _T),
            ),
        }
    ),
    changes=MappingProxyType({}),
)

_V2 = ContractVersion(
    number=2,
    methods=MappingProxyType(
        {
            **_LAYER_GETTERS,
            "set_kv_buffer": _set_kv_buffer(f"KVWriteLoc | {_T}"),
            "get_cpu_copy": _m(
                "get_cpu_copy",
                "KVSnapshot",
                Param("indices", _KW, None, _T),
                Param("mamba_indices", _KW, "None", f"{_T} | None"),
            ),
            "load_cpu_copy": _m(
                "load_cpu_copy",
                "None",
                Param("snapshot", _KW, None, "KVSnapshot"),
                Param("indices", _KW, None, _T),
                Param("mamba_indices", _KW, "None", f"{_T} | None"),
            ),
        }
    ),
    changes=MappingProxyType(
        {
            "get_cpu_copy": "contract 2 added `mamba_indices: torch.Tensor | None = None`",
            "load_cpu_copy": "contract 2 added `mamba_indices: torch.Tensor | None = None`",
            "set_kv_buffer": "contract 2 widened `loc` to `KVWriteLoc | torch.Tensor`",
        }
    ),
)

VERSIONS: Mapping[int, ContractVersion] = MappingProxyType({1: _V1, 2: _V2})
"""Every published contract version by number: its method signatures and what changed.

Kept as data, not old Protocol classes, so the checker can say "matches contract 1" about an
implementation written before a change, and point at the change, instead of only "drifted".
"""
