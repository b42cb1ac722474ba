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
intrinsic (``floor ceil round``), so no Python implementation is compiled per call site.
"""

from __future__ import annotations

import builtins
import math
import operator

import numpy as np
from numba.core import errors, types
from numba.core.imputils import lower_builtin
from numba.core.typing.templates import AbstractTemplate, infer_global, signature

from .dtypes import f32, i32, to_numba, to_numpy
from .errors import QuadrantsTypeError
from .lowering.matrix import cast_all, elements, pack, scalar_binop, scalar_select, scalar_sqrt
from .matrix import Matrix, _nb_type, _wrap, matrix, vector
from .typing.matrix import (
    MatrixType,
    _arith,
    _shape_str,
    broadcast_dtype,
    default_float,
    dtype_arg,
    is_scalar,
    promote,
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
                f"shape mismatch in qd.{name}: {_shape_str(mats[0])} and {_shape_str(t)}")
    if not mats:
        dtype = _arith(arg_types[0])
        for t in arg_types[1:]:
            dtype = promote(dtype, t)
        return dtype, None
    dtype = _arith(mats[0].dtype)
    for t in arg_types:
        dtype = promote(dtype, t.dtype) if isinstance(t, MatrixType) else broadcast_dtype(dtype, t)
    return dtype, mats[0]


_FLOAT_FUNCS = {"sin", "cos", "tan", "asin", "acos", "atan", "atan2", "exp", "log", "sqrt", "rsqrt", "tanh"}


def _result_dtype(name, operand):
    return default_float(operand) if name in _FLOAT_FUNCS else operand


def _call_type(name, arg_types):
    """``(operand dtype, compute dtype, result type)`` of ``qd.name(*args)``."""
    arg_types = [t if isinstance(t, MatrixType) else types.unliteral(t) for t in arg_types]
    operand, shape_of = _operand_dtype(name, arg_types)
    compute = _result_dtype(name, operand)
    return operand, compute, (shape_of.with_dtype(compute) if shape_of is not None else compute)


# ---------------------------------------------------------------------------------------------
# scalar emitters (compiled code): name -> fn(context, builder, dtype, *values)
# ---------------------------------------------------------------------------------------------


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


_EMITTERS = {
    "sin": _math_fn(math.sin), "cos": _math_fn(math.cos), "tan": _math_fn(math.tan),
    "asin": _math_fn(math.asin), "acos": _math_fn(math.acos), "atan": _math_fn(math.atan),
    "atan2": _math_fn(math.atan2), "exp": _math_fn(math.exp), "log": _math_fn(math.log),
    "sqrt": _math_fn(math.sqrt), "tanh": _math_fn(math.tanh), "rsqrt": _emit_rsqrt, "abs": _emit_abs,
    "floor": _intrinsic_fn("llvm.floor"), "ceil": _intrinsic_fn("llvm.ceil"),
    "round": _intrinsic_fn("llvm.round"), "pow": _emit_pow, "min": _emit_min, "max": _emit_max,
    "clamp": _emit_clamp,
}


# ---------------------------------------------------------------------------------------------
# numpy implementations (Python scope): name -> fn(*arrays in the compute dtype)
# ---------------------------------------------------------------------------------------------


def _np_round(x):
    return np.where(x >= 0, np.floor(x + 0.5), np.ceil(x - 0.5)).astype(x.dtype) if x.dtype.kind == "f" else x


_NUMPY = {
    "sin": np.sin, "cos": np.cos, "tan": np.tan, "asin": np.arcsin, "acos": np.arccos, "atan": np.arctan,
    "atan2": np.arctan2, "exp": np.exp, "log": np.log, "sqrt": np.sqrt, "tanh": np.tanh,
    "rsqrt": lambda x: x.dtype.type(1) / np.sqrt(x), "abs": np.abs, "floor": np.floor, "ceil": np.ceil,
    "round": _np_round, "pow": np.power, "min": np.minimum, "max": np.maximum,
    "clamp": lambda x, lo, hi: np.minimum(np.maximum(x, lo), hi),
}


def _python_scope(name, args):
    try:
        operand, compute, rt = _call_type(name, [_nb_type(a) for a in args])
    except errors.TypingError as e:
        raise QuadrantsTypeError(str(e)) from None
    arrays = [np.asarray(a.entries if isinstance(a, Matrix) else a).astype(to_numpy(compute)) for a in args]
    with np.errstate(all="ignore"):
        out = np.asarray(_NUMPY[name](*arrays)).astype(to_numpy(compute))
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
    emit = _EMITTERS[name]

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
for _fn in (sin, cos, tan, asin, acos, atan, exp, log, sqrt, rsqrt, tanh, abs, floor, ceil, round):
    _register(_fn, _fn.__name__, 1)
for _fn in (atan2, pow, min, max):
    _register(_fn, _fn.__name__, 2)
_register(clamp, "clamp", 3)


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
