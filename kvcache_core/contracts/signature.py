"""A neutral description of a method signature: the data the published contracts are written in.

``contracts/history.py`` spells every published contract version as ``MethodSig`` values, so
the types live here, beside the contract. Reading a signature from source (``ast``) or from a
live object (``inspect``) is the checker's job and lives with it
(``kvcache_core.conformance.members.signatures``).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

__all__ = ["MethodSig", "Param", "ParamKind"]


class ParamKind(str, enum.Enum):
    POSITIONAL_ONLY = "positional-only"
    POSITIONAL_OR_KEYWORD = "positional-or-keyword"
    VAR_POSITIONAL = "var-positional"
    KEYWORD_ONLY = "keyword-only"
    VAR_KEYWORD = "var-keyword"

    def __str__(self) -> str:
        return self.value


@dataclass(frozen=True)
class Param:
    """One parameter. ``default`` is the default's source text, or None when required."""

    name: str
    kind: ParamKind = ParamKind.POSITIONAL_OR_KEYWORD
    default: str | None = None
    annotation: str | None = None

    @property
    def required(self) -> bool:
        return self.default is None and self.kind not in (
            ParamKind.VAR_POSITIONAL,
            ParamKind.VAR_KEYWORD,
        )

    @property
    def positional(self) -> bool:
        return self.kind in (ParamKind.POSITIONAL_ONLY, ParamKind.POSITIONAL_OR_KEYWORD)

    def render(self) -> str:
        """Source text of this parameter, e.g. ``mamba_indices: Tensor | None = None``."""
        prefix = {ParamKind.VAR_POSITIONAL: "*", ParamKind.VAR_KEYWORD: "**"}.get(self.kind, "")
        text = prefix + self.name
        if self.annotation:
            text += f": {self.annotation}"
            if self.default is not None:
                text += f" = {self.default}"
        elif self.default is not None:
            text += f"={self.default}"
        return text


@dataclass(frozen=True)
class MethodSig:
    """A method's parameters *after* ``self``, its return annotation and where it is defined."""

    name: str
    params: tuple[Param, ...]
    returns: str | None = None
    path: str | None = None
    line: int | None = None

    def render(self) -> str:
        parts: list[str] = []
        seen_kw_marker = False
        for i, p in enumerate(self.params):
            if (
                p.kind is ParamKind.KEYWORD_ONLY
                and not seen_kw_marker
                and not any(q.kind is ParamKind.VAR_POSITIONAL for q in self.params[:i])
            ):
                parts.append("*")
                seen_kw_marker = True
            parts.append(p.render())
            if p.kind is ParamKind.POSITIONAL_ONLY and (
                i + 1 == len(self.params)
                or self.params[i + 1].kind is not ParamKind.POSITIONAL_ONLY
            ):
                parts.append("/")
        ret = f" -> {self.returns}" if self.returns else ""
        return f"{self.name}(self{''.join(', ' + p for p in parts)}){ret}"

    def get(self, name: str) -> Param | None:
        return next((p for p in self.params if p.name == name), None)

    def index(self, name: str) -> int:
        return next(i for i, p in enumerate(self.params) if p.name == name)
