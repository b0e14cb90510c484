"""vLLM serves on kvcache: a KV connector whose blocks are a kvcache pool and whose snapshots
travel through kvcache's snapshot stores.

* ``VLLMBlockPool``: the KV tensors vLLM's CPU
  backend registers, seen as a kvcache pool (``KVPool`` + ``OffloadablePool``, paged); its
  snapshots are ``mha`` snapshots. Needs torch only.
* ``KVCacheConnector``: the vLLM v1 KV connector (``kv_connector="KVCacheConnector"``, or this
  module's path as ``kv_connector_module_path``). Importing it imports vLLM; nothing else in
  this module does.
* ``register``: the ``vllm.general_plugins`` entry point that registers the connector by name.

docs/integrations/vllm.md has the install, the two-instance recipe, the key scheme, the
failure semantics and what is not supported yet.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .._lazy import lazy_exports
from ._vllm_keys import BlockKeys, fingerprint_of
from ._vllm_pool import VLLMBlockPool, vllm_cpu_pool_spec

if TYPE_CHECKING:
    from ._vllm_connector import (
        KVCacheConnector,
        KVCacheConnectorMetadata,
        engine_fingerprint,
        register,
    )

__all__ = [
    "BlockKeys",
    "KVCacheConnector",
    "KVCacheConnectorMetadata",
    "VLLMBlockPool",
    "engine_fingerprint",
    "fingerprint_of",
    "register",
    "vllm_cpu_pool_spec",
]

_VLLM_NAMES = ("KVCacheConnector", "KVCacheConnectorMetadata", "engine_fingerprint", "register")
__getattr__, __dir__ = lazy_exports(
    globals(), dict.fromkeys(_VLLM_NAMES, "kvcache_core.integrations._vllm_connector")
)
