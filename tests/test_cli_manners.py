"""`kvcache --version`; a status line on a terminal's stderr during long checks, and nothing
when stderr is piped."""

from __future__ import annotations

import io
import os
import pty
import subprocess
import sys
from pathlib import Path

import kvcache_core
from kvcache_core.cli import main
from kvcache_core.commands.progress import Progress

ROOT = Path(__file__).resolve().parent.parent


def test_version(capsys):
    assert main(["--version"]) == 0
    assert capsys.readouterr().out.strip() == f"kvcache {kvcache_core.__version__}"


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_progress_writes_only_to_a_terminal():
    tty, pipe = _Terminal(), io.StringIO()
    for stream in (tty, pipe):
        status = Progress(stream)
        status.update("working (1/2)")
        status.done()
    assert "working (1/2)" in tty.getvalue() and tty.getvalue().endswith("\r\x1b[K")
    assert pipe.getvalue() == ""


def _check(stderr: int) -> subprocess.CompletedProcess[bytes]:
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    argv = [sys.executable, "-m", "kvcache_core.cli", "check", "mha", "--level", "behaviour"]
    return subprocess.run(argv, env=env, stdout=subprocess.PIPE, stderr=stderr, check=False)


def test_check_shows_progress_on_a_terminal_and_is_silent_when_piped():
    piped = _check(subprocess.PIPE)
    assert piped.returncode == 0 and piped.stderr == b""
    leader, follower = pty.openpty()
    try:
        on_tty = _check(follower)
        os.close(follower)
        seen = b""
        while True:
            try:
                chunk = os.read(leader, 65536)
            except OSError:
                break
            if not chunk:
                break
            seen += chunk
    finally:
        os.close(leader)
    assert on_tty.returncode == 0
    assert b"behaviour battery on pool mha (1/1)" in seen
    assert b"behaviour battery" not in on_tty.stdout  # the report stays clean
