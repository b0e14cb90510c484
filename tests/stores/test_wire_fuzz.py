"""The coverage-guided fuzz of the snapshot reader (atheris, ``tests/fuzz/fuzz_wire.py``) for a
bounded time in the suite: any input makes ``from_bytes`` return a snapshot or raise
``SnapshotMismatchError``, and an accepted snapshot writes back to what it read. ``make fuzz``
runs it for longer and records new finds in the corpus."""

from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

HARNESS = Path(__file__).resolve().parents[1] / "fuzz" / "fuzz_wire.py"
CORPUS = HARNESS.parent / "corpus"


def test_the_recorded_corpus_is_small_and_seeded() -> None:
    files = list(CORPUS.iterdir())
    assert any(p.name.startswith("seed-") for p in files)
    assert sum(p.stat().st_size for p in files) < 1 << 20, "the corpus is meant to stay small"


def test_the_fuzzer_finds_nothing_in_a_bounded_run(tmp_path: Path) -> None:
    if importlib.util.find_spec("atheris") is None:
        if os.environ.get("CI"):
            pytest.fail("atheris is a dev dependency: CI should have installed it")
        pytest.skip("atheris is not installed (pip install atheris)")
    work = tmp_path / "corpus"
    shutil.copytree(CORPUS, work)
    done = subprocess.run(
        [
            sys.executable,
            str(HARNESS),
            str(work),
            "-max_total_time=15",
            "-max_len=8192",
            "-timeout=10",
            "-rss_limit_mb=3072",
            f"-artifact_prefix={tmp_path}/",
        ],
        capture_output=True,
        text=True,
        timeout=240,
    )
    found = sorted(
        p.name for p in tmp_path.iterdir() if p.name.startswith(("crash", "timeout", "oom"))
    )
    assert done.returncode == 0 and not found, (found, done.stderr[-4000:])
    assert "Done" in done.stderr and "runs in" in done.stderr, done.stderr[-2000:]
