"""``qd.lang.ops``: the operations of Quadrants' ``quadrants.lang.ops`` that qd_numba has, under the
same names (the objects are the ones ``qd.*`` exports: qd.math, the atomics and ``random`` of
this package). Operations qd_numba does not have are absent.
"""

from __future__ import annotations

from ..math import (  # noqa: F401
    abs,
    acos,
    asin,
    atan,
    atan2,
    bit_cast,
    bit_shr,
    cast,
    ceil,
    cos,
    exp,
    floor,
    frexp,
    log,
    max,
    min,
    pow,
    raw_div,
    raw_mod,
    round,
    rsqrt,
    select,
    sin,
    sqrt,
    tan,
    tanh,
)
from ..ops.atomics import atomic_cas, atomic_exchange, atomic_mul  # noqa: F401
from ..ops.volatile import volatile_load  # noqa: F401
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

__all__ = ["abs", "acos", "asin", "atan", "atan2", "atomic_add", "atomic_and", "atomic_cas", "atomic_exchange",
           "atomic_max", "atomic_min", "atomic_mul", "atomic_or", "atomic_sub", "atomic_xor", "bit_cast", "bit_shr",
           "cast", "ceil", "cos", "exp", "floor", "frexp", "log", "max", "min", "pow", "random", "raw_div", "raw_mod",
           "round", "rsqrt", "select", "sin", "sqrt", "tan", "tanh", "volatile_load"]
