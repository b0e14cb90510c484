"""Store keys of vLLM's KV blocks: a chained hash of the token ids, seeded by a fingerprint.

Why chained: a block's KV depends on every token before it, not only on its own, so block
``i``'s key hashes block ``i - 1``'s digest together with its own token ids; two prompts share
keys exactly as far as they share whole blocks. Why a fingerprint: the same tokens give other
KV under another model, dtype, block size or layer geometry, so everything that makes KV
reusable is hashed into the first link (and written into each snapshot's meta, where the loader
checks it again). BLAKE2b, not a fast non-cryptographic hash: a key collision would load
another prompt's KV, and a prompt crafted to collide with someone else's must stay infeasible.
Nothing here imports torch or vLLM.
"""

from __future__ import annotations

import hashlib
import json
import os
from array import array
from collections.abc import Mapping, Sequence

__all__ = ["BlockKeys", "fingerprint_of", "weights_signature"]

_DIGEST = 16  # bytes of each link: 128 bits


def fingerprint_of(facts: Mapping[str, object]) -> str:
    """A short hex digest of ``facts`` (JSON-serialisable values), independent of key order."""
    text = json.dumps(dict(facts), sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.blake2b(text.encode(), digest_size=_DIGEST).hexdigest()


def weights_signature(model: str) -> str | None:
    """A cheap signature of a local model directory's weight files, or None for a hub name.

    Names, sizes and the first and last MiB of every ``*.safetensors`` / ``*.bin`` file: two
    checkpoints saved to the same path differ there (the safetensors header lists every
    tensor's offsets and the data starts right after it), at a cost of microseconds whatever
    the model's size. Not a proof of identity: a model edited only in its middle bytes keeps
    its signature, which is why a deployment can also name the model (``model_id``).
    """
    if not os.path.isdir(model):
        return None
    digest = hashlib.blake2b(digest_size=_DIGEST)
    edge = 1 << 20
    for name in sorted(os.listdir(model)):
        if not name.endswith((".safetensors", ".bin")):
            continue
        path = os.path.join(model, name)
        size = os.path.getsize(path)
        digest.update(f"{name}:{size}:".encode())
        with open(path, "rb") as fh:
            digest.update(fh.read(edge))
            if size > edge:
                fh.seek(max(edge, size - edge))
                digest.update(fh.read(edge))
    return digest.hexdigest()


class BlockKeys:
    """The keys of one request's full blocks, extended as its tokens grow.

    :param fingerprint: What makes KV reusable (``fingerprint_of`` of the engine's facts).
    :param block_size: Tokens per block.
    :param prefix: Prepended to every key (a namespace in a shared store).
    """

    def __init__(self, fingerprint: str, block_size: int, prefix: str = "kvcache-vllm/") -> None:
        if block_size <= 0:
            raise ValueError(f"block_size must be positive, got {block_size}")
        self.fingerprint = fingerprint
        self.block_size = block_size
        self.prefix = prefix
        self._links: list[bytes] = []
        self._keys: list[str] = []
        self._seed = hashlib.blake2b(fingerprint.encode(), digest_size=_DIGEST).digest()

    @property
    def computed(self) -> list[str]:
        """Every key computed so far (the request's full blocks at the last ``keys`` call)."""
        return list(self._keys)

    def keys(self, token_ids: Sequence[int], blocks: int | None = None) -> list[str]:
        """Keys of the first ``blocks`` full blocks of ``token_ids`` (all full blocks when None).

        ``token_ids`` must extend the tokens of earlier calls (a request's tokens only grow);
        keys already computed are reused, so a decoding request hashes each block once.
        """
        full = len(token_ids) // self.block_size
        want = full if blocks is None else min(blocks, full)
        bs = self.block_size
        while len(self._keys) < want:
            i = len(self._keys)
            previous = self._links[-1] if self._links else self._seed
            tokens = array("q", token_ids[i * bs : (i + 1) * bs]).tobytes()
            link = hashlib.blake2b(previous + tokens, digest_size=_DIGEST).digest()
            self._links.append(link)
            self._keys.append(f"{self.prefix}{self.fingerprint[:16]}/{link.hex()}")
        return self._keys[:want]
