"""Fixtures shared by the whole suite."""

from __future__ import annotations

import sys
import textwrap
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

# Imported here, before any test runs, so that pytester's ``sys.modules`` snapshot (taken per
# test) already holds torch: torch cannot be imported twice in one process, and a test file
# whose first test imports it lazily (the CLI keeps torch out of its start-up) would otherwise
# have it removed at that test's teardown and imported again by the next ("bad call flags").
import torch  # noqa: F401
from hypothesis import settings

# Likewise the contract and the built-in plugins: a module imported for the first time inside a
# pytester test is dropped at its teardown and imported afresh by the next, and a second
# ``kvcache_core.contracts.spec`` makes every built-in spec "not a PoolSpec" to the first.
import kvcache_core.conformance.behaviour
import kvcache_core.conformance.targets.plugins
import kvcache_core.discovery  # noqa: F401
import kvcache_plugins.dsa
import kvcache_plugins.hisparse
import kvcache_plugins.mamba
import kvcache_plugins.mha
import kvcache_plugins.mla
import kvcache_plugins.swa  # noqa: F401

# Bounded shrinking inside the suite: a broken change must fail in seconds, not after
# hypothesis's default five minutes of shrinking. ``--hypothesis-profile=thorough`` lifts it.
settings.register_profile("kvcache-suite", deadline=None, max_examples=100)
settings.register_profile("thorough", deadline=None, max_examples=1000)
settings.load_profile("kvcache-suite")
#: Seconds hypothesis may spend shrinking one failure in the suite (its own default is 300).
SUITE_SHRINK_SECONDS = 10


def _bound_shrinking() -> None:
    """Hypothesis has no public setting for shrink time; its engine constant is the one knob
    (the behaviour battery bounds it the same way). Left alone if a version drops it."""
    from hypothesis.internal.conjecture import engine

    if isinstance(getattr(engine, "MAX_SHRINKING_SECONDS", None), (int, float)):
        engine.MAX_SHRINKING_SECONDS = SUITE_SHRINK_SECONDS  # type: ignore[assignment]


_bound_shrinking()


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
