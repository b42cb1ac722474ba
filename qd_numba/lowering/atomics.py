"""Atomic read-modify-writes that no target has as one instruction for every type: multiply and
exchange.

* ``mul``: a compare-and-swap loop on the element's bits (no target has an atomic multiply).
* ``xchg``: ``atomicrmw xchg`` on the element's bits as an integer (libNVVM rejects float
  ``xchg``, and the integer form is the same instruction on the CPU).

Each is relaxed (``monotonic``), as the other qd atomics. ``element_atomic`` (lowering/field.py)
calls :func:`emit_rmw` for the ops in :data:`RMW_OPS`; compare-and-swap is
lowering/atomic_cas.py.
"""

from __future__ import annotations

from llvmlite import ir as llir


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
