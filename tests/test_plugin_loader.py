"""One plugin loader (``kvcache_core.plugin_loader``) under pool discovery, store discovery and
the checker: the same broken plugin gets the same one-line reason from each, and loading it
costs neither torch nor pluggy until a plugin is imported."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from kvcache_core import discover
from kvcache_core.conformance.targets.plugins import plugin_targets
from kvcache_core.plugin_loader import STORE_ENTRY_POINT_GROUP
from kvcache_core.stores import discover_stores

BROKEN = {
    "at-import": "raise RuntimeError('no device here')\n",
    "exits": "import sys\nsys.exit('plugin gave up')\n",
    "unmarked": "def kvcache_pool_specs():\n    return []\n",
    "junk": "from kvcache_core import hookimpl\n\n@hookimpl\ndef kvcache_pool_specs():\n"
    "    return 5\n",
    "bare": "from kvcache_core import PoolSpec, hookimpl\n\n@hookimpl\ndef kvcache_pool_specs():\n"
    "    return PoolSpec\n",
}


@pytest.mark.parametrize("case", sorted(BROKEN))
def test_discovery_and_the_checker_give_one_reason(
    fake_site: Callable[..., Path], case: str
) -> None:
    name = f"kvload_{case.replace('-', '_')}"
    fake_site(f"kv-load-{case}", entry_points={name: name}, modules={name: BROKEN[case]})
    (rejection,) = [r for r in discover(allow=[name]).rejected if r.plugin.name == name]
    assert (rejection.plugin.distribution, rejection.plugin.version) == (f"kv-load-{case}", "1.0")
    _targets, errors = plugin_targets([name])
    assert [e.detail for e in errors] == [rejection.reason]
    if case in ("at-import", "exits"):  # the summary says what was raised and where
        assert rejection.reason.startswith("import failed: ")
        assert f"{name}.py:" in rejection.reason


def test_a_store_plugin_is_refused_in_the_same_words(fake_site: Callable[..., Path]) -> None:
    """Store discovery loads through the same loader: an import failure names the file and
    line (it once said only the exception), a hook named without the marker is told so."""
    source = BROKEN["at-import"]
    fake_site(
        "kv-load-store",
        entry_points={"kvload_store": "kvload_store"},
        modules={"kvload_store": source},
        group=STORE_ENTRY_POINT_GROUP,
    )
    registry = discover_stores(allow=["kvload_store"])
    (rejection,) = registry.rejected
    assert rejection.reason.startswith("import failed: RuntimeError: no device here at ")
    assert rejection.reason.endswith("kvload_store.py:1")
    assert str(rejection.plugin) == "kvload_store (kv-load-store)"


def test_the_loader_imports_neither_torch_nor_pluggy() -> None:
    """Until a plugin is loaded: store workers and the checker's source level use it free."""
    code = (
        "import sys, kvcache_core.plugin_loader as l; "
        "l.entry_points(l.POOL_ENTRY_POINT_GROUP); "
        "print(sorted(m for m in ('torch', 'pluggy') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]", out.stderr
