"""Iteration spaces of top-level loops, in compiled code.

The loop canonicaliser (passes/offload.py) turns every top-level ``for`` into a flat loop
``for flat in range(space_total(space))`` plus ``idx = space_index(space, flat)``, where a
*space* is a tuple of ``(start, stop, step)`` int64 triples, one per dimension, last
dimension fastest (row-major, as Quadrants). The helpers here build spaces from
``range(...)`` arguments, ``qd.ndrange`` arguments and field/ndarray shapes.
"""

from __future__ import annotations

from numba.core import types
from numba.extending import overload, register_jitable

from ..typing.field import FieldType


def range_dim(*args):
    raise NotImplementedError("compiled code only")


def ndrange_dim(arg):
    raise NotImplementedError("compiled code only")


def shape_space(x):
    raise NotImplementedError("compiled code only")


def space_total(space):
    raise NotImplementedError("compiled code only")


def space_index(space, flat):
    raise NotImplementedError("compiled code only")


@register_jitable
def _count(start, stop, step):
    if step > 0:
        return max(0, (stop - start + step - 1) // step)
    return max(0, (start - stop - step - 1) // (-step))


def _int(t):
    return isinstance(t, (types.Integer, types.Boolean))


@overload(range_dim)
def _range_dim(*args):
    if len(args) == 1 and isinstance(args[0], types.StarArgTuple):
        args = tuple(args[0])
    if not 1 <= len(args) <= 3 or not all(_int(a) for a in args):
        return None
    n = len(args)
    if n == 1:
        return lambda *args: ((0, types.int64(args[0]), 1),)
    if n == 2:
        return lambda *args: ((types.int64(args[0]), types.int64(args[1]), 1),)

    def impl(*args):
        if args[2] == 0:
            raise ValueError("range() arg 3 must not be zero")
        return ((types.int64(args[0]), types.int64(args[1]), types.int64(args[2])),)

    return impl


@overload(ndrange_dim)
def _ndrange_dim(arg):
    if _int(arg):
        return lambda arg: (0, types.int64(arg), 1)
    if isinstance(arg, types.BaseTuple) and len(arg) == 2 and all(_int(t) for t in arg):
        return lambda arg: (types.int64(arg[0]), types.int64(arg[1]), 1)
    return None


_GEN_CACHE: dict = {}


def _generated(kind: str, ndim: int):
    """Per-ndim implementations, generated once (tuples need a static length)."""
    key = (kind, ndim)
    if key in _GEN_CACHE:
        return _GEN_CACHE[key]
    if kind == "shape":
        items = ", ".join(f"(0, np.int64(s[{d}]), 1)" for d in range(ndim))
        src = f"def impl(x):\n    s = x.shape\n    return ({items}{',' if ndim == 1 else ''})\n"
    elif kind == "total":
        terms = " * ".join(f"_count(space[{d}][0], space[{d}][1], space[{d}][2])" for d in range(ndim)) or "1"
        src = f"def impl(space):\n    return np.int64({terms})\n"
    else:  # index
        lines = ["def impl(space, flat):", "    rest = np.int64(flat)"]
        for d in reversed(range(ndim)):
            if d == 0:
                lines.append("    k0 = rest")
            else:
                lines.append(f"    c{d} = _count(space[{d}][0], space[{d}][1], space[{d}][2])")
                lines.append(f"    k{d} = rest % c{d}")
                lines.append(f"    rest = rest // c{d}")
        idx = ", ".join(f"space[{d}][0] + k{d} * space[{d}][2]" for d in range(ndim))
        lines.append(f"    return ({idx}{',' if ndim == 1 else ''})")
        src = "\n".join(lines) + "\n"
    import numpy as np

    ns = {"np": np, "_count": _count}
    exec(compile(src, f"<qd_numba.spaces.{kind}{ndim}>", "exec"), ns)
    _GEN_CACHE[key] = ns["impl"]
    return ns["impl"]


@overload(shape_space)
def _shape_space(x):
    if isinstance(x, FieldType):
        return _generated("shape", x.ndim)
    if isinstance(x, types.Array):
        return _generated("shape", x.ndim)
    return None


def _is_space(space):
    return isinstance(space, types.BaseTuple) and all(
        isinstance(d, types.BaseTuple) and len(d) == 3 for d in space
    )


@overload(space_total)
def _space_total(space):
    if _is_space(space):
        return _generated("total", len(space))
    return None


@overload(space_index)
def _space_index(space, flat):
    if _is_space(space) and _int(flat):
        return _generated("index", len(space))
    return None
