"""Writes a file when imported (to ``$KVCACHE_SIDE_EFFECT_FILE``): the source level never may."""

from __future__ import annotations

import os

from ._reference import ReferencePool

_MARKER = os.environ.get("KVCACHE_SIDE_EFFECT_FILE")
if _MARKER:
    with open(_MARKER, "w", encoding="utf-8") as fh:
        fh.write("imported\n")


class SideEffectPool(ReferencePool):
    label = "imported on purpose by the signature level only"
