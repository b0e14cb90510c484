"""The drift prefilter: reading only the files that matter finds exactly what reading all does.

``run_drift(prefilter=False)`` parses every file given (the path ``kvcache drift`` took before
the prefilter); the default reads every file once as bytes and parses only those that can
define or call a followed method, then the modules their bases come from, on demand. Whole
results are compared (durations aside), not counts.
"""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest

from kvcache_core.conformance.members.sources import SourceIndex
from kvcache_core.conformance.results.model import CheckResult
from kvcache_core.conformance.source.drift import DEFAULT_METHODS, analyze, run_drift

from ._corpus import CORPUS
from ._tree import PACKAGE, generate_tree


def _plain(results: list[CheckResult]) -> list[CheckResult]:
    return [replace(r, duration_s=0.0) for r in results]


def _both(paths: list[str], **kwargs: object) -> tuple[list[CheckResult], list[CheckResult]]:
    fast = analyze(paths, prefilter=True, **kwargs)  # type: ignore[arg-type]
    full = analyze(paths, prefilter=False, **kwargs)  # type: ignore[arg-type]
    return _plain(fast), _plain(full)


ENGINE = CORPUS / "engine_tree" / "python" / "sglang"

CORPUS_RUNS = [
    pytest.param([CORPUS], {}, id="whole-corpus"),
    pytest.param([CORPUS / "drift_tree"], {}, id="drift-tree"),
    pytest.param([CORPUS / "drift_tree"], {"root": "TreeGoodPool"}, id="drift-tree-root"),
    pytest.param(
        [CORPUS / "drift_tree"],
        {"root": "drift_corpus.drift_tree.base.TreeBasePool"},
        id="drift-tree-qualified-root",
    ),
    pytest.param([CORPUS], {"methods": ["load_cpu_copy"]}, id="one-method"),
    pytest.param(
        [ENGINE / "srt" / "mem_cache", ENGINE / "srt" / "hardware_backend"], {}, id="engine-folders"
    ),
    pytest.param([ENGINE / "srt" / "hardware_backend"], {}, id="base-not-given"),
    pytest.param([ENGINE], {"root": "MHATokenToKVPool"}, id="engine-root"),
    pytest.param(
        [CORPUS], {"methods": [*DEFAULT_METHODS, "get_key_buffer", "alloc"]}, id="more-methods"
    ),
]


@pytest.mark.parametrize(("paths", "options"), CORPUS_RUNS)
def test_prefiltered_drift_equals_the_full_read_on_the_corpus(paths, options):
    fast, full = _both([str(p) for p in paths], **options)
    assert fast == full
    assert fast  # the comparison compares something


@pytest.fixture(scope="module")
def tree(tmp_path_factory: pytest.TempPathFactory):
    return generate_tree(tmp_path_factory.mktemp("tree"), files=400, chains=6, depth=6)


def test_generated_tree_has_the_expected_findings_both_ways(tree):
    fast, full = _both([str(tree.root)])
    assert fast == full
    got = {(f.rule, f.target) for r in fast for f in r.findings}
    assert got == set(tree.expected)
    assert any(rule == "missing-parameter" for rule, _ in tree.expected)


def test_generated_tree_with_root_and_from_inside_a_folder(tree, monkeypatch):
    fast, full = _both([str(tree.root)], root="Chain3Level0")
    assert fast == full
    assert {r.target for r in fast if r.check == "drift:overrides"} == {
        f"{PACKAGE}.chain3.level0.Chain3Level0",
        f"{PACKAGE}.chain3.level5.Chain3Level5",
    }
    # from inside the package, on one chain's folder and the callers' file
    monkeypatch.chdir(tree.root)
    fast, full = _both(["chain0", "callers.py"])
    assert fast == full
    assert {f.rule for r in fast for f in r.findings} == {"missing-parameter"}


def test_the_prefilter_reads_few_files_and_parses_bases_only_on_demand(tree):
    index = SourceIndex()
    run = run_drift([str(tree.root)], index=index)
    parsed = index.parsed_files()
    assert len(run.files) == tree.files
    # kept: the chains' modules (6 x 6 levels, and the package files that re-export a base),
    # never a filler, not even those parsed for their (keyword-less) get_cpu_copy calls
    assert 36 <= len(parsed) <= 48
    assert not [p for p in parsed if "filler" in p]
    # the middle levels never name a followed method, yet were parsed, for the MRO
    assert any(p.endswith("chain0/level2.py") for p in parsed)
    # suppressions can only be where "kvcache:" is written: the fillers marked so, nothing else
    assert run.suppression_files
    assert all("filler" in p for p in run.suppression_files)


def _write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")


def test_syntax_errors_where_the_prefilter_reads_are_reported_like_the_full_read(tmp_path):
    _write(tmp_path / "pkg" / "__init__.py", "")
    _write(
        tmp_path / "pkg" / "base.py",
        "class Base:\n    def get_cpu_copy(self, indices, m=None): ...\n",
    )
    # a middle level that is broken: needed for the MRO, so read, so reported
    _write(tmp_path / "pkg" / "middle.py", "from .base import Base\nclass Middle(Base:\n")
    _write(
        tmp_path / "pkg" / "leaf.py",
        "from .middle import Middle\n\nclass Leaf(Middle):\n    def get_cpu_copy(self, i): ...\n",
    )
    # a candidate that is broken
    _write(tmp_path / "pkg" / "calls.py", "def f(p):\n    p.get_cpu_copy(1, m=2\n")
    fast, full = _both([str(tmp_path / "pkg")])
    assert fast == full
    errors = sorted(Path(r.target).name for r in fast if r.check == "drift")
    assert errors == ["calls.py", "middle.py"]


def test_a_broken_file_that_names_nothing_is_not_reported_by_the_prefilter(tmp_path):
    """The one difference, by design: a file the prefilter never needs is never parsed."""
    _write(tmp_path / "a.py", "class A:\n    def get_cpu_copy(self, indices): ...\n")
    _write(tmp_path / "broken.py", "def nothing_to_see(:\n")
    fast, full = _both([str(tmp_path)])
    assert [r.target for r in full if r.check == "drift"] == [str(tmp_path / "broken.py")]
    assert [r for r in full if r.check != "drift"] == fast


def test_two_given_files_of_one_module_name_resolve_like_the_full_read(tmp_path):
    # the same dotted name from two roots: the last given that parses is "the" module
    for side in ("one", "two"):
        _write(tmp_path / side / "shared" / "__init__.py", "")
        _write(
            tmp_path / side / "shared" / "base.py",
            f"class Base:\n    def get_cpu_copy(self, indices{', extra' * (side == 'two')}): ...\n",
        )
    _write(
        tmp_path / "user" / "leaf.py",
        "from shared.base import Base\n\n"
        "class Leaf(Base):\n    def get_cpu_copy(self, indices): ...\n",
    )
    paths = [str(tmp_path / "one"), str(tmp_path / "two"), str(tmp_path / "user")]
    fast, full = _both(paths)
    assert fast == full


def test_cli_suppressions_in_files_the_prefilter_skips_still_count(run_cli, tmp_path):
    _write(tmp_path / "pkg" / "__init__.py", "")
    _write(
        tmp_path / "pkg" / "base.py",
        "class Base:\n    def get_cpu_copy(self, indices, m=None):\n        return indices\n",
    )
    _write(
        tmp_path / "pkg" / "leaf.py",
        "from .base import Base\n\nclass Leaf(Base):\n"
        "    def get_cpu_copy(self, indices): ...  # kvcache: ignore[missing-parameter] v1 only\n",
    )
    # names no followed method, so never parsed; its stale suppression is still reported
    _write(tmp_path / "pkg" / "other.py", "X = 1  # kvcache: ignore[missing-parameter] stale\n")
    run = run_cli("drift", str(tmp_path / "pkg"), "--config", str(_pyproject(tmp_path)))
    assert [f.rule for f in run.findings()] == ["unused-suppression"]
    (unused,) = run.findings()
    assert unused.impl_location.path.endswith("other.py")  # type: ignore[attr-defined]
    assert run.code == 0


def _pyproject(tmp_path: Path) -> Path:
    path = tmp_path / "pyproject.toml"
    path.write_text("[project]\nname = 'x'\n", encoding="utf-8")
    return path


def test_cli_json_is_the_same_with_and_without_the_prefilter(tmp_path, monkeypatch, capsys):
    from kvcache_core import cli
    from kvcache_core.conformance.source import drift

    tree = generate_tree(tmp_path, files=150, chains=3, depth=4)
    argv = ["drift", str(tree.root), "--format", "json", "--config", str(_pyproject(tmp_path))]
    code = cli.main(argv)
    fast = json.loads(capsys.readouterr().out)
    assert fast["summary"]["findings"] > 0
    original = drift.run_drift

    def unfiltered(*args: object, **kwargs: object) -> drift.DriftRun:
        kwargs["prefilter"] = False
        return original(*args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(drift, "run_drift", unfiltered)
    assert cli.main(argv) == code
    full = json.loads(capsys.readouterr().out)

    def strip(doc: object) -> object:
        if isinstance(doc, dict):
            return {k: strip(v) for k, v in doc.items() if "duration" not in k}
        if isinstance(doc, list):
            return [strip(v) for v in doc]
        return doc

    assert strip(fast) == strip(full)


def test_a_base_file_naming_no_method_is_read_under_the_name_it_was_given_as(tmp_path):
    """Engine layout: namespace folders, an absolute import of a file given, whose module
    names no followed method and reaches its own base relatively. Read under the name the
    import spells (``sglang.srt.mem_cache.middle``), its ``..common`` would not resolve; read
    under the name it was given as (``mem_cache.middle``), it does, as in the full read."""
    srt = tmp_path / "srt"
    _write(
        srt / "common.py",
        "class Base:\n    def get_cpu_copy(self, indices, extra=None):\n        return indices\n",
    )
    _write(
        srt / "mem_cache" / "middle.py",
        "from ..common import Base\n\nclass Middle(Base):\n    pass\n",
    )
    _write(
        srt / "mem_cache" / "leaf.py",
        "from sglang.srt.mem_cache.middle import Middle\n\n"
        "class Leaf(Middle):\n    def get_cpu_copy(self, indices): ...\n",
    )
    fast, full = _both([str(srt / "mem_cache")])
    assert fast == full
    (finding,) = [f for r in fast for f in r.findings]
    assert finding.rule == "missing-parameter"
    assert "overrides common.Base" in finding.message
