"""The benchmark script keeps working (its figures are read by people, never asserted here)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parent.parent / "benchmarks" / "bench.py"


def test_quick_benchmark_prints_a_ratio_for_every_section():
    proc = subprocess.run(
        [sys.executable, str(BENCH), "--quick", "--repeat", "1", "--only", "mha,swa,allocator"],
        capture_output=True,
        text=True,
        check=False,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    for needle in ("mha       get_cpu_copy", "swa       load_cpu_copy", "naive cat"):
        line = next((x for x in lines if needle in x), None)
        assert line is not None and "ratio" in line, proc.stdout


def test_quick_drift_benchmark_prints_a_figure_per_measure():
    proc = subprocess.run(
        [sys.executable, str(BENCH.parent / "bench_drift.py"), "--quick"],
        capture_output=True,
        text=True,
        check=False,
        timeout=300,
    )
    # exit 1 would only mean a target missed on this (busy, shared) machine: not asserted here
    assert proc.returncode in (0, 1), proc.stderr
    lines = proc.stdout.splitlines()
    for needle in (
        "150 KB module",
        "500 files vs parsing them",
        "500 files vs unfiltered",
        "kvcache drift, 500 files",
        "memory per irrelevant file",
        "kvcache --version",
        "kvcache --help",
        "kvcache drift <small file>",
    ):
        line = next((x for x in lines if needle in x), None)
        assert line is not None and "ratio" in line and "target" in line, proc.stdout
