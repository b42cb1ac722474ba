"""The elementwise functions of ``qd.*``/``qd.math`` (``qd.sin``, ``qd.max``, ``qd.select``,
``qd.raw_mod`` ...), ``qd.cast``, ``qd.bit_cast`` and ``qd.frexp``: their Python-scope forms and
their typing and lowering in compiled code (qd_numba/math.py is the ``qd.math`` namespace).

Each function works in Python scope (numpy) and inside compiled code, on scalars and elementwise
on vectors/matrices; the binary ones (``pow atan2 min max``) and ``clamp`` broadcast scalars.
Result dtypes (one rule for both scopes; see ``qd_numba/typing/matrix.py``):

* ``sin cos tan asin acos atan atan2 exp log sqrt rsqrt tanh``: floats keep their type, integers
  compute in ``f32``.
* ``abs floor ceil round``: keep the type (``floor`` of a float is a float, as in Quadrants);
  ``round`` rounds half away from zero.
* ``pow min max clamp``: the operand dtype of the matrix operator rules (``pow`` is ``**``).
* ``cast(x, dtype)``: scalars and matrices, C-style (float to int truncates).

In compiled code every function is typed by one template and lowered by one function that emits
the target context's scalar implementation per element (``math.sin`` for ``sin`` ...) or an LLVM
intrinsic (``floor ceil round``), so no Python implementation is compiled per call site. What each
op is — arity, dtype rule, emitter, numpy implementation, adjoint rule — is one row of
``ops/math_ops.py`` (differentiable ops) or ``ops/bit_ops.py`` (the others: C division, bit
operations, float tests, ``select``).
"""

from __future__ import annotations

import numpy as np
from llvmlite import ir
from numba.core import errors, types
from numba.core.imputils import lower_builtin
from numba.core.typing.templates import AbstractTemplate, infer_global, signature

from ..dtypes import f32, i32, to_numba, to_numpy
from ..errors import QuadrantsTypeError
from ..lowering.matrix import cast_all, elements, pack
from ..matrix import Matrix, _nb_type, _wrap
from ..typing.matrix import (
    MatrixType,
    arith_dtype,
    broadcast_dtype,
    dtype_arg,
    is_scalar,
    promote,
    shape_str,
)
from .bit_ops import BIT_OPS
from .math_ops import MATH_OPS

_OPS = {**MATH_OPS, **BIT_OPS}   # every elementwise op: one row each

# ---------------------------------------------------------------------------------------------
# dtype rules shared by both scopes
# ---------------------------------------------------------------------------------------------


def _operand_dtype(name, arg_types):
    """Operand dtype and shape-giving MatrixType (or None) of an elementwise n-ary call."""
    mats = [t for t in arg_types if isinstance(t, MatrixType)]
    for t in arg_types:
        if not (isinstance(t, MatrixType) or is_scalar(t)):
            raise errors.TypingError(f"qd.{name} takes scalars or vectors/matrices, got {t}")
    for t in mats[1:]:
        if t.shape != mats[0].shape:
            raise errors.TypingError(
                f"shape mismatch in qd.{name}: {shape_str(mats[0])} and {shape_str(t)}")
    if not mats:
        dtype = arith_dtype(arg_types[0])
        for t in arg_types[1:]:
            dtype = promote(dtype, t)
        return dtype, None
    dtype = arith_dtype(mats[0].dtype)
    for t in arg_types:
        dtype = promote(dtype, t.dtype) if isinstance(t, MatrixType) else broadcast_dtype(dtype, t)
    return dtype, mats[0]


def _call_type(name, arg_types):
    """``(compute dtype per argument, result type)`` of ``qd.name(*args)`` (the row's dtype rule)."""
    arg_types = [t if isinstance(t, MatrixType) else types.unliteral(t) for t in arg_types]
    _, shape_of = _operand_dtype(name, arg_types)

    def common(indices=None):
        picked = arg_types if indices is None else [arg_types[i] for i in indices]
        return _operand_dtype(name, picked)[0]

    elem = [t.dtype if isinstance(t, MatrixType) else t for t in arg_types]
    computes, result = _OPS[name].dtypes(common, elem)
    return computes, (shape_of.with_dtype(result) if shape_of is not None else result)


# ---------------------------------------------------------------------------------------------
# Python scope (numpy) and compiled code, both from the table in ops/math_ops.py
# ---------------------------------------------------------------------------------------------


def _python_scope(name, args):
    try:
        computes, rt = _call_type(name, [_nb_type(a) for a in args])
    except errors.TypingError as e:
        raise QuadrantsTypeError(str(e)) from None
    arrays = [np.asarray(a.entries if isinstance(a, Matrix) else a).astype(to_numpy(c))
              for a, c in zip(args, computes, strict=True)]
    result = rt.dtype if isinstance(rt, MatrixType) else rt
    with np.errstate(all="ignore"):
        out = np.asarray(_OPS[name].numpy(*arrays)).astype(to_numpy(result))
    return _wrap(out) if isinstance(rt, MatrixType) else out[()]


# ---------------------------------------------------------------------------------------------
# compiled-code registration
# ---------------------------------------------------------------------------------------------


def _register(pyfunc, name, arity):
    class MathTemplate(AbstractTemplate):
        key = pyfunc

        def generic(self, args, kws):
            if kws or len(args) != arity:
                raise errors.TypingError(f"qd.{name} takes {arity} argument(s), got {len(args)}")
            return signature(_call_type(name, args)[1], *[types.unliteral(a) for a in args])

    infer_global(pyfunc)(MathTemplate)
    emit = _OPS[name].emit

    def lower(context, builder, sig, args):
        computes, rt = _call_type(name, sig.args)
        count = rt.count if isinstance(rt, MatrixType) else 1
        cols = []
        for t, v, compute in zip(sig.args, args, computes, strict=True):
            if isinstance(t, MatrixType):
                cols.append(cast_all(context, builder, elements(builder, v, t), t.dtype, compute))
            else:
                cols.append([context.cast(builder, v, t, compute)] * count)
        # the emitter's dtype: the first operand that is not a condition (select's is boolean)
        dtype = next((c for c in computes if c != types.boolean), computes[0])
        out = [emit(context, builder, dtype, *vals) for vals in zip(*cols, strict=True)]
        return pack(context, builder, rt, out) if isinstance(rt, MatrixType) else out[0]

    lower_builtin(pyfunc, types.VarArg(types.Any))(lower)


def _unary(name):
    def fn(x):
        return _python_scope(name, (x,))

    fn.__name__ = fn.__qualname__ = name
    fn.__doc__ = f"Elementwise ``{name}`` of a scalar, vector or matrix."
    return fn


def _binary(name):
    def fn(x, y):
        return _python_scope(name, (x, y))

    fn.__name__ = fn.__qualname__ = name
    fn.__doc__ = f"Elementwise ``{name}`` of scalars/vectors/matrices (scalars broadcast)."
    return fn


sin, cos, tan = _unary("sin"), _unary("cos"), _unary("tan")
asin, acos, atan = _unary("asin"), _unary("acos"), _unary("atan")
exp, log, sqrt, rsqrt, tanh = _unary("exp"), _unary("log"), _unary("sqrt"), _unary("rsqrt"), _unary("tanh")
abs, floor, ceil, round = _unary("abs"), _unary("floor"), _unary("ceil"), _unary("round")  # noqa: A001
atan2, pow, min, max = _binary("atan2"), _binary("pow"), _binary("min"), _binary("max")  # noqa: A001


def clamp(x, lo, hi):
    """``min(max(x, lo), hi)`` elementwise (scalars broadcast)."""
    return _python_scope("clamp", (x, lo, hi))


def select(cond, x, y):
    """``x`` where ``cond`` is non-zero, else ``y``, elementwise (scalars broadcast; both are computed)."""
    return _python_scope("select", (cond, x, y))


log2, fract, sign = _unary("log2"), _unary("fract"), _unary("sign")
isnan, isinf = _unary("isnan"), _unary("isinf")
clz, popcnt, ffs = _unary("clz"), _unary("popcnt"), _unary("ffs")
step, raw_div, raw_mod, bit_shr = _binary("step"), _binary("raw_div"), _binary("raw_mod"), _binary("bit_shr")

# registered once all names exist: infer_global checks that the module attribute is the function
for _fn in (sin, cos, tan, asin, acos, atan, exp, log, sqrt, rsqrt, tanh, abs, floor, ceil, round,
            atan2, pow, min, max, clamp, select, log2, fract, sign, isnan, isinf, clz, popcnt, ffs,
            step, raw_div, raw_mod, bit_shr):
    _register(_fn, _fn.__name__, _OPS[_fn.__name__].arity)


def cast(x, dtype):
    """``x`` (scalar, vector or matrix) converted to ``dtype``."""
    dt = to_numba(dtype)
    if isinstance(x, Matrix):
        return _wrap(x.entries.astype(to_numpy(dt)))
    return to_numpy(dt).type(x)


@infer_global(cast)
class CastTemplate(AbstractTemplate):
    def generic(self, args, kws):
        if kws or len(args) != 2:
            raise errors.TypingError("qd.cast takes (value, dtype)")
        x, dt = args
        dtype = dtype_arg(dt, "dtype")
        if isinstance(x, MatrixType):
            return signature(x.with_dtype(dtype), x, dt)
        if is_scalar(x):
            return signature(dtype, types.unliteral(x), dt)
        raise errors.TypingError(f"qd.cast cannot convert {x}")


@lower_builtin(cast, types.Any, types.Any)
def _lower_cast(context, builder, sig, args):
    (x_ty, _), rt = sig.args, sig.return_type
    if isinstance(x_ty, MatrixType):
        return pack(context, builder, rt, cast_all(context, builder, elements(builder, args[0], x_ty),
                                                   x_ty.dtype, rt.dtype))
    return context.cast(builder, args[0], x_ty, rt)


def _register_builtin_cast(py_type) -> None:
    """``int(v)``/``float(v)`` of a vector or matrix in compiled code: ``qd.cast(v, int)`` (the
    ``default_ip``/``default_fp`` in force), as in Quadrants (``base = int(Xp - 0.5)``). Scalars
    keep Numba's own ``int``/``float``."""

    @infer_global(py_type)
    class BuiltinCastTemplate(AbstractTemplate):
        def generic(self, args, kws):
            if not kws and len(args) == 1 and isinstance(args[0], MatrixType):
                return signature(args[0].with_dtype(to_numba(py_type)), args[0])
            return None

    @lower_builtin(py_type, MatrixType)
    def _lower_builtin_cast(context, builder, sig, args):
        (x_ty,), rt = sig.args, sig.return_type
        return pack(context, builder, rt, cast_all(context, builder, elements(builder, args[0], x_ty),
                                                   x_ty.dtype, rt.dtype))


_register_builtin_cast(int)
_register_builtin_cast(float)


def bit_cast(x, dtype):
    """The scalar ``x`` reinterpreted, bits unchanged, as ``dtype`` of the same width (C++'s
    ``reinterpret_cast``; ``qd.bit_cast(1.0, qd.u32)`` is ``0x3F800000``)."""
    try:
        dst = to_numba(dtype)
        if isinstance(x, (int, float)) and not isinstance(x, bool):  # a Python number: dtype's width
            src = to_numba(f"{'f' if isinstance(x, float) else 'i'}{getattr(dst, 'bitwidth', 0) // 8}")
        else:
            src = _nb_type(x)
        _check_bit_cast(src, dst)
    except errors.TypingError as e:
        raise QuadrantsTypeError(str(e)) from None
    return np.asarray(x, dtype=to_numpy(src)).view(to_numpy(dst))[()]


def _check_bit_cast(src, dst):
    if isinstance(src, MatrixType):
        raise errors.TypingError("qd.bit_cast takes a scalar, got a vector/matrix (cast each component)")
    src = types.unliteral(src)
    ok = isinstance(src, (types.Integer, types.Float)) and isinstance(dst, (types.Integer, types.Float))
    if not ok or src.bitwidth != dst.bitwidth:
        raise errors.TypingError(f"qd.bit_cast needs integer/float types of the same width, got {src} -> {dst}")


@infer_global(bit_cast)
class BitCastTemplate(AbstractTemplate):
    def generic(self, args, kws):
        if kws or len(args) != 2:
            raise errors.TypingError("qd.bit_cast takes (value, dtype)")
        dtype = dtype_arg(args[1], "dtype")
        _check_bit_cast(args[0], dtype)
        return signature(dtype, types.unliteral(args[0]), args[1])


@lower_builtin(bit_cast, types.Any, types.Any)
def _lower_bit_cast(context, builder, sig, args):
    return builder.bitcast(args[0], context.get_value_type(sig.return_type))


def frexp(x):
    """``(mantissa, exponent)`` with ``x == mantissa * 2**exponent``, ``0.5 <= |mantissa| < 1``
    (``(x, 0)`` for 0, inf and NaN); the exponent is an ``i32``."""
    try:
        ft = _frexp_arg(_nb_type(x))
    except errors.TypingError as e:
        raise QuadrantsTypeError(str(e)) from None
    mantissa, exponent = np.frexp(np.asarray(x, dtype=to_numpy(ft)))
    return mantissa[()], np.int32(exponent)


def _frexp_arg(t):
    """The float type frexp computes in: f64 for f64, else f32."""
    if not is_scalar(t):
        raise errors.TypingError(f"qd.frexp takes a scalar, got {t}")
    return types.float64 if types.unliteral(t) == types.float64 else f32


@infer_global(frexp)
class FrexpTemplate(AbstractTemplate):
    def generic(self, args, kws):
        if kws or len(args) != 1:
            raise errors.TypingError("qd.frexp takes one argument")
        ft = _frexp_arg(args[0])
        return signature(types.Tuple((ft, i32)), types.unliteral(args[0]))


@lower_builtin(frexp, types.Any)
def _lower_frexp(context, builder, sig, args):
    """From the bits: a subnormal is first scaled by ``2**k`` (exact), so its exponent field is set."""
    (xt,), ft = sig.args, sig.return_type.types[0]
    x = context.cast(builder, args[0], xt, ft)
    mbits, k = (23, 25) if ft.bitwidth == 32 else (52, 54)
    ity = ir.IntType(ft.bitwidth)
    bits = builder.bitcast(x, ity)
    subnormal = builder.icmp_unsigned("==", builder.and_(bits, ity(((1 << (ft.bitwidth - 1 - mbits)) - 1) << mbits)),
                                      ity(0))
    xs = builder.select(subnormal, builder.fmul(x, x.type(float(2 ** k))), x)
    bits = builder.bitcast(xs, ity)
    emask = (1 << (ft.bitwidth - 1 - mbits)) - 1
    bias = emask >> 1
    field = builder.and_(builder.lshr(bits, ity(mbits)), ity(emask))
    mantissa = builder.bitcast(builder.or_(builder.and_(bits, ity(~(emask << mbits) & ((1 << ft.bitwidth) - 1))),
                                           ity((bias - 1) << mbits)), x.type)
    i32_ = ir.IntType(32)
    exponent = builder.sub(builder.trunc(field, i32_) if ft.bitwidth > 32 else field, i32_(bias - 1))
    exponent = builder.sub(exponent, builder.select(subnormal, i32_(k), i32_(0)))
    special = builder.or_(builder.fcmp_unordered("==", x, x.type(0.0)), builder.icmp_unsigned("==", field, ity(emask)))
    mantissa = builder.select(special, x, mantissa)
    exponent = builder.select(special, i32_(0), exponent)
    return context.make_tuple(builder, sig.return_type, (mantissa, exponent))
