"""Names a package exports but imports on first use (PEP 562), for the lazy faces:
``kvcache_core``, ``kvcache_core.contracts`` and ``kvcache_core.integrations.vllm`` (whose
``KVCacheConnector`` imports vLLM, which its pool does not need).

Why lazy: ``kvcache_core.pytest_plugin`` is loaded by every pytest run where kvcache is
installed, and the source-only commands (``kvcache drift``, ``kvcache check --level source``)
read the contract's history and signatures; none of them may pay for a torch import (about
2.7 s here) unless they use a name that needs it.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from typing import Any

__all__ = ["lazy_exports"]


def lazy_exports(
    namespace: dict[str, Any], table: Mapping[str, str]
) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """The module ``__getattr__`` and ``__dir__`` of a package that exports lazily.

    :param namespace: The package's ``globals()``; a name, once imported, is stored there so
        later lookups never reach ``__getattr__`` again.
    :param table: Public name -> the submodule that defines it, relative to the package
        (``".contracts"``).
    """
    package = namespace["__name__"]

    def __getattr__(name: str) -> Any:
        module = table.get(name)
        if module is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(module, package), name)
        namespace[name] = value  # later lookups skip this function
        return value

    def __dir__() -> list[str]:
        return sorted(set(namespace) | set(table))

    return __getattr__, __dir__
