"""The methods of vectors and matrices (``v.dot(w)``, ``m.transpose()`` ...) as one table: a row
per method, with everything about it.

A row gives the method's name, how many arguments it takes after the matrix, its typing rule
(``result(mt, args) -> type``, raising ``TypingError`` for a wrong shape or argument), its
emitter for compiled code and its numpy implementation for Python scope:

* ``emit(context, builder, mt, vals, rt, args)``: ``vals`` the matrix's ``mt.count`` element
  values (row-major), ``rt`` the result type of the rule, ``args`` the other arguments as
  ``(type, value)`` pairs; returns the result value (emitted element by element through the
  target context's scalar implementations, unrolled: see ``qd_numba/lowering/matrix.py``).
* ``numpy(x, *args)``: ``x`` the entries as a numpy array, ``args`` numpy arrays (vectors and
  matrices) or scalars; the caller (``qd_numba/matrix.py``) casts the result to the rule's dtype.

The same table types and lowers every method in compiled code (one attribute template and one
lowering per row, registered below under the key ``"matrix.<name>"``) and gives the Python-scope
classes their methods. tests/test_matrix_methods.py runs every row in a kernel against numpy.
"""

from __future__ import annotations

import dataclasses
import operator
from collections.abc import Callable

import numpy as np
from numba.core import errors, types
from numba.core.imputils import lower_builtin
from numba.core.typing.templates import AttributeTemplate, bound_function, infer_getattr, signature

from ..lowering.matrix import (
    cast_all,
    dot_product,
    elements,
    pack,
    scalar_binop,
    scalar_select,
    scalar_sqrt,
)
from ..typing.matrix import MatrixType, arith_dtype, default_float, is_scalar, promote, shape_str


@dataclasses.dataclass(frozen=True)
class MatrixMethod:
    name: str
    arity: tuple[int, int]      # (fewest, most) arguments after the matrix
    result: Callable            # (mt, arg types) -> result type; TypingError for a bad call
    emit: Callable              # (context, builder, mt, vals, rt, [(type, value)]) -> llvm value
    numpy: Callable             # (entries, *args) -> numpy value
    adjoint: Callable | None = None     # (args, out, g, qd) -> gradients: see ops/math_ops.py


# -- typing rules ---------------------------------------------------------------------------------

def _need_vector(mt, name):
    if mt.ndim != 1:
        raise errors.TypingError(f"{name}() needs a vector, got {mt}")


def _need_square(mt, name):
    if mt.ndim != 2 or mt.n != mt.m:
        raise errors.TypingError(f"{name}() needs a square matrix, got {mt}")


def _same_shape(mt, other, name):
    if not isinstance(other, MatrixType) or other.shape != mt.shape:
        other_s = shape_str(other) if isinstance(other, MatrixType) else str(other)
        raise errors.TypingError(f"shape mismatch in {name}(): {shape_str(mt)} and {other_s}")


def _need_scalar_eps(args, name):
    if args and not is_scalar(args[0]):
        raise errors.TypingError(f"{name}(eps) needs a scalar eps, got {args[0]}")


def _dot_type(mt, args):
    _same_shape(mt, args[0], "dot")
    return promote(mt.dtype, args[0].dtype)


def _norm_type(mt, args):
    _need_scalar_eps(args, "norm")
    return default_float(mt.dtype)


def _normalized_type(mt, args):
    _need_scalar_eps(args, "normalized")
    return mt.with_dtype(default_float(mt.dtype))


def _cross_type(mt, args):
    (other,) = args
    _need_vector(mt, "cross")
    _same_shape(mt, other, "cross")
    dtype = promote(mt.dtype, other.dtype)
    if mt.n == 3:
        return mt.with_dtype(dtype)
    if mt.n == 2:
        return dtype
    raise errors.TypingError(f"cross() needs 2- or 3-vectors, got {mt}")


def _outer_product_type(mt, args):
    (other,) = args
    _need_vector(mt, "outer_product")
    if not (isinstance(other, MatrixType) and other.ndim == 1):
        raise errors.TypingError(f"outer_product() needs a vector argument, got {other}")
    return MatrixType(promote(mt.dtype, other.dtype), mt.n, other.n, 2)


def _transpose_type(mt, args):
    if mt.ndim != 2:
        raise errors.TypingError(f"transpose() needs a matrix, got {mt}")
    return MatrixType(mt.dtype, mt.m, mt.n, 2)


def _trace_type(mt, args):
    _need_square(mt, "trace")
    return arith_dtype(mt.dtype)


def _determinant_type(mt, args):
    _need_square(mt, "determinant")
    if mt.n > 4:
        raise errors.TypingError(f"determinant() supports n <= 4, got {mt}")
    return arith_dtype(mt.dtype)


def _inverse_type(mt, args):
    _need_square(mt, "inverse")
    if mt.n > 4:
        raise errors.TypingError(f"inverse() supports n <= 4, got {mt}")
    return mt.with_dtype(default_float(mt.dtype))


# -- emitters -------------------------------------------------------------------------------------

def _other(context, builder, args, dtype):
    """The elements of the first argument (a vector or matrix), cast to ``dtype``."""
    ty, val = args[0]
    return cast_all(context, builder, elements(builder, val, ty), ty.dtype, dtype)


def _reduce(context, builder, op, dtype, vals):
    acc = vals[0]
    for v in vals[1:]:
        acc = scalar_binop(context, builder, op, dtype, acc, v)
    return acc


def _select_all(op):
    """max (``op`` gt) or min (``op`` lt) of the elements, in the matrix's own dtype."""
    def emit(context, builder, mt, vals, rt, args):
        acc = vals[0]
        for v in vals[1:]:
            acc = scalar_select(context, builder, op, mt.dtype, acc, v)
        return acc

    return emit


def _norm_and_values(context, builder, mt, vals, args):
    """``(float type, elements in it, sqrt(sum of squares + eps))``."""
    ft = default_float(mt.dtype)
    vals = cast_all(context, builder, vals, mt.dtype, ft)
    sq = dot_product(context, builder, ft, vals, vals)
    if args:
        eps_ty, eps = args[0]
        sq = scalar_binop(context, builder, operator.add, ft, sq, context.cast(builder, eps, eps_ty, ft))
    return ft, vals, scalar_sqrt(context, builder, ft, sq)


def _emit_dot(context, builder, mt, vals, rt, args):
    vals = cast_all(context, builder, vals, mt.dtype, rt)
    return dot_product(context, builder, rt, vals, _other(context, builder, args, rt))


def _emit_norm_sqr(context, builder, mt, vals, rt, args):
    vals = cast_all(context, builder, vals, mt.dtype, rt)
    return dot_product(context, builder, rt, vals, vals)


def _emit_norm(context, builder, mt, vals, rt, args):
    return _norm_and_values(context, builder, mt, vals, args)[2]


def _emit_normalized(context, builder, mt, vals, rt, args):
    ft, fvals, length = _norm_and_values(context, builder, mt, vals, args)
    inv = scalar_binop(context, builder, operator.truediv, ft, context.get_constant(ft, 1.0), length)
    return pack(context, builder, rt, [scalar_binop(context, builder, operator.mul, ft, v, inv) for v in fvals])


def _emit_cross(context, builder, mt, vals, rt, args):
    dtype = rt.dtype if isinstance(rt, MatrixType) else rt
    a = cast_all(context, builder, vals, mt.dtype, dtype)
    b = _other(context, builder, args, dtype)

    def cross2(i, j):
        x = scalar_binop(context, builder, operator.mul, dtype, a[i], b[j])
        y = scalar_binop(context, builder, operator.mul, dtype, a[j], b[i])
        return scalar_binop(context, builder, operator.sub, dtype, x, y)

    if mt.n == 2:
        return cross2(0, 1)
    return pack(context, builder, rt, [cross2(1, 2), cross2(2, 0), cross2(0, 1)])


def _emit_outer_product(context, builder, mt, vals, rt, args):
    a = cast_all(context, builder, vals, mt.dtype, rt.dtype)
    b = _other(context, builder, args, rt.dtype)
    return pack(context, builder, rt, [scalar_binop(context, builder, operator.mul, rt.dtype, x, y)
                                       for x in a for y in b])


def _emit_transpose(context, builder, mt, vals, rt, args):
    return pack(context, builder, rt, [vals[i * mt.m + j] for j in range(mt.m) for i in range(mt.n)])


def _emit_sum(context, builder, mt, vals, rt, args):
    return _reduce(context, builder, operator.add, rt, cast_all(context, builder, vals, mt.dtype, rt))


def _emit_trace(context, builder, mt, vals, rt, args):
    diag = cast_all(context, builder, [vals[i * mt.m + i] for i in range(mt.n)], mt.dtype, rt)
    return _reduce(context, builder, operator.add, rt, diag)


def _determinant(context, builder, dtype, rows):
    """Laplace expansion along the first row (n <= 4: at most 24 products)."""
    n = len(rows)
    if n == 1:
        return rows[0][0]
    if n == 2:
        a = scalar_binop(context, builder, operator.mul, dtype, rows[0][0], rows[1][1])
        b = scalar_binop(context, builder, operator.mul, dtype, rows[0][1], rows[1][0])
        return scalar_binop(context, builder, operator.sub, dtype, a, b)
    acc = None
    for j in range(n):
        minor = [r[:j] + r[j + 1:] for r in rows[1:]]
        term = scalar_binop(context, builder, operator.mul, dtype, rows[0][j],
                            _determinant(context, builder, dtype, minor))
        if acc is None:
            acc = term
        else:
            acc = scalar_binop(context, builder, operator.sub if j % 2 else operator.add, dtype, acc, term)
    return acc


def _emit_determinant(context, builder, mt, vals, rt, args):
    vals = cast_all(context, builder, vals, mt.dtype, rt)
    return _determinant(context, builder, rt, [vals[i * mt.m:(i + 1) * mt.m] for i in range(mt.n)])


def _emit_inverse(context, builder, mt, vals, rt, args):
    """The adjugate over the determinant: ``inv[i][j] = (-1)^(i+j) det(minor(j, i)) / det``."""
    ft, n = rt.dtype, mt.n
    vals = cast_all(context, builder, vals, mt.dtype, ft)
    rows = [vals[i * n:(i + 1) * n] for i in range(n)]
    inv_det = scalar_binop(context, builder, operator.truediv, ft, context.get_constant(ft, 1.0),
                           _determinant(context, builder, ft, rows))
    if n == 1:
        return pack(context, builder, rt, [inv_det])
    negate = context.get_function(operator.neg, signature(ft, ft))
    out = []
    for i in range(n):
        for j in range(n):
            minor = [r[:i] + r[i + 1:] for k, r in enumerate(rows) if k != j]
            term = scalar_binop(context, builder, operator.mul, ft, _determinant(context, builder, ft, minor), inv_det)
            out.append(term if (i + j) % 2 == 0 else negate(builder, (term,)))
    return pack(context, builder, rt, out)


# -- numpy (Python scope) -------------------------------------------------------------------------

def _float(x):
    """``x`` in the float type math on it computes in (integers and bools: f32)."""
    return x if x.dtype.kind == "f" else x.astype(np.float32)


def _np_norm(x, eps=0):
    f = _float(x)
    return np.sqrt(np.sum(f * f) + f.dtype.type(eps))


def _np_normalized(x, eps=0):
    f = _float(x)
    return f * (f.dtype.type(1) / _np_norm(f, eps))


def _np_cross(x, y):
    return x[0] * y[1] - x[1] * y[0] if x.shape[0] == 2 else np.cross(x, y)


def _np_determinant(x):
    if x.dtype.kind in "iub":   # exact for the small integer matrices this supports
        return np.linalg.det(x.astype(np.float64)).round()
    return np.linalg.det(x)


# -- the table ------------------------------------------------------------------------------------

def _arith_result(mt, args):
    return arith_dtype(mt.dtype)


MATRIX_METHODS = {row.name: row for row in (
    MatrixMethod("dot", (1, 1), _dot_type, _emit_dot, lambda x, y: np.sum(x * y),
                 lambda a, out, g, qd: (g * a[1], g * a[0])),
    MatrixMethod("norm", (0, 1), _norm_type, _emit_norm, _np_norm,
                 lambda a, out, g, qd: (g * a[0] / out,)),
    MatrixMethod("norm_sqr", (0, 0), _arith_result, _emit_norm_sqr, lambda x: np.sum(x * x),
                 lambda a, out, g, qd: (2.0 * g * a[0],)),
    MatrixMethod("normalized", (0, 1), _normalized_type, _emit_normalized, _np_normalized,
                 lambda a, out, g, qd: ((g - out * out.dot(g)) / a[0].norm(*a[1:]),)),
    MatrixMethod("cross", (1, 1), _cross_type, _emit_cross, _np_cross,
                 lambda a, out, g, qd: (qd.ad_cross_lhs(a[1], g), -qd.ad_cross_lhs(a[0], g))),
    MatrixMethod("outer_product", (1, 1), _outer_product_type, _emit_outer_product, np.outer,
                 lambda a, out, g, qd: (g @ a[1], g.transpose() @ a[0])),
    MatrixMethod("transpose", (0, 0), _transpose_type, _emit_transpose, np.transpose,
                 lambda a, out, g, qd: (g.transpose(),)),
    MatrixMethod("sum", (0, 0), _arith_result, _emit_sum, np.sum,
                 lambda a, out, g, qd: (g,)),
    MatrixMethod("max", (0, 0), lambda mt, args: mt.dtype, _select_all(operator.gt), np.max,
                 lambda a, out, g, qd: (qd.ad_extreme(a[0], out, g),)),
    MatrixMethod("min", (0, 0), lambda mt, args: mt.dtype, _select_all(operator.lt), np.min,
                 lambda a, out, g, qd: (qd.ad_extreme(a[0], out, g),)),
    MatrixMethod("trace", (0, 0), _trace_type, _emit_trace, np.trace,
                 lambda a, out, g, qd: (qd.ad_eye_like(a[0], g),)),
    MatrixMethod("determinant", (0, 0), _determinant_type, _emit_determinant, _np_determinant,
                 lambda a, out, g, qd: (g * out * a[0].inverse().transpose(),)),
    MatrixMethod("inverse", (0, 0), _inverse_type, _emit_inverse, lambda x: np.linalg.inv(_float(x)),
                 lambda a, out, g, qd: (-(out.transpose() @ g @ out.transpose()),)),
)}


def method_type(mt: MatrixType, name: str, args) -> types.Type:
    """Result type of ``mt.name(*args)`` (argument types); raises ``TypingError``."""
    row = MATRIX_METHODS[name]
    lo, hi = row.arity
    if not lo <= len(args) <= hi:
        raise errors.TypingError(f"{name}() takes {lo}..{hi} positional arguments, got {len(args)}")
    return row.result(mt, [types.unliteral(a) if not isinstance(a, MatrixType) else a for a in args])


# -- compiled code: typing and lowering of every row ----------------------------------------------

@infer_getattr
class MatrixMethodAttribute(AttributeTemplate):
    """``mt.<method>``: a bound function typed by the row's rule (the other attributes of a
    matrix, components and ``n``/``m``, are typing/matrix.py's)."""

    key = MatrixType


def _resolver(row):
    @bound_function(f"matrix.{row.name}")
    def resolve(self, mt, args, kws):
        if kws:
            raise errors.TypingError(f"{row.name}() takes no keyword arguments")
        extra = [types.unliteral(a) for a in args]
        return signature(method_type(mt, row.name, extra), *extra)

    return resolve


def _lowering(row):
    def impl(context, builder, sig, args):
        mt = sig.args[0]
        extra = list(zip(sig.args[1:], args[1:], strict=True))
        return row.emit(context, builder, mt, elements(builder, args[0], mt), sig.return_type, extra)

    return impl


for _row in MATRIX_METHODS.values():
    setattr(MatrixMethodAttribute, f"resolve_{_row.name}", _resolver(_row))
    lower_builtin(f"matrix.{_row.name}", MatrixType, types.VarArg(types.Any))(_lowering(_row))
