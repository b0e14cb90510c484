"""Suppressions: pyproject and inline, a reason always, and unused ones reported."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from kvcache_core.conformance.results.model import CheckResult, Finding, Location, Outcome
from kvcache_core.conformance.results.suppressions import (
    Suppression,
    apply_suppressions,
    load_pyproject,
    scan_inline,
)
from kvcache_core.conformance.targets.resolve import UsageError

DRIFTED = """
import torch

class NarrowAllocator:
    def __init__(self, pool):
        self.size = 4
        self.page_size = 1
        self._pool = pool
    def available_size(self) -> int: return 0
    def alloc(self, need_size: int) -> torch.Tensor | None: return None
    def free(self, indices: torch.Tensor) -> None: pass
    def free_group_begin(self) -> None: pass
    def free_group_end(self) -> None: pass
    def backup_state(self) -> object: return None
    def restore_state(self, state: object) -> None: pass
    def clear(self) -> None: pass
    def get_kvcache(self) -> "KVPool": return self._pool
    def get_cpu_copy(self, indices: torch.Tensor) -> "KVSnapshot":{get_comment}
        return self._pool.get_cpu_copy(indices)
    def load_cpu_copy(self, snapshot: "KVSnapshot", indices: torch.Tensor) -> None:{load_comment}
        self._pool.load_cpu_copy(snapshot, indices)
"""


def project(tmp_path: Path, pyproject: str = "", get_comment: str = "", load_comment: str = ""):
    src = tmp_path / "src"
    src.mkdir()
    (src / "narrow.py").write_text(
        textwrap.dedent(DRIFTED).format(get_comment=get_comment, load_comment=load_comment),
        encoding="utf-8",
    )
    (tmp_path / "pyproject.toml").write_text(textwrap.dedent(pyproject), encoding="utf-8")
    return tmp_path


def test_pyproject_suppression_with_reason(run_cli, tmp_path):
    root = project(
        tmp_path,
        """
        [project]
        name = "x"

        [tool.kvcache]
        suppress = [
          {rule = "missing-parameter", target = "NarrowAllocator", reason = "v1 engine only"},
        ]
        """,
    )
    run = run_cli("check", "src/narrow.py", "--level", "source", cwd=root)
    assert run.code == 0, (run.err, run.results)
    (result,) = run.results
    assert result.findings == () and result.outcome is Outcome.PASSED
    assert (
        result.extra["suppressed"]
        == [
            {
                "rule": "missing-parameter",
                "reason": "v1 engine only",
                "by": f"{root}/pyproject.toml:7",
            }
        ]
        * 2
    )


def test_pyproject_suppression_without_reason_is_a_usage_error(run_cli, tmp_path):
    root = project(
        tmp_path,
        """
        [tool.kvcache]
        suppress = [{rule = "missing-parameter", target = "*"}]
        """,
    )
    run = run_cli("check", "src/narrow.py", "--level", "source", cwd=root)
    assert run.code == 2
    assert "has no reason" in run.err


@pytest.mark.parametrize(
    "entry, message",
    [
        ('{rule = "no-such-rule", reason = "x"}', "unknown rule id 'no-such-rule'"),
        ('{rule = "missing-parameter", reason = "x", taget = "A"}', "unknown key(s) taget"),
        ('"missing-parameter"', "must be a table"),
        ('{rule = "missing-parameter", reason = "   "}', "has no reason"),
    ],
)
def test_invalid_pyproject_entries(tmp_path, entry, message):
    path = tmp_path / "pyproject.toml"
    path.write_text(f"[tool.kvcache]\nsuppress = [{entry}]\n", encoding="utf-8")
    with pytest.raises(UsageError, match=message.replace("(", r"\(").replace(")", r"\)")):
        load_pyproject(str(path))


def test_inline_suppression_and_unused_ones(run_cli, tmp_path):
    root = project(
        tmp_path,
        """
        [tool.kvcache]
        suppress = [{rule = "annotation-mismatch", target = "*", reason = "stale entry"}]
        """,
        get_comment="  # kvcache: ignore[missing-parameter] engine v1 never passes it",
        load_comment="  # kvcache: ignore[missing-parameter, return-mismatch] same",
    )
    run = run_cli("check", "src/narrow.py", "--level", "source,signature", cwd=root)
    assert run.code == 0, (run.err, run.results)
    unused = run.findings("unused-suppression")
    where = sorted(str(f.impl_location).rsplit("/", 1)[-1] for f in unused)
    assert where == ["narrow.py:20", "pyproject.toml:3"]  # return-mismatch is unused
    assert all(not f.is_error for f in unused)
    assert not run.findings("missing-parameter")


def test_inline_suppression_without_reason_is_a_usage_error(run_cli, tmp_path):
    root = project(tmp_path, "", get_comment="  # kvcache: ignore[missing-parameter]")
    run = run_cli("check", "src/narrow.py", "--level", "source", cwd=root)
    assert run.code == 2
    assert "narrow.py:18" in run.err and "has no reason" in run.err


def test_suppressing_every_error_keeps_warnings_and_recomputes_the_outcome():
    error = Finding(
        "missing-parameter", "m", "pkg.A", "get_cpu_copy", impl_location=Location("a.py", 3)
    )
    warning = Finding("annotation-mismatch", "m", "pkg.A", "get_cpu_copy")
    result = CheckResult("pkg.A", "source:OffloadablePool", Outcome.FAILED, (error, warning))
    inline = Suppression("missing-parameter", "why", Location("a.py", 3), inline=True)
    (kept,) = apply_suppressions([result], [inline])
    assert kept.findings == (warning,) and kept.outcome is Outcome.PASSED


def test_inline_comments_are_read_with_the_tokenizer(tmp_path):
    path = tmp_path / "m.py"
    path.write_text(
        's = "# kvcache: ignore[missing-method] not a comment"\n'
        "x = 1  # kvcache: ignore[missing-method, return-mismatch] two rules\n",
        encoding="utf-8",
    )
    found = scan_inline([str(path)])
    assert [(s.rule, s.origin.line, s.reason) for s in found] == [
        ("missing-method", 2, "two rules"),
        ("return-mismatch", 2, "two rules"),
    ]


def test_suppressions_of_rules_a_run_cannot_report_are_not_called_unused():
    supp = Suppression("type-error", "mypy false positive", Location("pyproject.toml", 4))
    out = apply_suppressions([], [supp], active_rules={"missing-parameter"})
    assert out == []
    out = apply_suppressions([], [supp], active_rules=None)
    assert out[0].findings[0].rule == "unused-suppression"


def test_an_inline_suppression_only_covers_its_own_file(run_cli, tmp_path):
    """``a.py:7`` suppresses a finding at ``a.py:7``, never one at ``b.py:7``."""
    (tmp_path / "a.py").write_text(
        "class Base:\n"
        "    def get_cpu_copy(self, indices, mamba_indices=None):\n"
        "        return indices\n"
        "\n"
        "\n"
        "class A(Base):\n"
        "    def get_cpu_copy(self, indices): ...  # kvcache: ignore[missing-parameter] v1 only\n"
    )
    (tmp_path / "b.py").write_text(
        "from a import Base\n\n\n\n\nclass B(Base):\n    def get_cpu_copy(self, indices): ...\n"
        "\n\ndef retract(pool: Base) -> None:  # reaches A and B: both narrowings break it\n"
        "    pool.get_cpu_copy([1], mamba_indices=None)\n"
    )
    (tmp_path / "pyproject.toml").write_text("")
    run = run_cli("drift", "a.py", "b.py", cwd=tmp_path)
    assert run.code == 1
    (kept,) = run.findings()
    assert (kept.rule, kept.target, kept.method, kept.parameter) == (
        "missing-parameter",
        "b.B",
        "get_cpu_copy",
        "mamba_indices",
    )
    assert str(kept.impl_location) == str(tmp_path / "b.py") + ":7"
    (hidden,) = [r for r in run.results if r.extra.get("suppressed")]
    assert hidden.target == "a.A"
    assert hidden.extra["suppressed"][0]["by"] == str(tmp_path / "a.py") + ":7"
