"""Data model and lowering of small vectors/matrices (:class:`~qd_numba.typing.matrix.MatrixType`).

Responsibilities:

* The data model: a ``MatrixType`` value is an LLVM array ``[n*m x dtype]`` (row-major), exactly
  the layout of ``UniTuple(dtype, n*m)``; values are immutable and live in registers.
* Lowering of constructors, operators, indexing (constant and runtime indices), attributes,
  casts between element dtypes, constants (``lower_constant``) and ``box``/``unbox``; the
  methods are rows of ``qd_numba/ops/matrix_methods.py``.
* Public intrinsics other compiler code calls from compiled code: :func:`matrix_from_tuple`,
  :func:`make_vector`, :func:`make_matrix`, :func:`matrix_to_tuple`, :func:`matrix_with_item`.
* Scalar helpers (:func:`elements`, :func:`pack`, :func:`scalar_binop`, :func:`cast_all`,
  :func:`dot_product` ...) reused by the op tables and their lowering in ``qd_numba/ops/``.

Every element operation is emitted directly as LLVM through the target context's own scalar
implementations (``context.get_function(operator.add, sig)`` ...), unrolled over the ``n*m``
elements: one lowering function per operator, no Python-level overloads to compile, and the
same code serves any Numba target whose context implements the scalar ops. Registrations use the
generic registries (no ``target="cpu"``). Runtime indices go through a stack slot and a GEP.
Negative indices wrap once, as in Python; indices are not bounds-checked.
"""

from __future__ import annotations

import math
import operator

from llvmlite import ir as llir
from numba.core import cgutils, errors, types
from numba.core.datamodel import models
from numba.core.imputils import (
    lower_builtin,
    lower_cast,
    lower_constant,
    lower_getattr_generic,
    lower_setattr_generic,
)
from numba.core.typing.templates import signature
from numba.extending import NativeValue, box, intrinsic, register_model, unbox

from ..errors import QuadrantsIndexError, typing_error
from ..typing.matrix import (
    ARITH_OPS,
    COMPARE_OPS,
    INPLACE_TO_OP,
    SWIZZLE,
    UNARY_OPS,
    ConstructorKeys,
    MatrixClassType,
    MatrixType,
    MatrixTypeRef,
    binop_dtypes,
    binop_result_dtype,
    construct_type,
    getitem_type,
    is_scalar,
    swizzle_indices,
    type_call_check,
)


@register_model(MatrixType)
class MatrixModel(models.UniTupleModel):
    """``[n*m x dtype]``: the layout of ``UniTuple(dtype, n*m)``."""

    def __init__(self, dmm, fe_type):
        models.DataModel.__init__(self, dmm, fe_type)
        self._elem_model = dmm.lookup(fe_type.dtype)
        self._count = fe_type.count
        self._value_type = llir.ArrayType(self._elem_model.get_value_type(), self._count)
        self._data_type = llir.ArrayType(self._elem_model.get_data_type(), self._count)


register_model(MatrixClassType)(models.OpaqueModel)
register_model(MatrixTypeRef)(models.OpaqueModel)


@lower_constant(MatrixClassType)
@lower_constant(MatrixTypeRef)
def _constant_matrix_class(context, builder, ty, pyval):
    return context.get_dummy_value()


@lower_getattr_generic(MatrixClassType)
def _matrix_class_attr(context, builder, ty, val, attr):
    return context.get_dummy_value()  # Vector.zero etc.: the call is lowered under its own key


# ---------------------------------------------------------------------------------------------
# scalar helpers
# ---------------------------------------------------------------------------------------------


def elements(builder, val, mt: MatrixType) -> list:
    """The ``mt.count`` element values of a matrix value, row-major."""
    return [builder.extract_value(val, i) for i in range(mt.count)]


def pack(context, builder, mt: MatrixType, values) -> llir.Value:
    """A matrix value of type ``mt`` from ``mt.count`` element values (already of ``mt.dtype``)."""
    out = llir.Constant(context.get_value_type(mt), llir.Undefined)
    for i, v in enumerate(values):
        out = builder.insert_value(out, v, i)
    return out


def cast_all(context, builder, values, from_ty, to_ty) -> list:
    return [context.cast(builder, v, from_ty, to_ty) for v in values]


def scalar_binop(context, builder, op, operand: types.Type, a, b):
    """``a op b`` for two scalars of dtype ``operand``; result dtype per ``binop_result_dtype``."""
    op = INPLACE_TO_OP.get(op, op)
    result = binop_result_dtype(op, operand)
    if op in COMPARE_OPS:
        res = context.get_function(op, signature(types.boolean, operand, operand))(builder, (a, b))
        return context.cast(builder, res, types.boolean, result)
    if result != operand:  # integer true division: divide in the float type
        a, b = context.cast(builder, a, operand, result), context.cast(builder, b, operand, result)
        operand = result
    return context.get_function(op, signature(result, operand, operand))(builder, (a, b))


def scalar_select(context, builder, op, dtype, a, b):
    """``a if a op b else b`` (op a comparison): the min/max building block."""
    cond = context.get_function(op, signature(types.boolean, dtype, dtype))(builder, (a, b))
    return builder.select(cond, a, b)


def scalar_sqrt(context, builder, ft, x):
    return context.get_function(math.sqrt, signature(ft, ft))(builder, (x,))


def _operand_values(context, builder, ty, val, operand, count):
    """Elements of a matrix operand, or a scalar operand repeated, cast to ``operand``."""
    if isinstance(ty, MatrixType):
        return cast_all(context, builder, elements(builder, val, ty), ty.dtype, operand)
    return [context.cast(builder, val, ty, operand)] * count


def _scalar_value(context, builder, ty, val):
    """A scalar's value and unliteral type (constants for literal types)."""
    if isinstance(ty, types.Literal):
        base = types.unliteral(ty)
        return context.get_constant_generic(builder, base, ty.literal_value), base
    return val, ty


def flatten_values(context, builder, ty, val) -> list:
    """``(value, type)`` of every scalar in a constructor argument (scalar, tuple or matrix)."""
    if isinstance(ty, MatrixType):
        return [(v, ty.dtype) for v in elements(builder, val, ty)]
    if isinstance(ty, types.BaseTuple):
        out = []
        for k, t in enumerate(ty.types):
            out.extend(flatten_values(context, builder, t, builder.extract_value(val, k)))
        return out
    return [_scalar_value(context, builder, ty, val)]


def _build(context, builder, mt: MatrixType, arg_types, args):
    flat = [p for t, v in zip(arg_types, args, strict=True) for p in flatten_values(context, builder, t, v)]
    if len(flat) == 1 and mt.count > 1:
        flat = flat * mt.count
    return pack(context, builder, mt, [context.cast(builder, v, t, mt.dtype) for v, t in flat])


# ---------------------------------------------------------------------------------------------
# constructors
# ---------------------------------------------------------------------------------------------


# Calls of a non-function callee type are lowered under the callee's type (class) as key.
@lower_builtin(MatrixClassType, types.VarArg(types.Any))
def _lower_construct(context, builder, sig, args):
    return _build(context, builder, sig.return_type, sig.args[:1], args[:1])


@lower_builtin(MatrixTypeRef, types.VarArg(types.Any))
def _lower_type_call(context, builder, sig, args):
    return _build(context, builder, sig.return_type, sig.args, args)


@lower_builtin(ConstructorKeys.zero, types.VarArg(types.Any))
def _lower_zero(context, builder, sig, args):
    mt = sig.return_type
    return pack(context, builder, mt, [context.get_constant_generic(builder, mt.dtype, 0)] * mt.count)


@lower_builtin(ConstructorKeys.identity, types.VarArg(types.Any))
def _lower_identity(context, builder, sig, args):
    mt = sig.return_type
    one, zero = (context.get_constant_generic(builder, mt.dtype, k) for k in (1, 0))
    return pack(context, builder, mt, [one if i // mt.m == i % mt.m else zero for i in range(mt.count)])


@lower_builtin(ConstructorKeys.unit, types.VarArg(types.Any))
def _lower_unit(context, builder, sig, args):
    mt = sig.return_type
    idx = context.cast(builder, args[1], types.unliteral(sig.args[1]), types.intp)
    one, zero = (context.get_constant_generic(builder, mt.dtype, k) for k in (1, 0))
    vals = [builder.select(builder.icmp_signed("==", idx, idx.type(k)), one, zero) for k in range(mt.n)]
    return pack(context, builder, mt, vals)


# ---------------------------------------------------------------------------------------------
# operators
# ---------------------------------------------------------------------------------------------

_SCALAR_TYPES = (types.Number, types.Boolean)


def _make_binop_impl(op):
    def impl(context, builder, sig, args):
        a_ty, b_ty = sig.args
        operand, rt = binop_dtypes(op, a_ty, b_ty)
        a_vals = _operand_values(context, builder, a_ty, args[0], operand, rt.count)
        b_vals = _operand_values(context, builder, b_ty, args[1], operand, rt.count)
        out = [scalar_binop(context, builder, op, operand, a, b) for a, b in zip(a_vals, b_vals, strict=True)]
        return pack(context, builder, rt, out)

    return impl


for _op in (*ARITH_OPS, *ARITH_OPS.values(), *COMPARE_OPS):
    _impl = _make_binop_impl(_op)
    lower_builtin(_op, MatrixType, MatrixType)(_impl)
    for _sty in _SCALAR_TYPES:
        lower_builtin(_op, MatrixType, _sty)(_impl)
        lower_builtin(_op, _sty, MatrixType)(_impl)


def _make_unary_impl(op):
    def impl(context, builder, sig, args):
        (mt,), rt = sig.args, sig.return_type
        vals = cast_all(context, builder, elements(builder, args[0], mt), mt.dtype, rt.dtype)
        if op is not operator.pos:
            fn = context.get_function(op, signature(rt.dtype, rt.dtype))
            vals = [fn(builder, (v,)) for v in vals]
        return pack(context, builder, rt, vals)

    return impl


for _op in UNARY_OPS:
    lower_builtin(_op, MatrixType)(_make_unary_impl(_op))


def dot_product(context, builder, dtype, a_vals, b_vals):
    """``sum(a * b)`` of two lists of element values of ``dtype``."""
    acc = None
    for a, b in zip(a_vals, b_vals, strict=True):
        p = scalar_binop(context, builder, operator.mul, dtype, a, b)
        acc = p if acc is None else scalar_binop(context, builder, operator.add, dtype, acc, p)
    return acc


@lower_builtin(operator.matmul, MatrixType, MatrixType)
@lower_builtin(operator.imatmul, MatrixType, MatrixType)
def _lower_matmul(context, builder, sig, args):
    (at, bt), rt = sig.args, sig.return_type
    dtype = rt.dtype if isinstance(rt, MatrixType) else rt
    a = cast_all(context, builder, elements(builder, args[0], at), at.dtype, dtype)
    b = cast_all(context, builder, elements(builder, args[1], bt), bt.dtype, dtype)
    a_rows = [a] if at.ndim == 1 else [a[i * at.m:(i + 1) * at.m] for i in range(at.n)]
    b_cols = [b] if bt.ndim == 1 else [b[j::bt.m] for j in range(bt.m)]
    out = [dot_product(context, builder, dtype, row, col) for row in a_rows for col in b_cols]
    if not isinstance(rt, MatrixType):
        return out[0]
    return pack(context, builder, rt, out)


@lower_builtin(len, MatrixType)
def _lower_len(context, builder, sig, args):
    return context.get_constant(types.intp, sig.args[0].n)


@lower_cast(MatrixType, MatrixType)
def _lower_matrix_cast(context, builder, fromty, toty, val):
    vals = cast_all(context, builder, elements(builder, val, fromty), fromty.dtype, toty.dtype)
    return pack(context, builder, toty, vals)


# ---------------------------------------------------------------------------------------------
# indexing
# ---------------------------------------------------------------------------------------------


def _index_error(k: int, size: int) -> QuadrantsIndexError:
    return typing_error(QuadrantsIndexError(f"index {k} is out of range for a vector/matrix dimension of size {size}"))


def _wrap(builder, idx, size):
    """Python-style wrap of a negative index (constant-folded for constants; a constant out of
    range is a compile error, a runtime one is not checked)."""
    if isinstance(idx, llir.Constant):
        k = idx.constant
        if not -size <= k < size:
            raise _index_error(k, size)
        return idx.type(k + size if k < 0 else k)
    neg = builder.icmp_signed("<", idx, idx.type(0))
    return builder.select(neg, builder.add(idx, idx.type(size)), idx)


def _flat_index(context, builder, mt, idx_ty, idx):
    """The flat element index (intp) of ``mt[idx]`` for an element index (int or 2-tuple)."""
    if isinstance(idx_ty, types.BaseTuple):
        vals = [context.cast(builder, builder.extract_value(idx, k), idx_ty.types[k], types.intp)
                for k in range(2)]
        i, j = _wrap(builder, vals[0], mt.n), _wrap(builder, vals[1], mt.m)
        if isinstance(i, llir.Constant) and isinstance(j, llir.Constant):
            return i.type(i.constant * mt.m + j.constant)
        return builder.add(builder.mul(i, i.type(mt.m)), j)
    return _wrap(builder, context.cast(builder, idx, idx_ty, types.intp), mt.n)


def _load_elements(builder, val, flat_indices):
    """Elements at (possibly runtime) flat indices: extract for constants, a stack slot otherwise."""
    if all(isinstance(k, llir.Constant) for k in flat_indices):
        return [builder.extract_value(val, k.constant) for k in flat_indices]
    slot = cgutils.alloca_once_value(builder, val)
    zero = llir.Constant(llir.IntType(32), 0)
    return [builder.load(builder.gep(slot, [zero, k])) for k in flat_indices]


def _row_indices(builder, mt, i):
    if isinstance(i, llir.Constant):
        return [i.type(i.constant * mt.m + j) for j in range(mt.m)]
    base = builder.mul(i, i.type(mt.m))
    return [builder.add(base, i.type(j)) for j in range(mt.m)]


@lower_builtin(operator.getitem, MatrixType, types.Integer)
@lower_builtin(operator.getitem, MatrixType, types.BaseTuple)
def _lower_getitem(context, builder, sig, args):
    (mt, idx_ty), rt = sig.args, sig.return_type
    idx_ty, idx = types.unliteral(idx_ty), args[1]
    if isinstance(sig.args[1], types.IntegerLiteral):
        idx = context.get_constant(types.intp, sig.args[1].literal_value)
        idx_ty = types.intp
    if isinstance(rt, MatrixType):  # row of a matrix
        i = _flat_index(context, builder, MatrixType(mt.dtype, mt.n, 1, 1), idx_ty, idx)
        return pack(context, builder, rt, _load_elements(builder, args[0], _row_indices(builder, mt, i)))
    (val,) = _load_elements(builder, args[0], [_flat_index(context, builder, mt, idx_ty, idx)])
    return val


def _with_items(context, builder, mt, val, flat_indices, new_values):
    if all(isinstance(k, llir.Constant) for k in flat_indices):
        for k, v in zip(flat_indices, new_values, strict=True):
            val = builder.insert_value(val, v, k.constant)
        return val
    slot = cgutils.alloca_once_value(builder, val)
    zero = llir.Constant(llir.IntType(32), 0)
    for k, v in zip(flat_indices, new_values, strict=True):
        builder.store(v, builder.gep(slot, [zero, k]))
    return builder.load(slot)


@intrinsic(prefer_literal=True)  # a constant index stays constant: checked, no stack slot
def matrix_with_item(typingctx, m, idx, val):
    """A new matrix equal to ``m`` with ``m[idx]`` replaced by ``val`` (``idx``: an int for vectors,
    an int (row; ``val`` a vector or a scalar to fill the row) or a 2-tuple for matrices)."""
    if not isinstance(m, MatrixType):
        raise errors.TypingError(f"matrix_with_item needs a vector or matrix, got {m}")
    item_ty = types.unliteral(val) if not isinstance(val, MatrixType) else val
    target = getitem_type(m, idx)
    if isinstance(idx, types.IntegerLiteral) and not -m.n <= idx.literal_value < m.n:
        raise _index_error(idx.literal_value, m.n)  # ours: Numba would retry with a runtime index
    if isinstance(target, MatrixType):
        ok = is_scalar(item_ty) or (isinstance(item_ty, MatrixType) and item_ty.shape == target.shape)
    else:
        ok = is_scalar(item_ty)
    if not ok:
        raise errors.TypingError(f"cannot store {val} into {m}[{idx}] (expects {target})")

    def codegen(context, builder, sig, args):
        mt, idx_ty, v_ty = sig.args
        iv, ity = args[1], types.unliteral(idx_ty)
        if isinstance(idx_ty, types.IntegerLiteral):
            iv, ity = context.get_constant(types.intp, idx_ty.literal_value), types.intp
        if isinstance(target, MatrixType):
            i = _flat_index(context, builder, MatrixType(mt.dtype, mt.n, 1, 1), ity, iv)
            flat = _row_indices(builder, mt, i)
            if isinstance(v_ty, MatrixType):
                vals = cast_all(context, builder, elements(builder, args[2], v_ty), v_ty.dtype, mt.dtype)
            else:
                vals = [context.cast(builder, args[2], v_ty, mt.dtype)] * mt.m
        else:
            flat = [_flat_index(context, builder, mt, ity, iv)]
            vals = [context.cast(builder, args[2], v_ty, mt.dtype)]
        return _with_items(context, builder, mt, args[0], flat, vals)

    return signature(m, m, idx, item_ty), codegen


# ---------------------------------------------------------------------------------------------
# tuples <-> matrices
# ---------------------------------------------------------------------------------------------


@intrinsic
def matrix_from_tuple(typingctx, tup, typeref):
    """``typeref`` (a MatrixType used as a value) built from a flat or nested tuple of scalars."""
    mt = typeref.instance_type if isinstance(typeref, types.TypeRef) else None
    if not isinstance(mt, MatrixType):
        raise errors.TypingError(f"matrix_from_tuple needs a MatrixType, got {typeref}")
    type_call_check(mt, (tup,))

    def codegen(context, builder, sig, args):
        return _build(context, builder, mt, sig.args[:1], args[:1])

    return signature(mt, tup, typeref), codegen


def _make_from_literal(kind):
    def typer(typingctx, tup):
        mt = construct_type(kind, tup, None)

        def codegen(context, builder, sig, args):
            return _build(context, builder, mt, sig.args, args)

        return signature(mt, tup), codegen

    return typer


make_vector = intrinsic(_make_from_literal("Vector"))
make_vector.__doc__ = "A vector from a tuple of scalars (dtype per ``constructor_dtype``)."
make_matrix = intrinsic(_make_from_literal("Matrix"))
make_matrix.__doc__ = "A matrix from a tuple of row tuples (dtype per ``constructor_dtype``)."


@intrinsic
def matrix_to_tuple(typingctx, m):
    """The elements of ``m`` as a flat ``UniTuple(dtype, n*m)``, row-major (same layout: free)."""
    if not isinstance(m, MatrixType):
        raise errors.TypingError(f"matrix_to_tuple needs a vector or matrix, got {m}")

    def codegen(context, builder, sig, args):
        return args[0]

    return signature(types.UniTuple(m.dtype, m.count), m), codegen


# ---------------------------------------------------------------------------------------------
# attributes (the methods are a table: qd_numba/ops/matrix_methods.py)
# ---------------------------------------------------------------------------------------------


@lower_getattr_generic(MatrixType)
def _lower_getattr(context, builder, mt, val, attr):
    if attr in SWIZZLE:
        return builder.extract_value(val, SWIZZLE[attr])
    indices = swizzle_indices(attr)
    if indices is not None:     # v.zyx: a new vector of the picked components
        out = llir.Constant(context.get_value_type(MatrixType(mt.dtype, len(indices), ndim=1)), None)
        for k, index in enumerate(indices):
            out = builder.insert_value(out, builder.extract_value(val, index), k)
        return out
    if attr in ("n", "m"):
        return context.get_constant(types.intp, getattr(mt, attr))
    raise AttributeError(attr)


@lower_setattr_generic(MatrixType)
def _lower_setattr(context, builder, sig, args, attr):
    # kernels rewrite component stores (passes/rewrite_subscripts.py); what reaches here cannot be
    raise errors.TypingError(f"cannot assign '{attr}' of a {sig.args[0]}: vector/matrix values are immutable "
                             "outside kernels and qd.func (use matrix_with_item), and only components "
                             f"({', '.join(SWIZZLE)}) can be assigned")


# ---------------------------------------------------------------------------------------------
# constants, box and unbox
# ---------------------------------------------------------------------------------------------


@lower_constant(MatrixType)
def _lower_matrix_constant(context, builder, ty, pyval):
    flat = pyval.to_numpy().reshape(-1)
    consts = [context.get_constant_generic(builder, ty.dtype, v) for v in flat.tolist()]
    return llir.Constant(context.get_value_type(ty), consts)


@unbox(MatrixType)
def _unbox_matrix(typ, obj, c):
    # typeof() already checked obj is a qd Matrix of this shape, so _flat_tuple cannot fail.
    flat = c.pyapi.call_method(obj, "_flat_tuple", ())
    native = c.unbox(types.UniTuple(typ.dtype, typ.count), flat)
    c.pyapi.decref(flat)
    return NativeValue(native.value, is_error=native.is_error)


@box(MatrixType)
def _box_matrix(typ, val, c):
    tup = c.box(types.UniTuple(typ.dtype, typ.count), val)
    typ_obj = c.pyapi.unserialize(c.pyapi.serialize_object(typ))
    from_elements = c.pyapi.object_getattr_string(typ_obj, "from_elements")
    res = c.pyapi.call_function_objargs(from_elements, [tup])
    c.pyapi.decref(tup)
    c.pyapi.decref(from_elements)
    c.pyapi.decref(typ_obj)
    return res


__all__ = [
    "MatrixModel", "elements", "pack", "cast_all", "scalar_binop", "scalar_select", "scalar_sqrt", "dot_product",
    "matrix_from_tuple", "make_vector", "make_matrix", "matrix_to_tuple", "matrix_with_item",
]
