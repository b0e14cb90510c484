"""Inherits a drifted override from another file: the finding points at ``dsa_sub``."""

from __future__ import annotations

from .dsa_sub import DSALikePool as Parent


class DSAGrandchild(Parent):
    label = "grandchild"
