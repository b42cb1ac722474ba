"""Atomics without a native read-modify-write on every target: multiply, exchange, compare-and-swap.

* ``mul``: a compare-and-swap loop on the element's bits (no target has an atomic multiply).
* ``xchg``: ``atomicrmw xchg`` on the element's bits as an integer (libNVVM rejects float
  ``xchg``, and the integer form is the same instruction on the CPU).
* ``element_cas(f, idx, expected, desired) -> old``: ``cmpxchg`` on a scalar integer element (as in
  Quadrants, floats are rejected: bitwise and numeric equality differ for ``-0.0`` and NaN).

Each loop and instruction is relaxed (``monotonic``), as the other qd atomics. ``element_atomic``
(lowering/field.py) calls :func:`emit_rmw` for the ops in :data:`RMW_OPS`.
"""

from __future__ import annotations

from llvmlite import ir as llir
from numba.core import types
from numba.extending import intrinsic

from ..errors import QuadrantsTypeError, typing_error


def _int_view(builder, ptr, value):
    """``ptr`` as a pointer to an integer of the value's width, and a function from value to bits
    and back."""
    ity = llir.IntType(value.type.width) if isinstance(value.type, llir.IntType) \
        else llir.IntType(32 if isinstance(value.type, llir.FloatType) else 64)
    iptr = builder.bitcast(ptr, ity.as_pointer())
    if isinstance(value.type, llir.IntType):
        return iptr, (lambda v: v), (lambda bits: bits)
    return iptr, (lambda v: builder.bitcast(v, ity)), (lambda bits: builder.bitcast(bits, value.type))


def _cas_loop(builder, ptr, value, combine):
    """``*ptr = combine(*ptr)`` atomically by a compare-and-swap retry loop; returns the old value."""
    iptr, to_bits, from_bits = _int_view(builder, ptr, value)
    entry = builder.block
    initial = builder.load(iptr)
    loop = builder.append_basic_block("qd_cas_loop")
    done = builder.append_basic_block("qd_cas_done")
    builder.branch(loop)
    builder.position_at_end(loop)
    expected = builder.phi(iptr.type.pointee)
    expected.add_incoming(initial, entry)
    old = from_bits(expected)
    pair = builder.cmpxchg(iptr, expected, to_bits(combine(old)), "monotonic", "monotonic")
    expected.add_incoming(builder.extract_value(pair, 0), builder.block)
    builder.cbranch(builder.extract_value(pair, 1), done, loop)
    builder.position_at_end(done)
    return old


def _emit_mul(builder, ptr, value):
    mul = builder.mul if isinstance(value.type, llir.IntType) else builder.fmul
    return _cas_loop(builder, ptr, value, lambda old: mul(old, value))


def _emit_xchg(builder, ptr, value):
    iptr, to_bits, from_bits = _int_view(builder, ptr, value)
    return from_bits(builder.atomic_rmw("xchg", iptr, to_bits(value), "monotonic"))


RMW_OPS = {"mul": _emit_mul, "xchg": _emit_xchg}


def emit_rmw(builder, op: str, ptr, value):
    """Atomic ``*ptr = *ptr <op> value`` for an op of :data:`RMW_OPS`; returns the old value."""
    return RMW_OPS[op](builder, ptr, value)


@intrinsic
def element_cas(typingctx, f, idx, expected, desired):
    """``old = f[idx]; if old == expected: f[idx] = desired``, atomically; returns ``old``."""
    from .field import _component_pointers, _index_arity, _layout, check_index

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
        ptr = _component_pointers(context, builder, fty, args[0], idxty, args[1])[0]
        want = context.cast(builder, args[2], ety, dtype)
        new = context.cast(builder, args[3], dty, dtype)
        return builder.extract_value(builder.cmpxchg(ptr, want, new, "monotonic", "monotonic"), 0)

    return dtype(f, idx, expected, desired), codegen
