"""``qd.lang.ops``: the operations of Quadrants' ``quadrants.lang.ops`` that qd_numba has, under the
same names (the objects are the ones ``qd.*`` exports: math.py, the atomics and ``random`` of
this package). Operations qd_numba does not have are absent.
"""

from __future__ import annotations

from ..math import (  # noqa: F401
    abs,
    acos,
    asin,
    atan2,
    cast,
    ceil,
    cos,
    exp,
    floor,
    log,
    max,
    min,
    pow,
    round,
    rsqrt,
    sin,
    sqrt,
    tan,
    tanh,
)
from . import (  # noqa: F401
    atomic_add,
    atomic_and,
    atomic_max,
    atomic_min,
    atomic_or,
    atomic_sub,
    atomic_xor,
    random,
)

__all__ = ["abs", "acos", "asin", "atan2", "atomic_add", "atomic_and", "atomic_max", "atomic_min", "atomic_or",
           "atomic_sub", "atomic_xor", "cast", "ceil", "cos", "exp", "floor", "log", "max", "min", "pow",
           "random", "round", "rsqrt", "sin", "sqrt", "tan", "tanh"]
