"""The files ``kvcache new-pool`` writes: template files with ``__NAME__``-style placeholders.

Why real files under ``kvcache_core/templates/new_pool/`` (package data) and not strings in a
module: a pool template is a Python module a pool author will read and edit, and reads best,
diffs best and is reviewed best as one. They travel with every install of kvcache (wheel,
editable, a bare checkout on ``PYTHONPATH``) through ``importlib.resources``; ``.tmpl`` keeps
linters and type checkers off them, and a test renders, installs and checks every kind end to
end, so they cannot rot unnoticed.

Every pool they describe uses only ``kvcache_core``'s public names (``LayerRows``,
``QuantizedLayerRows``, ``PagedSlotAllocator``, ``FreeGroup``, ``check_slots``, ...); a test
enforces that for every kind.

Where the generated package gets kvcache from is decided here too
([`kvcache_requirement`][kvcache_core.commands.scaffold.kvcache_requirement]): a package that says
``dependencies = ["kvcache"]`` installs nowhere while kvcache is not on an index.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass
from importlib import metadata, resources
from pathlib import Path

__all__ = [
    "KINDS",
    "STORAGES",
    "kvcache_requirement",
    "render",
    "requirement_for",
    "storage_problem",
]

#: Kinds ``new-pool`` scaffolds, one per built-in pool kind.
KINDS = ("mha", "mla", "dsa", "swa", "mamba", "hisparse")

#: ``--storage`` choices: ``full`` keeps the compute dtype; ``int8``/``fp8`` quantise with a
#: power-of-two scale per token (``QuantizedLayerRows``).
STORAGES = ("full", "int8", "fp8")

#: Kinds whose template has a quantised variant. Quantised storage makes sense where kernels
#: read K and V rows a token at a time; the latent kinds (mla, dsa, hisparse) hand kernels a
#: live view of the latent, and the composites (swa, mamba) compose MHA halves whose storage
#: an author changes in the MHA part.
_QUANTISED_KINDS = ("mha",)

_QUANT_DTYPES = {"int8": "torch.int8", "fp8": "torch.float8_e4m3fn"}

#: The distribution whose metadata says where kvcache came from.
_DISTRIBUTION = "kvcache"


@dataclass(frozen=True)
class _Template:
    source: str  # path under templates/new_pool
    target: str  # path in the generated package; placeholders allowed


_COMMON = (
    _Template("common/pyproject.toml.tmpl", "pyproject.toml"),
    _Template("common/README.md.tmpl", "README.md"),
    _Template("common/LICENSE", "LICENSE"),
    _Template("common/gitignore.tmpl", ".gitignore"),
    _Template("common/kvcache.yml.tmpl", ".github/workflows/kvcache.yml"),
    _Template("common/test_conformance.py.tmpl", "tests/test_conformance.py"),
)

#: Per kind: the pool module, and the allocator module where the kind needs its own.
_KIND_FILES: dict[str, tuple[_Template, ...]] = {
    "mha": (_Template("mha/pool.py.tmpl", "__MODULE__/__init__.py"),),
    "mla": (_Template("mla/pool.py.tmpl", "__MODULE__/__init__.py"),),
    "dsa": (_Template("dsa/pool.py.tmpl", "__MODULE__/__init__.py"),),
    "swa": (
        _Template("swa/pool.py.tmpl", "__MODULE__/__init__.py"),
        _Template("swa/allocator.py.tmpl", "__MODULE__/allocator.py"),
    ),
    "mamba": (
        _Template("mamba/pool.py.tmpl", "__MODULE__/__init__.py"),
        _Template("mamba/allocator.py.tmpl", "__MODULE__/allocator.py"),
    ),
    "hisparse": (
        _Template("hisparse/pool.py.tmpl", "__MODULE__/__init__.py"),
        _Template("hisparse/allocator.py.tmpl", "__MODULE__/allocator.py"),
    ),
}

_KIND_NOTES = {
    "mha": "K and V per layer in `LayerRows`, allocated by `PagedSlotAllocator`.",
    "mla": (
        "One `[nope | rope]` latent per token and layer in `LayerRows`; the value buffer is a "
        "view of the latent's first `kv_lora_rank` columns."
    ),
    "dsa": (
        "The MLA latent plus per-layer indexer keys and float32 scales, addressed by slot "
        "(slot `s` is page `s // page_size`, offset `s % page_size`)."
    ),
    "swa": (
        "Full-attention layers in `size` slots, sliding-window layers in `swa_size` slots, and "
        "the full -> window table the allocator (`allocator.py`) owns. The allocator is a "
        "`CompositeAllocator` over full and window `PagedSlotAllocator`s, with one window "
        "page per full page (paged)."
    ),
    "mamba": (
        "Attention layers' K and V by token slot plus each Mamba layer's recurrent state by "
        "request slot; `allocator.py` hands out the request slots."
    ),
    "hisparse": (
        "A logical K/V store of `size` slots of which `device_size` are resident in the "
        "device buffers kernels read; the allocator (`allocator.py`) owns the logical -> "
        "device table and is a `CompositeAllocator` over logical and device "
        "`PagedSlotAllocator`s, with residency by page (paged)."
    ),
}


def _template(source: str) -> str:
    root = resources.files("kvcache_core").joinpath("templates", "new_pool")
    return root.joinpath(*source.split("/")).read_text(encoding="utf-8")


def _class_name(module: str) -> str:
    return "".join(part.capitalize() for part in module.split("_") if part) + "Pool"


def storage_problem(kind: str, storage: str) -> str | None:
    """Why ``--storage storage`` cannot be scaffolded for ``kind``, or None."""
    if storage not in STORAGES:
        return f"--storage {storage!r} is not one of: {', '.join(STORAGES)}"
    if storage != "full" and kind not in _QUANTISED_KINDS:
        return (
            f"--storage {storage} is offered for --kind {', '.join(_QUANTISED_KINDS)}; a "
            f"{kind} pool is scaffolded with full-precision storage (quantise its MHA part "
            "with QuantizedLayerRows, as the quantised mha scaffold does)"
        )
    return None


def requirement_for(version: str, direct_url: str | None) -> str:
    """The requirement a generated package declares on kvcache ``version``, installed as
    ``direct_url`` says (the text of the install's ``direct_url.json``, PEP 610, or None).

    - no ``direct_url.json``: kvcache came from an index, so a version range that admits the
      fixes of this release line and no breaking one (``>=0.1.0,<0.2`` before 1.0,
      ``>=1.2.0,<2`` after);
    - a local directory (a checkout, editable or not) or an archive (a wheel or sdist file, or
      a URL): a direct reference to the same place, ``kvcache @ file:///...``;
    - a VCS checkout: the same repository at the same commit, ``kvcache @ git+URL@COMMIT``.

    :raises ValueError: ``direct_url`` is not a PEP 610 record.
    """
    if direct_url is None:
        parts = [int(p) if p.isdigit() else 0 for p in version.split(".")[:2]] + [0, 0]
        major, minor = parts[0], parts[1]
        upper = f"{major}.{minor + 1}" if major == 0 else f"{major + 1}"
        return f"{_DISTRIBUTION}>={version},<{upper}"
    try:
        record = json.loads(direct_url)
        url = record["url"]
    except (ValueError, KeyError, TypeError) as exc:
        raise ValueError(f"not a PEP 610 direct_url.json: {direct_url!r}") from exc
    if not isinstance(url, str) or not url:
        raise ValueError(f"direct_url.json has no url: {direct_url!r}")
    vcs = record.get("vcs_info")
    if isinstance(vcs, dict):
        commit = vcs.get("commit_id") or vcs.get("requested_revision")
        suffix = f"@{commit}" if commit else ""
        return f"{_DISTRIBUTION} @ {vcs.get('vcs', 'git')}+{url}{suffix}"
    return f"{_DISTRIBUTION} @ {url}"


def kvcache_requirement() -> str:
    """The requirement on kvcache for a package generated by this kvcache, read from the
    install's metadata (``direct_url.json``, PEP 610; see
    [`requirement_for`][kvcache_core.commands.scaffold.requirement_for]).

    The installed distribution that provides the ``kvcache_core`` being run decides; a
    checkout's own build metadata (``kvcache.egg-info`` beside its sources) is not an install
    and is skipped. A kvcache imported from a checkout that is not installed at all
    (``PYTHONPATH``) is named by a direct reference to that checkout.
    """
    package = Path(__file__).resolve().parent.parent  # kvcache_core/, above commands/
    checkout = package.parent
    found = _installed_requirement(metadata.distributions(name=_DISTRIBUTION), package)
    if found is not None:
        return found
    if (checkout / "pyproject.toml").is_file():
        return f"{_DISTRIBUTION} @ {checkout.as_uri()}"
    # Neither installed nor a checkout (a copied tree): the release this is, from an index.
    return requirement_for(_own_version(), None)


def _installed_requirement(dists: Iterable[metadata.Distribution], package: Path) -> str | None:
    """The requirement for the first of ``dists`` that installed ``package`` (a directory
    holding kvcache_core), or None."""
    checkout = package.parent
    for dist in dists:
        home = Path(str(dist.locate_file(""))).resolve()
        direct = dist.read_text("direct_url.json")
        if direct is not None:
            try:
                url = json.loads(direct).get("url", "")
            except (ValueError, AttributeError):
                continue
            # An install from this very checkout (editable or not): the checkout is the source.
            if isinstance(url, str) and url.rstrip("/") == checkout.as_uri().rstrip("/"):
                return requirement_for(dist.version, direct)
        if home == checkout and (checkout / "pyproject.toml").is_file():
            continue  # the checkout's own egg-info: build metadata, not an install
        if Path(str(dist.locate_file("kvcache_core"))).resolve() == package:
            return requirement_for(dist.version, direct)
    return None


def _own_version() -> str:
    from .. import __version__

    return __version__


def render(
    name: str,
    module: str,
    kind: str,
    *,
    storage: str = "full",
    requirement: str | None = None,
) -> dict[str, str]:
    """``{relative path: text}`` of the package for pool ``name`` in importable ``module``.

    :param kind: One of [`KINDS`][kvcache_core.commands.scaffold.KINDS].
    :param storage: One of [`STORAGES`][kvcache_core.commands.scaffold.STORAGES].
    :param requirement: The package's requirement on kvcache (default: where this kvcache came
        from, [`kvcache_requirement`][kvcache_core.commands.scaffold.kvcache_requirement]).
    :raises ValueError: An unknown kind, or a storage the kind does not offer.
    """
    if kind not in KINDS:
        raise ValueError(f"unknown kind {kind!r} (kinds: {', '.join(KINDS)})")
    problem = storage_problem(kind, storage)
    if problem is not None:
        raise ValueError(problem)
    files = _COMMON + _KIND_FILES[kind]
    if storage != "full":
        files = tuple(
            _Template("mha/pool_quantized.py.tmpl", t.target)
            if t.source == "mha/pool.py.tmpl"
            else t
            for t in files
        )
    values = {
        "__NAME__": name,
        "__MODULE__": module,
        "__CLASS__": _class_name(module),
        "__KIND_NOTE__": _KIND_NOTES[kind],
        "__KIND__": kind,
        "__STORAGE_NOTE__": "" if storage == "full" else f", {storage} storage",
        "__STORAGE__": storage,
        "__QUANT_DTYPE__": _QUANT_DTYPES.get(storage, ""),
        "__REQUIREMENT__": requirement if requirement is not None else kvcache_requirement(),
    }
    out: dict[str, str] = {}
    for template in files:
        text = _template(template.source)
        target = template.target
        for key, value in values.items():
            text = text.replace(key, value)
            target = target.replace(key, value)
        out[target] = text
    return out
