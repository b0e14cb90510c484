"""Section 3 of ``make bench``: ``discover()`` against bare pluggy, in fresh processes."""

from __future__ import annotations

import subprocess
import sys

from _report import figure

_PRELUDE = "import time, torch, pluggy, kvcache_core\n"
_COLD = {
    "discover": "from kvcache_core import discover\nt = time.perf_counter()\ndiscover()\n",
    "pluggy": (
        "from kvcache_core import hookspecs as h\n"
        "from kvcache_core.plugin_loader import POOL_ENTRY_POINT_GROUP\n"
        "t = time.perf_counter()\n"
        "pm = pluggy.PluginManager(h.PROJECT_NAME)\n"
        "pm.add_hookspecs(h)\n"
        "pm.load_setuptools_entrypoints(POOL_ENTRY_POINT_GROUP)\n"
        "pm.hook.kvcache_pool_specs()\n"
    ),
}


def cold(kind: str) -> float:
    """Seconds one fresh process spends in discovery (plugin imports included), after the
    interpreter, torch and kvcache itself are imported: what an engine pays at start-up."""
    code = _PRELUDE + _COLD[kind] + "print(time.perf_counter() - t)\n"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    return float(out.stdout.strip().splitlines()[-1])


def bench_discovery(repeat: int) -> None:
    """Cold: fresh processes, interleaved, best of ``repeat``. Both sides import the same
    plugin modules and call the same hook; discover() adds isolation and validation."""
    best = {"discover": float("inf"), "pluggy": float("inf")}
    for _ in range(max(repeat, 5)):
        for kind in best:
            best[kind] = min(best[kind], cold(kind))
    print("== discovery (fresh process, after import torch/kvcache)")
    figure(
        "discover()",
        f"{best['discover'] * 1e3:.2f} ms",
        f"bare pluggy {best['pluggy'] * 1e3:.2f} ms",
        best["discover"] / best["pluggy"],
        1.3,
        higher_is_better=False,
    )
