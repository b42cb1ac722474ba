"""Elementwise ops without adjoint rules, as a table in the form of ops/math_ops.py's: bit
operations (``bit_shr``, ``clz``, ``popcnt``, ``ffs``) and float tests (``isnan``, ``isinf``).

ops/elementwise.py types, lowers and runs (Python scope) these rows exactly as the math ops'; a
kernel differentiated through one of them is an error naming the call (``kernel.grad`` has no
rule for it; ``qd.stop_grad`` its argument). Integer-only ops reject floats with a ``TypingError`` (a
``QuadrantsTypeError`` naming the line in a kernel).

Semantics, as Quadrants': ``bit_shr`` is a logical shift of the first operand's type;
``clz``/``popcnt``/``ffs`` count over the unsigned bit pattern and give an ``i32`` (``clz(0)`` is
the width, ``ffs(0)`` is 0); ``isnan``/``isinf`` give ``i32`` 1/0.
"""

from __future__ import annotations

import numpy as np
from llvmlite import ir as llir
from numba.core import errors, types

from ..dtypes import i32
from ..typing.matrix import arith_dtype, default_float
from .math_ops import MathOp

# -- dtype rules --------------------------------------------------------------------------------------

def _integer(name, t):
    if not isinstance(t, types.Integer):
        raise errors.TypingError(f"qd.{name} takes integers, got {t}")
    return t


def _int_rule(name, result=None):
    """Integer operands of one dtype; the result is that dtype (or ``result``)."""
    def rule(common, dtypes):
        c = _integer(name, common())
        return [c] * len(dtypes), result or c
    return rule


def _shift_rule(common, dtypes):
    """Shifts keep the type of the shifted value (as in C), whatever the shift count's type."""
    c = _integer("bit_shr", arith_dtype(dtypes[0]))
    _integer("bit_shr", arith_dtype(dtypes[1]))
    return [c, c], c


def _float_test_rule(common, dtypes):
    c = default_float(common())
    return [c], i32


# -- scalar emitters ---------------------------------------------------------------------------------

def _emit_isnan(context, builder, t, x):
    return builder.zext(builder.fcmp_unordered("uno", x, x), llir.IntType(32))


def _emit_isinf(context, builder, t, x):
    inf = x.type(float("inf"))
    neg_inf = x.type(float("-inf"))
    hit = builder.or_(builder.fcmp_ordered("==", x, inf), builder.fcmp_ordered("==", x, neg_inf))
    return builder.zext(hit, llir.IntType(32))


def _bit_count(llvm_name, zero_flag):
    """``llvm.ctlz``/``cttz`` (defined at zero: the bit width) or ``llvm.ctpop``, as an i32."""
    def emit(context, builder, t, x):
        args = [x, llir.IntType(1)(0)] if zero_flag else [x]
        fnty = llir.FunctionType(x.type, [a.type for a in args])
        n = builder.call(builder.module.declare_intrinsic(llvm_name, [x.type], fnty), args)
        return context.cast(builder, n, getattr(types, f"int{t.bitwidth}"), i32)
    return emit


def _emit_ffs(context, builder, t, x):
    """1 + the index of the lowest set bit; 0 for 0 (CUDA's ``__ffs``)."""
    tz = _bit_count("llvm.cttz", True)(context, builder, t, x)
    is_zero = builder.icmp_unsigned("==", x, x.type(0))
    return builder.select(is_zero, llir.IntType(32)(0), builder.add(tz, llir.IntType(32)(1)))


def _emit_bit_shr(context, builder, t, x, n):
    return builder.lshr(x, n)


# numpy forms of the integer ops: the bit pattern as unsigned integers of the operand's width
def _unsigned(x):
    return x.astype(np.dtype(f"u{x.dtype.itemsize}"))


def _bits(x):
    return 8 * x.dtype.itemsize


def _np_clz(x):
    u = _unsigned(x)
    return _bits(x) - sum(((u >> np.uint64(b).astype(u.dtype)) != 0).astype(np.int32) for b in range(_bits(x)))


def _np_popcnt(x):
    u = _unsigned(x)
    return sum(((u >> np.uint64(b).astype(u.dtype)) & 1).astype(np.int32) for b in range(_bits(x)))


def _np_ffs(x):
    u = _unsigned(x)
    one = np.ones((), u.dtype)
    trailing = sum(((u & ((one << np.uint64(b + 1).astype(u.dtype)) - one)) == 0).astype(np.int32)
                   for b in range(_bits(x)))
    return np.where(u == 0, 0, trailing + 1)


def _np_bit_shr(x, n):
    return (_unsigned(x) >> n.astype(_unsigned(x).dtype)).astype(x.dtype)


def _row(name, arity, float_result, emit, numpy, rule=None):
    return MathOp(name, arity, float_result, emit, numpy, adjoint=None, rule=rule)


BIT_OPS = {op.name: op for op in (
    _row("isnan", 1, True, _emit_isnan, np.isnan, rule=_float_test_rule),
    _row("isinf", 1, True, _emit_isinf, np.isinf, rule=_float_test_rule),
    _row("clz", 1, False, _bit_count("llvm.ctlz", True), _np_clz, rule=_int_rule("clz", i32)),
    _row("popcnt", 1, False, _bit_count("llvm.ctpop", False), _np_popcnt, rule=_int_rule("popcnt", i32)),
    _row("ffs", 1, False, _emit_ffs, _np_ffs, rule=_int_rule("ffs", i32)),
    _row("bit_shr", 2, False, _emit_bit_shr, _np_bit_shr, rule=_shift_rule),
)}
