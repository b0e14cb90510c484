"""The two torch._C classes ``torch.Tensor`` derives from, so the stub's MRO is the real one."""

from _typeshed import Incomplete
from typing_extensions import disjoint_base

class _TensorMeta(type): ...

@disjoint_base
class TensorBase(metaclass=_TensorMeta): ...

def __getattr__(name: str) -> Incomplete: ...
