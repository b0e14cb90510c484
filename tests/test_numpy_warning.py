"""No process that imports ``kvcache_core`` (and so torch) prints torch's "Failed to initialize
NumPy" warning.

Why in a fresh interpreter: the warning fires once, when torch is first imported, so only a
process that imports torch itself shows it; and it must not be filtered away (pytest's own
config filtered it once): its cause is torch installed without numpy, which kvcache's
dependencies now include.
"""

from __future__ import annotations

import subprocess
import sys

PROGRAM = """
import warnings
warnings.simplefilter("always")  # show every warning, whatever the environment says
import kvcache_core
kvcache_core.PoolConfig(size=8, layer_num=1, head_num=1, head_dim=4)  # imports torch
print("ok")
"""


def test_importing_kvcache_and_torch_prints_no_numpy_warning() -> None:
    done = subprocess.run(
        [sys.executable, "-c", PROGRAM],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip().endswith("ok")
    assert "Failed to initialize NumPy" not in done.stderr, done.stderr
    assert "NumPy" not in done.stderr, done.stderr
