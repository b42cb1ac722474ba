"""Compiled helpers that passes/rewrite_subscripts.py calls: atomics, value updates, division.

Each is a Python function (so the rewrite can reference it as a global) with an
``@overload`` that picks the implementation from the argument types: the untyped rewrite
cannot know whether ``L[I] = V`` stores into an array or updates a local vector value.
"""

from __future__ import annotations

import operator

from numba.core import types
from numba.extending import overload

from .. import math as qd_math
from ..errors import QuadrantsTypeError, typing_error
from ..typing.field import FieldType
from ..typing.matrix import MatrixType
from .atomic_cas import element_cas
from .field import element_atomic, element_store
from .matrix import matrix_from_tuple, matrix_to_tuple, matrix_with_item

__all__ = ["element_atomic", "atomic_update", "nested_atomic", "subscript_store", "write_back", "apply_op",
           "true_divide", "as_index_tuple", "atomic_cas_update", "nested_atomic_cas", "cas_value"]


def _compiled_only(*args):
    raise NotImplementedError("compiled code only")


def atomic_update(base, index, value, op):
    """Atomic ``base[index] op= value``; returns the old value. ``index`` may be a vector."""
    _compiled_only()


def nested_atomic(base, outer_index, inner_index, value, op):
    _compiled_only()


def atomic_cas_update(base, index, expected, desired):
    """Atomic compare-and-swap of ``base[index]``; returns the old value."""
    _compiled_only()


def nested_atomic_cas(base, outer_index, inner_index, expected, desired):
    _compiled_only()


def cas_value(old, expected, desired):
    """The value a local holds after ``qd.atomic_cas`` on it (``desired`` where ``old == expected``)."""
    _compiled_only()


def subscript_store(target, index, value):
    _compiled_only()


def write_back(base, index, value):
    _compiled_only()


def apply_op(a, b, op):
    _compiled_only()


def true_divide(a, b, default_fp):
    _compiled_only()


def as_index_tuple(i):
    _compiled_only()


def index_vector(idx):
    """The vector index ``I`` of ``for I in qd.grouped(...)``, from an index tuple."""
    _compiled_only()


@overload(index_vector)
def _index_vector(idx):
    if not isinstance(idx, types.BaseTuple):
        return None
    vec = MatrixType(types.int32, len(idx), 1, 1)

    def impl(idx):
        return matrix_from_tuple(idx, vec)
    return impl


def _is_matrix(ty):
    return isinstance(ty, MatrixType)


def _is_data(ty):
    return isinstance(ty, (FieldType, types.Array))


@overload(as_index_tuple)
def _as_index_tuple(i):
    if has_vector_index(i):
        return lambda i: flat_index(i)
    if isinstance(i, types.Integer):
        return lambda i: (i,)
    if isinstance(i, types.BaseTuple):
        return lambda i: i
    if isinstance(i, types.NoneType):
        return lambda i: ()
    if _is_matrix(i):
        return lambda i: matrix_to_tuple(i)
    return None


@overload(atomic_update)
def _atomic_update(base, index, value, op):
    # the op is a string constant: Numba offers it unliteral first, and an implementation for
    # that would be compiled only to fail in element_atomic, at every typing of every call site
    # (never cached: 144 failed compiles in one FEM kernel); declining costs nothing
    if not _is_data(base) or not isinstance(op, types.StringLiteral):
        return None
    if _is_matrix(value) and _layout_has_elements(base):
        def impl_vec(base, index, value, op):
            return element_atomic(base, as_index_tuple(index), matrix_to_tuple(value), op)
        return impl_vec

    def impl(base, index, value, op):
        return element_atomic(base, as_index_tuple(index), value, op)
    return impl


@overload(atomic_cas_update)
def _atomic_cas_update(base, index, expected, desired):
    if not _is_data(base):
        return None
    return lambda base, index, expected, desired: element_cas(base, as_index_tuple(index), expected, desired)


@overload(nested_atomic_cas)
def _nested_atomic_cas(base, outer_index, inner_index, expected, desired):
    if not _is_data(base):
        return None

    def impl(base, outer_index, inner_index, expected, desired):
        return element_cas(base, as_index_tuple(outer_index) + as_index_tuple(inner_index), expected, desired)

    return impl


@overload(cas_value)
def _cas_value(old, expected, desired):
    dt = old.dtype if _is_matrix(old) else old
    if _is_matrix(old):
        return lambda old, expected, desired: qd_math.select(old == expected, qd_math.cast(desired, dt), old)
    return lambda old, expected, desired: qd_math.cast(desired, dt) if old == expected else old


def _layout_has_elements(ty):
    return isinstance(ty, FieldType) and bool(ty.elem_shape)


@overload(nested_atomic)
def _nested_atomic(base, outer_index, inner_index, value, op):
    if not _is_data(base) or not isinstance(op, types.StringLiteral):   # as _atomic_update
        return None

    def impl(base, outer_index, inner_index, value, op):
        return element_atomic(base, as_index_tuple(outer_index) + as_index_tuple(inner_index), value, op)

    return impl


@overload(subscript_store, prefer_literal=True)
def _subscript_store(target, index, value):
    if _is_matrix(target):
        if isinstance(index, types.IntegerLiteral):  # v[2] = x, v.z = x: a constant index, checked
            k = index.literal_value
            return lambda target, index, value: matrix_with_item(target, k, value)
        return lambda target, index, value: matrix_with_item(target, index, value)
    if isinstance(target, FieldType):
        def store_field(target, index, value):
            target[index] = value
            return target
        return store_field
    if isinstance(target, types.Array):
        def store_array(target, index, value):
            target[index] = value
            return target
        return store_array
    return None


@overload(write_back)
def _write_back(base, index, value):
    if _is_matrix(value) and _is_data(base):
        def store(base, index, value):
            base[index] = value
            return 0
        return store
    return lambda base, index, value: 0


_OPS = {
    "add": lambda a, b: a + b,
    "sub": lambda a, b: a - b,
    "and": lambda a, b: a & b,
    "or": lambda a, b: a | b,
    "xor": lambda a, b: a ^ b,
    "min": lambda a, b: min(a, b),
    "max": lambda a, b: max(a, b),
    "mul": lambda a, b: a * b,
}


@overload(apply_op)
def _apply_op(a, b, op):
    if not isinstance(op, types.StringLiteral):
        return None
    if op.literal_value == "xchg":  # the new value, in the local's type
        dt = a.dtype if _is_matrix(a) else a
        return lambda a, b, op: qd_math.cast(b, dt)
    fn = _OPS[op.literal_value]
    if op.literal_value in ("min", "max") and _is_matrix(a):
        fn = qd_math.min if op.literal_value == "min" else qd_math.max
    from numba import njit

    jitted = njit(inline="always")(fn)
    return lambda a, b, op: jitted(a, b)


@overload(true_divide)
def _true_divide(a, b, default_fp):
    """``a / b``; two integers divide in ``default_fp`` (a type constant of the compile's config)."""
    if isinstance(a, types.Integer) and isinstance(b, types.Integer):
        fp = default_fp.instance_type
        return lambda a, b, default_fp: fp(a) / fp(b)
    return lambda a, b, default_fp: a / b


_ = element_store  # re-exported for the passes


def _int_vector(ty):
    return _is_matrix(ty) and ty.is_vector and isinstance(ty.dtype, types.Integer)


def has_vector_index(idx) -> bool:
    """A tuple index with integer vectors among its items (``x[I, 1]``, ``x[0, I]``)."""
    return isinstance(idx, types.BaseTuple) and any(_int_vector(t) for t in idx)


def flat_index(idx):
    """The index tuple of ``x[I, 1]``: each vector item spread into its components."""
    _compiled_only()


@overload(flat_index)
def _flat_index(idx):
    if not has_vector_index(idx):
        return None
    parts = [f"matrix_to_tuple(idx[{k}])" if _int_vector(t) else f"(idx[{k}],)" for k, t in enumerate(idx)]
    namespace = {"matrix_to_tuple": matrix_to_tuple}
    exec(f"def flat(idx):\n    return {' + '.join(parts)}\n", namespace)  # one tuple expression per index type
    return namespace["flat"]


@overload(operator.getitem)
def _data_getitem_mixed_index(x, idx):
    """``x[I, 1]`` on a field or ndarray: Quadrants spreads a vector index into its components."""
    if isinstance(x, (types.Array, FieldType)) and has_vector_index(idx):
        return lambda x, idx: x[flat_index(idx)]
    return None


@overload(operator.setitem)
def _data_setitem_mixed_index(x, idx, value):
    if isinstance(x, (types.Array, FieldType)) and has_vector_index(idx):
        def store(x, idx, value):
            x[flat_index(idx)] = value
        return store
    return None


def spread_item(seq, k, count):
    """Item ``k`` of ``seq`` spread into a call ``f(*seq)`` that takes ``count`` items."""
    _compiled_only()


@overload(spread_item)
def _spread_item(seq, k, count):
    if not (isinstance(k, types.IntegerLiteral) and isinstance(count, types.IntegerLiteral)):
        return None
    size = seq.count if _is_matrix(seq) else len(seq) if isinstance(seq, types.BaseTuple) else None
    if size is None:
        return None
    if size != count.literal_value:
        raise typing_error(QuadrantsTypeError(
            f"a qd.func call with *args passes {size} values to {count.literal_value} positional parameters"))
    index = k.literal_value
    if _is_matrix(seq):
        return lambda seq, k, count: matrix_to_tuple(seq)[index]
    return lambda seq, k, count: seq[index]


@overload(tuple)
def _vector_as_tuple(v):
    """``tuple(I)``, as ``x[*I, 1]`` spells it, for an integer vector."""
    if _int_vector(v):
        return lambda v: matrix_to_tuple(v)
    return None


@overload(operator.getitem)
def _array_getitem_vector(arr, idx):
    """``a[I]`` for an ndarray and an integer vector index (``for I in qd.grouped(a)``)."""
    if isinstance(arr, types.Array) and _int_vector(idx) and idx.n == arr.ndim:
        return lambda arr, idx: arr[matrix_to_tuple(idx)]
    return None


@overload(operator.setitem)
def _array_setitem_vector(arr, idx, value):
    if isinstance(arr, types.Array) and _int_vector(idx) and idx.n == arr.ndim:
        def store(arr, idx, value):
            arr[matrix_to_tuple(idx)] = value
        return store
    return None
