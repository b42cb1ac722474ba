"""``element_cas(f, idx, expected, desired) -> old``: atomic compare-and-swap of one scalar integer
element of a field or array (``qd.atomic_cas``), one relaxed ``cmpxchg``.

Integers only, as in Quadrants: for floats, bitwise and numeric equality differ (``-0.0``, NaN).
"""

from __future__ import annotations

from numba.core import types
from numba.extending import intrinsic

from ..errors import QuadrantsTypeError, typing_error
from .field import _component_pointers, _index_arity, _layout, check_index


@intrinsic
def element_cas(typingctx, f, idx, expected, desired):
    """``old = f[idx]; if old == expected: f[idx] = desired``, atomically; returns ``old``."""
    layout = _layout(f)
    if layout is None:
        return None
    dtype, ndim, elem_shape = layout[0], layout[1], layout[2]
    component = bool(elem_shape) and _index_arity(idx) == ndim + len(elem_shape)
    check_index(f, idx, "update", component=component)
    if elem_shape and not component:
        raise typing_error(QuadrantsTypeError(
            f"qd.atomic_cas needs a scalar target: index the vector/matrix component too (x[i][j]), got {f}"))
    if not isinstance(dtype, types.Integer):
        raise typing_error(QuadrantsTypeError(f"qd.atomic_cas supports integer types only, got {dtype}"))
    for name, ty in (("expected", expected), ("desired", desired)):
        if not isinstance(types.unliteral(ty), (types.Integer, types.Boolean)):
            raise typing_error(QuadrantsTypeError(f"qd.atomic_cas: {name} must be an integer, got {ty}"))

    def codegen(context, builder, sig, args):
        fty, idxty, ety, dty = sig.args
        ptr = _component_pointers(context, builder, fty, args[0], idxty, args[1], write=True)[0]
        want = context.cast(builder, args[2], ety, dtype)
        new = context.cast(builder, args[3], dty, dtype)
        return builder.extract_value(builder.cmpxchg(ptr, want, new, "monotonic", "monotonic"), 0)

    return dtype(f, idx, expected, desired), codegen
