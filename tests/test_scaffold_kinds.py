"""``kvcache new-pool``'s kinds and storages, its requirement on kvcache, and the licence.

The end-to-end claim (every kind installs elsewhere and passes every level) is
tests/test_scaffold_install.py's; here the parts: the quantised storages pass the behaviour
battery as generated (in process, from the rendered module), the requirement says where kvcache
came from for every kind of install (PEP 610), generated code is lint-clean, and the scaffold
carries the licence kvcache itself is under.
"""

from __future__ import annotations

import importlib
import json
import subprocess
import sys
from importlib import metadata
from pathlib import Path

import pytest

from kvcache_core.commands.scaffold import (
    KINDS,
    STORAGES,
    _installed_requirement,
    kvcache_requirement,
    render,
    requirement_for,
    storage_problem,
)
from kvcache_core.testing import check_conformance, conformance_cases

ROOT = Path(__file__).resolve().parent.parent


def _write(files: dict[str, str], root: Path) -> None:
    for relative, text in files.items():
        path = root / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")


# -- kinds and storages ------------------------------------------------------------------------


def test_every_kind_renders_a_package_with_pool_tests_ci_readme_and_licence():
    for kind in KINDS:
        files = render("my-pool", "my_pool", kind, requirement="kvcache")
        assert {
            "pyproject.toml",
            "README.md",
            "LICENSE",
            ".gitignore",
            ".github/workflows/kvcache.yml",
            "tests/test_conformance.py",
            "my_pool/__init__.py",
        } <= set(files), kind
        assert f"kind: {kind}" in files["README.md"]
        assert 'my-pool = "my_pool"' in files["pyproject.toml"]
        assert "kvcache check my-pool" in files[".github/workflows/kvcache.yml"]
        assert not any("__" + "NAME__" in t or "__" + "MODULE__" in t for t in files.values())


def test_unknown_kinds_and_storages_are_refused_by_render():
    with pytest.raises(
        ValueError, match=r"unknown kind 'gqa' \(kinds: mha, mla, dsa, swa, mamba, hisparse\)"
    ):
        render("p", "p", "gqa", requirement="kvcache")
    with pytest.raises(ValueError, match="offered for --kind mha"):
        render("p", "p", "swa", storage="fp8", requirement="kvcache")
    assert storage_problem("mha", "int4") is not None
    assert [s for s in STORAGES if storage_problem("mha", s) is None] == list(STORAGES)


@pytest.mark.parametrize("storage", ["int8", "fp8"])
def test_quantised_storage_passes_the_battery_as_generated(storage, tmp_path, monkeypatch):
    module = f"scaffold_{storage}_pool"
    files = render(f"scaffold-{storage}", module, "mha", storage=storage, requirement="kvcache")
    _write(files, tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    try:
        plugin = importlib.import_module(module)
        (spec,) = plugin.kvcache_pool_specs()
        stored = plugin.QUANT_DTYPE
        assert stored == (torch_int8() if storage == "int8" else torch_fp8())
        cases = conformance_cases(spec, pyproject=False)
        assert len(cases) >= 12
        for case in cases:
            check_conformance(*case.values)
    finally:
        sys.modules.pop(module, None)


def torch_int8():
    import torch

    return torch.int8


def torch_fp8():
    import torch

    return torch.float8_e4m3fn


def test_generated_code_is_lint_clean(tmp_path):
    for kind in KINDS:
        _write(render("my-pool", "my_pool", kind, requirement="kvcache"), tmp_path / kind)
    for storage in ("int8", "fp8"):
        files = render("my-pool", "my_pool", "mha", storage=storage, requirement="kvcache")
        _write(files, tmp_path / storage)
    ruff = [sys.executable, "-m", "ruff"]
    rules = ["--select", "E,F,W,B,UP,SIM,RUF", "--line-length", "100", "--isolated"]
    lint = subprocess.run([*ruff, "check", *rules, str(tmp_path)], capture_output=True, text=True)
    assert lint.returncode == 0, lint.stdout
    fmt = [*ruff, "format", "--check", "--isolated", "--line-length", "100", str(tmp_path)]
    formatted = subprocess.run(fmt, capture_output=True, text=True)
    assert formatted.returncode == 0, formatted.stdout


# -- the requirement on kvcache ----------------------------------------------------------------


@pytest.mark.parametrize(
    ("version", "direct", "want"),
    [
        ("0.1.0", None, "kvcache>=0.1.0,<0.2"),
        ("0.12.3", None, "kvcache>=0.12.3,<0.13"),
        ("1.2.0", None, "kvcache>=1.2.0,<2"),
        (
            "0.1.0",
            {"url": "file:///src/kvcache", "dir_info": {"editable": True}},
            "kvcache @ file:///src/kvcache",
        ),
        ("0.1.0", {"url": "file:///src/kvcache", "dir_info": {}}, "kvcache @ file:///src/kvcache"),
        (
            "0.1.0",
            {
                "url": "file:///w/kvcache-0.1.0-py3-none-any.whl",
                "archive_info": {"hashes": {"sha256": "00"}},
            },
            "kvcache @ file:///w/kvcache-0.1.0-py3-none-any.whl",
        ),
        (
            "0.1.0",
            {
                "url": "https://example.org/kvcache.git",
                "vcs_info": {"vcs": "git", "commit_id": "abc123"},
            },
            "kvcache @ git+https://example.org/kvcache.git@abc123",
        ),
    ],
)
def test_requirement_for_each_kind_of_install(version, direct, want):
    assert requirement_for(version, None if direct is None else json.dumps(direct)) == want


@pytest.mark.parametrize("bad", ["not json", "{}", '{"url": ""}', "[1]"])
def test_a_malformed_direct_url_is_refused(bad):
    with pytest.raises(ValueError, match="direct_url"):
        requirement_for("0.1.0", bad)


class FakeDist(metadata.Distribution):
    """A distribution whose metadata lives at ``home/info`` and whose files lie in ``home``."""

    def __init__(self, home: Path, version: str, direct: dict[str, object] | None) -> None:
        self.home = home
        self._version = version
        self.direct = direct

    def read_text(self, filename: str) -> str | None:
        if filename == "METADATA":
            return f"Metadata-Version: 2.1\nName: kvcache\nVersion: {self._version}\n"
        if filename == "direct_url.json" and self.direct is not None:
            return json.dumps(self.direct)
        return None

    def locate_file(self, path: str | object) -> Path:
        return self.home / str(path)


def test_the_installed_distribution_decides_not_the_checkouts_build_metadata(tmp_path):
    checkout = tmp_path / "checkout"
    (checkout / "kvcache_core").mkdir(parents=True)
    (checkout / "pyproject.toml").write_text("")
    package = checkout / "kvcache_core"
    site = tmp_path / "site"
    egg_info = FakeDist(checkout, "0.1.0", None)  # found first when the checkout is on sys.path
    editable = FakeDist(site, "0.1.0", {"url": checkout.as_uri(), "dir_info": {"editable": True}})
    assert _installed_requirement([egg_info, editable], package) == f"kvcache @ {checkout.as_uri()}"
    assert _installed_requirement([egg_info], package) is None  # then: the checkout, by path


def test_index_and_wheel_installs(tmp_path):
    site = tmp_path / "site"
    package = site / "kvcache_core"
    package.mkdir(parents=True)
    index = FakeDist(site, "0.3.1", None)
    assert _installed_requirement([index], package) == "kvcache>=0.3.1,<0.4"
    wheel = {"url": "file:///w/kvcache-0.3.1-py3-none-any.whl", "archive_info": {}}
    assert (
        _installed_requirement([FakeDist(site, "0.3.1", wheel)], package)
        == "kvcache @ file:///w/kvcache-0.3.1-py3-none-any.whl"
    )
    elsewhere = FakeDist(tmp_path / "other-site", "0.3.1", None)  # another env's kvcache
    assert _installed_requirement([elsewhere], package) is None


def test_this_checkout_is_named_by_a_direct_reference():
    assert kvcache_requirement() == f"kvcache @ {ROOT.as_uri()}"
    files = render("my-pool", "my_pool", "mha")
    assert f'dependencies = ["kvcache @ {ROOT.as_uri()}"]' in files["pyproject.toml"]


# -- the licence -------------------------------------------------------------------------------


def test_the_licence_is_apache_2_at_the_top_and_in_every_scaffold():
    text = (ROOT / "LICENSE").read_text(encoding="utf-8")
    assert "Apache License" in text and "Version 2.0, January 2004" in text
    assert "TERMS AND CONDITIONS FOR USE, REPRODUCTION, AND DISTRIBUTION" in text
    assert "END OF TERMS AND CONDITIONS" in text
    assert len(text.splitlines()) > 190  # the whole text, not a pointer to it
    pyproject = (ROOT / "pyproject.toml").read_text(encoding="utf-8")
    assert 'license = { text = "Apache-2.0" }' in pyproject
    for kind in KINDS:
        files = render("my-pool", "my_pool", kind, requirement="kvcache")
        assert files["LICENSE"] == text
        assert 'license = { text = "Apache-2.0" }' in files["pyproject.toml"]


# -- the docs ----------------------------------------------------------------------------------

DOC = ROOT / "docs" / "pool-authors.md"


def _section(title: str) -> str:
    text = DOC.read_text(encoding="utf-8")
    start = text.index(f"## {title}\n")
    end = text.find("\n## ", start + 1)
    return text[start : end if end != -1 else None]


def test_the_kinds_table_lists_exactly_the_scaffolded_kinds():
    hour = _section("Your first hour")
    rows = [line.split("|")[1].strip() for line in hour.splitlines() if line.startswith("| `")]
    assert [r.split("`")[1] for r in rows][1:] == list(KINDS)  # after the header row


def test_the_porting_guide_names_real_config_fields_and_public_helpers():
    import dataclasses

    import kvcache_core
    from kvcache_core import PoolConfig

    porting = _section("Porting a pool from sglang")
    fields = {f.name for f in dataclasses.fields(PoolConfig)}
    named = [
        "swa_size", "swa_layer_ids", "mamba_size", "mamba_layer_ids", "conv_state_shapes",
        "temporal_state_shape", "mamba_dtype", "kv_lora_rank", "qk_rope_head_dim",
        "index_head_dim", "start_layer", "options",
    ]  # fmt: skip
    for name in named:
        assert f"`{name}`" in porting or f"`{name}`," in porting or name in porting, name
        assert name in fields, name
    for helper in ("unwrap_write_loc", "expect_snapshot", "check_slots", "check_rows"):
        assert helper in porting and helper in kvcache_core.__all__
    for cap in ("offload", "paged", "mla", "indexer", "sliding-window", "mamba-state", "hisparse"):
        assert f"`{cap}`" in porting
    assert "engines.md#coming-from-sglang" in porting


def test_depending_on_kvcache_shows_what_requirement_for_writes():
    section = _section("Depending on kvcache")
    assert f'"{requirement_for("0.1.0", None)}"' in section
    checkout = json.dumps({"url": "file:///path/to/kvcache", "dir_info": {}})
    assert f'"{requirement_for("0.1.0", checkout)}"' in section
