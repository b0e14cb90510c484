"""Fixtures shared by the whole suite."""

from __future__ import annotations

import sys
import textwrap
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest


@dataclass(frozen=True)
class Layer:
    """The smallest thing a pool accepts as ``layer``: an object with an integer layer_id."""

    layer_id: int


@pytest.fixture
def fake_site(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Callable[..., Path]]:
    """Install fake distributions on ``sys.path``: real ``.dist-info`` + ``entry_points.txt``.

    ``make(dist_name, entry_points={"ep": "module"}, modules={"module": "source"})``. Nothing in
    ``importlib.metadata`` is mocked: discovery sees these exactly as installed packages.
    """
    site = tmp_path / "site"
    site.mkdir()
    monkeypatch.syspath_prepend(str(site))
    created: list[str] = []

    def make(
        dist: str,
        *,
        entry_points: dict[str, str],
        modules: dict[str, str],
        version: str = "1.0",
        group: str = "kvcache.pools",
    ) -> Path:
        info = site / f"{dist.replace('-', '_')}-{version}.dist-info"
        info.mkdir()
        (info / "METADATA").write_text(
            f"Metadata-Version: 2.1\nName: {dist}\nVersion: {version}\n", encoding="utf-8"
        )
        eps = "\n".join(f"{name} = {target}" for name, target in entry_points.items())
        (info / "entry_points.txt").write_text(f"[{group}]\n{eps}\n", encoding="utf-8")
        for module, source in modules.items():
            (site / f"{module}.py").write_text(textwrap.dedent(source), encoding="utf-8")
            created.append(module)
        return site

    yield make
    for module in created:
        sys.modules.pop(module, None)
