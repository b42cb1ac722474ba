"""Math functions (``qd.sin``, ``qd.max``, ``qd.cast`` ...) and the ``vec3``/``mat3``-style aliases.

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
``ops/math_ops.py``.
"""

from __future__ import annotations

import numpy as np
from numba.core import errors, types
from numba.core.imputils import lower_builtin
from numba.core.typing.templates import AbstractTemplate, infer_global, signature

from .dtypes import f32, i32, to_numba, to_numpy
from .errors import QuadrantsTypeError
from .lowering.matrix import cast_all, elements, pack
from .matrix import Matrix, _nb_type, _wrap, matrix, vector
from .ops.math_ops import MATH_OPS
from .typing.matrix import (
    MatrixType,
    arith_dtype,
    broadcast_dtype,
    default_float,
    dtype_arg,
    is_scalar,
    promote,
    shape_str,
)

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


def _result_dtype(name, operand):
    return default_float(operand) if MATH_OPS[name].float_result else operand


def _call_type(name, arg_types):
    """``(operand dtype, compute dtype, result type)`` of ``qd.name(*args)``."""
    arg_types = [t if isinstance(t, MatrixType) else types.unliteral(t) for t in arg_types]
    operand, shape_of = _operand_dtype(name, arg_types)
    compute = _result_dtype(name, operand)
    return operand, compute, (shape_of.with_dtype(compute) if shape_of is not None else compute)


# ---------------------------------------------------------------------------------------------
# Python scope (numpy) and compiled code, both from the table in ops/math_ops.py
# ---------------------------------------------------------------------------------------------


def _python_scope(name, args):
    try:
        operand, compute, rt = _call_type(name, [_nb_type(a) for a in args])
    except errors.TypingError as e:
        raise QuadrantsTypeError(str(e)) from None
    arrays = [np.asarray(a.entries if isinstance(a, Matrix) else a).astype(to_numpy(compute)) for a in args]
    with np.errstate(all="ignore"):
        out = np.asarray(MATH_OPS[name].numpy(*arrays)).astype(to_numpy(compute))
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
            return signature(_call_type(name, args)[2], *[types.unliteral(a) for a in args])

    infer_global(pyfunc)(MathTemplate)
    emit = MATH_OPS[name].emit

    def lower(context, builder, sig, args):
        operand, compute, rt = _call_type(name, sig.args)
        count = rt.count if isinstance(rt, MatrixType) else 1
        cols = []
        for t, v in zip(sig.args, args, strict=True):
            if isinstance(t, MatrixType):
                cols.append(cast_all(context, builder, elements(builder, v, t), t.dtype, compute))
            else:
                cols.append([context.cast(builder, v, t, compute)] * count)
        out = [emit(context, builder, compute, *vals) for vals in zip(*cols, strict=True)]
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


# registered once all names exist: infer_global checks that the module attribute is the function
for _fn in (sin, cos, tan, asin, acos, atan, exp, log, sqrt, rsqrt, tanh, abs, floor, ceil, round,
            atan2, pow, min, max, clamp):
    _register(_fn, _fn.__name__, MATH_OPS[_fn.__name__].arity)


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


# ---------------------------------------------------------------------------------------------
# type aliases (``qd.math.vec3`` ...)
# ---------------------------------------------------------------------------------------------

vec2, vec3, vec4 = vector(2, f32), vector(3, f32), vector(4, f32)
ivec2, ivec3, ivec4 = vector(2, i32), vector(3, i32), vector(4, i32)
mat2, mat3, mat4 = matrix(2, 2, f32), matrix(3, 3, f32), matrix(4, 4, f32)

__all__ = [
    "sin", "cos", "tan", "asin", "acos", "atan", "atan2", "exp", "log", "sqrt", "rsqrt", "abs", "floor",
    "ceil", "round", "tanh", "pow", "min", "max", "clamp", "cast",
    "vec2", "vec3", "vec4", "ivec2", "ivec3", "ivec4", "mat2", "mat3", "mat4",
]
