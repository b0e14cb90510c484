"""A deliberately small typing stub of torch for kvcache's types level.

Why: mypy over code that imports the real torch spends ~12 s and ~660 MB on a cold cache, while
the types level only compares *interfaces*. The names below are what the contract and the
built-in plugins' signatures (and the attribute-defining ``__init__`` bodies mypy still reads)
need; anything else is ``Incomplete`` through the module ``__getattr__``, so an unknown torch name
never produces a false finding. tests/types_level/test_stubs_honest.py keeps every declared name
honest against the installed torch with mypy's stubtest.
"""

from typing import final

from _typeshed import Incomplete
from torch._C import TensorBase

@final
class dtype:
    @property
    def is_floating_point(self) -> bool: ...
    @property
    def is_signed(self) -> bool: ...
    @property
    def itemsize(self) -> int: ...

@final
class device:
    def __new__(cls, type: str | device | int, index: int | None = None) -> device: ...
    @property
    def type(self) -> str: ...
    @property
    def index(self) -> int | None: ...

class Tensor(TensorBase):
    def __repr__(self, *, tensor_contents: Incomplete | None = None) -> str: ...

bfloat16: dtype
float16: dtype
float32: dtype
int64: dtype
int32: dtype
uint8: dtype

def __getattr__(name: str) -> Incomplete: ...
