"""The math operations of ``qd.*`` as one table: a row per op, with everything about it.

A row gives the op's arity, its dtype rule, its scalar emitter for compiled code
(``emit(context, builder, dtype, *values)``: ``dtype`` the first argument's compute dtype; returns a
value of the result dtype), its numpy implementation for Python scope, and its reverse-mode
adjoint rule.

Dtype rules: ``rule(common, dtypes) -> (compute dtype per argument, result dtype)``, ``dtypes`` the
element dtype of each argument and ``common(indices=None)`` the operand dtype of those arguments
(the matrix operator rules; ``select``'s condition is cast to a boolean); ops/bit_ops.py's rows use
them too. The other rows use ``float_result``
instead: ``True`` computes in the default float (integers give ``f32``), ``False`` in the operand
dtype.

Adjoint rules: ``adjoint(args, out, g, qd) -> tuple`` with one gradient per argument, written
with Python operators and the math functions of ``qd`` (the ``qd_numba.math`` module, passed in:
it is built from this table), so one rule works on numpy values, on scalars, and inside compiled
code. ``needs_out``: the rule reads the primal
result (an autodiff pass keeps or recomputes it); every rule reads its arguments. The tests
check each rule against central finite differences (tests/test_math_ops.py).
"""

from __future__ import annotations

import builtins
import dataclasses
import math
import operator
from collections.abc import Callable

import numpy as np
from numba.core import types
from numba.core.typing.templates import signature

from ..lowering.matrix import scalar_binop, scalar_select, scalar_sqrt
from ..typing.matrix import default_float


@dataclasses.dataclass(frozen=True)
class MathOp:
    name: str
    arity: int
    float_result: bool                 # integer operands compute in the default float type
    emit: Callable                     # (context, builder, dtype, *llvm values) -> llvm value
    numpy: Callable                    # (*arrays in the compute dtype) -> array
    adjoint: Callable | None           # (args, out, g, qd) -> gradients, one per argument
    needs_out: bool = False            # the adjoint reads the primal result
    rule: Callable | None = None       # (common, dtypes) -> (arg dtypes, result dtype); None: float_result

    def dtypes(self, common, dtypes):
        """(compute dtype per argument, result dtype) of a call with element dtypes ``dtypes``."""
        if self.rule is not None:
            return self.rule(common, dtypes)
        c = common()
        c = default_float(c) if self.float_result else c
        return [c] * len(dtypes), c


# -- scalar emitters ----------------------------------------------------------------------------

def _math_fn(pyfunc):
    def emit(context, builder, t, *vals):
        return context.get_function(pyfunc, signature(t, *([t] * len(vals))))(builder, vals)

    return emit


def _intrinsic_fn(llvm_name):
    def emit(context, builder, t, x):
        if not isinstance(t, types.Float):
            return x
        fn = builder.module.declare_intrinsic(llvm_name, [x.type])
        return builder.call(fn, [x])

    return emit


def _emit_round(context, builder, t, x):
    """Half away from zero, from ``llvm.floor``/``llvm.ceil`` (libNVVM rejects ``llvm.round``,
    and ``llvm.trunc``/``llvm.fabs`` in some versions): ``floor(x) + (x - floor(x) >= 0.5)`` for
    ``x >= 0``, ``ceil(x) - (ceil(x) - x >= 0.5)`` below; both differences are exact."""
    if not isinstance(t, types.Float):
        return x
    floor = builder.call(builder.module.declare_intrinsic("llvm.floor", [x.type]), [x])
    ceil = builder.call(builder.module.declare_intrinsic("llvm.ceil", [x.type]), [x])
    one, zero, half = x.type(1.0), x.type(0.0), x.type(0.5)
    up = builder.fadd(floor, builder.select(builder.fcmp_ordered(">=", builder.fsub(x, floor), half), one, zero))
    down = builder.fsub(ceil, builder.select(builder.fcmp_ordered(">=", builder.fsub(ceil, x), half), one, zero))
    return builder.select(builder.fcmp_ordered(">=", x, zero), up, down)


def _emit_rsqrt(context, builder, t, x):
    one = context.get_constant(t, 1.0)
    return scalar_binop(context, builder, operator.truediv, t, one, scalar_sqrt(context, builder, t, x))


def _emit_abs(context, builder, t, x):
    return context.get_function(builtins.abs, signature(t, t))(builder, (x,))


def _emit_pow(context, builder, t, x, y):
    return scalar_binop(context, builder, operator.pow, t, x, y)


def _emit_min(context, builder, t, x, y):
    return scalar_select(context, builder, operator.lt, t, x, y)


def _emit_max(context, builder, t, x, y):
    return scalar_select(context, builder, operator.gt, t, x, y)


def _emit_clamp(context, builder, t, x, lo, hi):
    return _emit_min(context, builder, t, _emit_max(context, builder, t, x, lo), hi)


def _emit_fract(context, builder, t, x):
    if not isinstance(t, types.Float):
        return x.type(0)
    return builder.fsub(x, _intrinsic_fn("llvm.floor")(context, builder, t, x))


def _emit_sign(context, builder, t, x):
    one, zero = x.type(1.0), x.type(0.0)
    pos = builder.select(builder.fcmp_ordered(">=", x, zero), one, zero)
    return builder.fsub(pos, builder.select(builder.fcmp_ordered("<=", x, zero), one, zero))


def _emit_step(context, builder, t, edge, x):
    return builder.select(builder.fcmp_ordered(">=", x, edge), x.type(1.0), x.type(0.0))


def _emit_raw_div(context, builder, t, x, y):
    """C division: integers truncate toward zero."""
    if isinstance(t, types.Float):
        return builder.fdiv(x, y)
    return (builder.sdiv if t.signed else builder.udiv)(x, y)


def _emit_raw_mod(context, builder, t, x, y):
    """C remainder: the sign of the dividend (``fmod`` for floats)."""
    if isinstance(t, types.Float):
        return builder.frem(x, y)
    return (builder.srem if t.signed else builder.urem)(x, y)


def _emit_select(context, builder, t, cond, x, y):
    return builder.select(cond, x, y)


def _np_raw_div(x, y):
    if x.dtype.kind == "f":
        return x / y
    q = x // y
    return q + ((q < 0) & (q * y != x))


def _select_rule(common, dtypes):
    c = common([1, 2])
    return [types.boolean, c, c], c


def _np_round(x):
    if x.dtype.kind != "f":
        return x
    floor, ceil = np.floor(x), np.ceil(x)
    return np.where(x >= 0, floor + (x - floor >= 0.5), ceil - (ceil - x >= 0.5)).astype(x.dtype)


def _step(cond):
    """1.0 where ``cond`` holds, else 0.0 (numpy arrays and scalars alike)."""
    return cond * 1.0


# -- the table ------------------------------------------------------------------------------------

def _op(name, arity, float_result, emit, numpy, adjoint, needs_out=False, rule=None):
    return MathOp(name, arity, float_result, emit, numpy, adjoint, needs_out, rule)


MATH_OPS = {op.name: op for op in (
    _op("sin", 1, True, _math_fn(math.sin), np.sin, lambda a, out, g, qd: (g * qd.cos(a[0]),)),
    _op("cos", 1, True, _math_fn(math.cos), np.cos, lambda a, out, g, qd: (-g * qd.sin(a[0]),)),
    _op("tan", 1, True, _math_fn(math.tan), np.tan, lambda a, out, g, qd: (g * (1 + out * out),), needs_out=True),
    _op("asin", 1, True, _math_fn(math.asin), np.arcsin, lambda a, out, g, qd: (g / qd.sqrt(1 - a[0] * a[0]),)),
    _op("acos", 1, True, _math_fn(math.acos), np.arccos, lambda a, out, g, qd: (-g / qd.sqrt(1 - a[0] * a[0]),)),
    _op("atan", 1, True, _math_fn(math.atan), np.arctan, lambda a, out, g, qd: (g / (1 + a[0] * a[0]),)),
    _op("atan2", 2, True, _math_fn(math.atan2), np.arctan2,
        lambda a, out, g, qd: (g * a[1] / (a[0] * a[0] + a[1] * a[1]), -g * a[0] / (a[0] * a[0] + a[1] * a[1]))),
    _op("exp", 1, True, _math_fn(math.exp), np.exp, lambda a, out, g, qd: (g * out,), needs_out=True),
    _op("log", 1, True, _math_fn(math.log), np.log, lambda a, out, g, qd: (g / a[0],)),
    _op("sqrt", 1, True, _math_fn(math.sqrt), np.sqrt, lambda a, out, g, qd: (g * 0.5 / out,), needs_out=True),
    _op("rsqrt", 1, True, _emit_rsqrt, lambda x: x.dtype.type(1) / np.sqrt(x),
        lambda a, out, g, qd: (-0.5 * g * out / a[0],), needs_out=True),
    _op("tanh", 1, True, _math_fn(math.tanh), np.tanh, lambda a, out, g, qd: (g * (1 - out * out),), needs_out=True),
    _op("abs", 1, False, _emit_abs, np.abs, lambda a, out, g, qd: (g * (_step(a[0] > 0) - _step(a[0] < 0)),)),
    _op("floor", 1, False, _intrinsic_fn("llvm.floor"), np.floor, lambda a, out, g, qd: (g * 0,)),
    _op("ceil", 1, False, _intrinsic_fn("llvm.ceil"), np.ceil, lambda a, out, g, qd: (g * 0,)),
    _op("round", 1, False, _emit_round, _np_round, lambda a, out, g, qd: (g * 0,)),
    _op("pow", 2, False, _emit_pow, np.power,
        lambda a, out, g, qd: (g * a[1] * qd.pow(a[0], a[1] - 1), g * out * qd.log(a[0])), needs_out=True),
    _op("min", 2, False, _emit_min, np.minimum,
        lambda a, out, g, qd: (g * _step(a[0] <= a[1]), g * _step(a[0] > a[1]))),
    _op("max", 2, False, _emit_max, np.maximum,
        lambda a, out, g, qd: (g * _step(a[0] >= a[1]), g * _step(a[0] < a[1]))),
    _op("clamp", 3, False, _emit_clamp, lambda x, lo, hi: np.minimum(np.maximum(x, lo), hi),
        lambda a, out, g, qd: (g * _step((a[0] >= a[1]) & (a[0] <= a[2])), g * _step(a[0] < a[1]),
                               g * _step(a[0] > a[2]))),
    _op("log2", 1, True, _math_fn(math.log2), np.log2, lambda a, out, g, qd: (g / (a[0] * math.log(2.0)),)),
    _op("fract", 1, False, _emit_fract, lambda x: x - np.floor(x), lambda a, out, g, qd: (g,)),
    _op("sign", 1, True, _emit_sign, lambda x: (x >= 0).astype(x.dtype) - (x <= 0).astype(x.dtype),
        lambda a, out, g, qd: (g * 0,)),
    _op("raw_div", 2, False, _emit_raw_div, _np_raw_div,
        lambda a, out, g, qd: (g / a[1], -g * a[0] / (a[1] * a[1]))),
    _op("raw_mod", 2, False, _emit_raw_mod, np.fmod,
        lambda a, out, g, qd: (g, -g * qd.raw_div(a[0] - out, a[1])), needs_out=True),
    _op("select", 3, False, _emit_select, np.where,
        lambda a, out, g, qd: (g * 0, qd.select(a[0], g, g * 0), qd.select(a[0], g * 0, g)), rule=_select_rule),
    _op("step", 2, True, _emit_step, lambda edge, x: (x >= edge).astype(x.dtype), lambda a, out, g, qd: (g * 0, g * 0)),
)}


# -- operators --------------------------------------------------------------------------------------
# The adjoint rules of Python's arithmetic operators in kernels, in the same form as the math ops'
# (``operator.truediv`` also stands for the ``true_divide`` helper that ``a / b`` becomes).

OPERATOR_ADJOINTS = {
    operator.add: lambda a, out, g, qd: (g, g),
    operator.sub: lambda a, out, g, qd: (g, -g),
    operator.mul: lambda a, out, g, qd: (g * a[1], g * a[0]),
    operator.truediv: lambda a, out, g, qd: (g / a[1], -g * a[0] / (a[1] * a[1])),
    operator.pow: lambda a, out, g, qd: (g * a[1] * qd.pow(a[0], a[1] - 1), g * out * qd.log(a[0])),
    operator.neg: lambda a, out, g, qd: (-g,),
    operator.pos: lambda a, out, g, qd: (g,),
    operator.matmul: lambda a, out, g, qd: (qd.ad_matmul_adjoint(a[0], a[1], g, 0),
                                            qd.ad_matmul_adjoint(a[0], a[1], g, 1)),
}
