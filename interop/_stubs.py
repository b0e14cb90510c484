"""Stand-ins for the modules sglang's ``mem_cache`` imports but never needs on CPU.

Why: sglang 0.5.14 is installed with ``--no-deps`` (its full dependency set is GPU kernels and
a serving stack, gigabytes), so its module-level imports of triton, kernel packages and serving
libraries have nothing to find. A finder placed *last* on ``sys.meta_path`` answers only for
modules nothing else can import, outside ``sglang``, with a module whose every attribute is a
permissive placeholder: a class you can call, subclass, decorate with, index and iterate.
Nothing the differential run exercises (CPU pools and allocators) calls into these.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import sys
import types
from typing import Any


class _Anything(type):
    """A metaclass whose classes answer every attribute, call, index and operator."""

    def __new__(mcs, name: str, bases: tuple[type, ...], ns: dict[str, Any], **kw: Any) -> Any:
        return super().__new__(mcs, name, bases, ns)  # class X(Stub, total=False) works

    def __init__(cls, name: str, bases: tuple[type, ...], ns: dict[str, Any], **kw: Any) -> None:
        super().__init__(name, bases, ns)

    def __getattr__(cls, name: str) -> Any:
        if name.startswith("__") and name.endswith("__"):
            raise AttributeError(name)
        return _placeholder(f"{cls.__name__}.{name}")

    def __call__(cls, *args: Any, **kwargs: Any) -> Any:
        if len(args) == 1 and callable(args[0]) and not kwargs:
            return args[0]  # used as a decorator: leave the function as it was
        return _placeholder(cls.__name__)

    def __getitem__(cls, item: Any) -> Any:
        return cls

    def __iter__(cls) -> Any:
        return iter(())

    def __bool__(cls) -> bool:
        return False

    def __enter__(cls) -> Any:
        return cls

    def __exit__(cls, *exc: Any) -> bool:
        return False

    def __setitem__(cls, item: Any, value: Any) -> None:
        return None

    def __contains__(cls, item: Any) -> bool:
        return False

    def __len__(cls) -> int:
        return 0

    def __or__(cls, other: Any) -> Any:
        return cls

    __ror__ = __or__


def _placeholder(name: str) -> Any:
    return _Anything(name.rsplit(".", 1)[-1], (), {"__module__": "interop_stub"})


class _StubModule(types.ModuleType):
    def __getattr__(self, name: str) -> Any:
        if name.startswith("__") and name.endswith("__"):
            raise AttributeError(name)
        return _placeholder(f"{self.__name__}.{name}")


class _StubLoader(importlib.abc.Loader):
    def create_module(self, spec: importlib.machinery.ModuleSpec) -> types.ModuleType:
        module = _StubModule(spec.name)
        module.__path__ = []  # a package, so submodules resolve through the finder too
        return module

    def exec_module(self, module: types.ModuleType) -> None:
        return None


class _ForcedFinder(importlib.abc.MetaPathFinder):
    """Answers *first* for the real sglang modules that are GPU kernels or serving machinery."""

    def __init__(self) -> None:
        self.prefixes: tuple[str, ...] = ()

    def find_spec(self, fullname: str, path: Any, target: Any = None) -> Any:
        if any(fullname == p or fullname.startswith(p + ".") for p in self.prefixes):
            return importlib.machinery.ModuleSpec(fullname, _StubLoader(), is_package=True)
        return None


FORCED = _ForcedFinder()


class _LastResortFinder(importlib.abc.MetaPathFinder):
    def __init__(self, keep_real: tuple[str, ...]) -> None:
        self.keep_real = keep_real
        self.stubbed: list[str] = []

    def find_spec(self, fullname: str, path: Any, target: Any = None) -> Any:
        top = fullname.split(".")[0]
        if top in self.keep_real or top in sys.stdlib_module_names:
            return None  # real or absent on purpose (the stdlib probes for optional modules)
        self.stubbed.append(fullname)
        return importlib.machinery.ModuleSpec(fullname, _StubLoader(), is_package=True)


FINDER = _LastResortFinder(
    keep_real=("sglang", "torch", "numpy", "kvcache_core", "kvcache_plugins")
)


def hollow_package(name: str) -> None:
    """Register package ``name`` without running its ``__init__`` (submodules still import).

    For packages whose ``__init__`` imports every model config or kernel in the tree when
    ``mem_cache`` needs one leaf module.
    """
    import importlib.util

    spec = importlib.util.find_spec(name)
    if spec is None or spec.submodule_search_locations is None:
        raise ImportError(f"{name} is not an installed package")
    module = types.ModuleType(name)
    module.__path__ = list(spec.submodule_search_locations)
    module.__spec__ = spec
    sys.modules[name] = module


#: The sglang modules the differential run and the allocator benchmark replace by stand-ins
#: (GPU kernels and the serving stack, which ``mem_cache`` imports but CPU runs never use).
SGLANG_FORCED = (
    "triton",
    "sglang.jit_kernel",
    "sglang.srt.layers",
    "sglang.srt.distributed",
    "sglang.srt.server_args",
    "sglang.srt.model_executor",
    "sglang.srt.mem_cache.triton_ops",
    "sglang.srt.utils.async_probe",
)
#: Packages kept as empty shells (their ``__init__`` imports too much).
SGLANG_HOLLOW = ("sglang.srt.configs",)


def install(hollow: tuple[str, ...] = (), forced: tuple[str, ...] = ()) -> _LastResortFinder:
    """Put the stand-in finder last on ``sys.meta_path`` (once), hollow out ``hollow``, and
    replace the real modules under ``forced`` by stand-ins."""
    if FINDER not in sys.meta_path:
        sys.meta_path.append(FINDER)
    FORCED.prefixes = tuple(forced)
    if FORCED not in sys.meta_path:
        sys.meta_path.insert(0, FORCED)
    for name in hollow:
        hollow_package(name)
    return FINDER
