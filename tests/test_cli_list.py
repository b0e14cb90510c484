"""``kvcache list`` reports plugins found through entry points, in text and JSON."""

from __future__ import annotations

import json
import subprocess
import sys


def run_list(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "kvcache_core.cli", "list", *args],
        capture_output=True,
        text=True,
        check=False,
    )


def test_json_lists_mha_from_its_entry_point():
    proc = run_list("--format", "json")
    assert proc.returncode in (0, 1), proc.stderr
    data = json.loads(proc.stdout)
    rows = {r["pool"]: r for r in data["plugins"] if r["status"] == "accepted"}
    mha = rows["mha"]
    assert mha["distribution"] == "kvcache" and mha["contract_version"] == 2
    assert "offload" in mha["capabilities"]


def test_text_names_distribution_and_status():
    proc = run_list()
    assert "accepted mha" in proc.stdout and "dist=kvcache 0.1.0" in proc.stdout
