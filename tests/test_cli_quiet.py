"""No warning a user cannot act on reaches the terminal (torch's missing-NumPy warning)."""

from __future__ import annotations

import subprocess
import sys

import pytest


@pytest.mark.parametrize(
    "argv", [["list"], ["check", "mha", "--level", "signature"], ["demo", "--pool", "mha"]]
)
def test_cli_prints_no_warning(argv: list[str]) -> None:
    run_cli = "import sys; from kvcache_core.cli import main; sys.exit(main())"
    done = subprocess.run(
        [sys.executable, "-c", run_cli, *argv],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert "Warning" not in done.stderr, done.stderr
