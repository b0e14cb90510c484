"""stubs/torch declares only what exists in the installed torch, with the same shape.

The types level trusts the stub instead of torch's own annotations; a name declared there but
spelled, typed or shaped differently in torch would make mypy judge plugins against a fiction.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from kvcache_core.conformance.types._mypy import find_stubs_dir

RUNNER = Path(__file__).resolve().parent / "_stubtest_runner.py"


def test_stub_matches_installed_torch() -> None:
    stubs = find_stubs_dir()
    assert stubs is not None
    done = subprocess.run(
        [sys.executable, "-W", "ignore", str(RUNNER), str(stubs)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    checked = {
        line.split()[1]: line.split()[2]
        for line in done.stdout.splitlines()
        if line.startswith("checked ")
    }
    assert set(checked) == {"torch", "torch._C"}, done.stdout + done.stderr
    assert all(Path(p).is_relative_to(stubs) for p in checked.values()), checked
    problems = [line for line in done.stdout.splitlines() if not line.startswith("checked ")]
    assert done.returncode == 0 and not problems, "\n".join(problems) + done.stderr


def test_stubtest_catches_a_dishonest_stub(tmp_path: Path) -> None:
    """The check is not vacuous: a name torch does not have is reported."""
    stubs = find_stubs_dir()
    assert stubs is not None
    fake = tmp_path / "stubs"
    (fake / "torch" / "_C").mkdir(parents=True)
    (fake / "torch/_C/__init__.pyi").write_text((stubs / "torch/_C/__init__.pyi").read_text())
    text = (stubs / "torch/__init__.pyi").read_text()
    assert "float32: dtype" in text
    text = text.replace("float32: dtype", "float32: int") + "\nclass NotInTorch: ...\n"
    (fake / "torch/__init__.pyi").write_text(text)
    done = subprocess.run(
        [sys.executable, "-W", "ignore", str(RUNNER), str(fake)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 1
    assert "torch.NotInTorch" in done.stdout
    assert "torch.float32" in done.stdout
