"""Classes mypy cannot fully see without site-packages (type-checked by the tests, never run)."""

from __future__ import annotations

from some_gpu_only_package import FastPoolBase  # type: ignore[import-not-found]


class PoolOnUnknownBase(FastPoolBase):  # type: ignore[misc]
    """Everything it has comes from a base mypy cannot find."""


AliasedAway = FastPoolBase
