"""Element access on ndarray arguments without negative-index wraparound.

``a[i]`` on a Numba array wraps a negative index around (``i < 0 ? i + n : i``). In a kernel
the index is an iteration-space value whose sign LLVM cannot prove, so every access carries a
compare and a select, and the loop is not vectorised (saxpy ran at half the speed of a Numba
``prange``; bench/cpu_bench.py). Quadrants has no wraparound: a negative index is out of
bounds. :func:`array_load` / :func:`array_store` compute the element address directly when
the index selects one element of a plain array (one integer per dimension); any other index
(slices, vector indices, a partial index giving a view) is the ordinary ``a[i]``.

passes/array_access.py rewrites kernel accesses to these helpers; with ``debug=True`` to
:func:`checked_array_load` / :func:`checked_array_store`, which also check every index against
its axis (a negative index is out of bounds) and raise ``IndexError`` — on the CPU and on CUDA,
where numba-cuda itself never checks bounds. Other indices keep Numba's indexing (bounds-checked
by Numba on the CPU under ``debug=True``).
"""

from __future__ import annotations

import operator

from numba.core import cgutils, types
from numba.extending import intrinsic

from ..errors import QuadrantsTypeError, typing_error
from .array_struct import array_struct
from .field import _index_arity, _index_values, bounds_check


def _is_element_access(arr, idx) -> bool:
    return isinstance(arr, types.Array) and arr.ndim >= 1 and _index_arity(idx) == arr.ndim


def _element_pointer(context, builder, arrty, arrval, idxty, idxval, checked=False):
    ary = array_struct(context, builder, arrty, arrval)
    shape = cgutils.unpack_tuple(builder, ary.shape, arrty.ndim)
    strides = cgutils.unpack_tuple(builder, ary.strides, arrty.ndim)
    raw, raw_types = _index_values(builder, idxty, idxval)
    inds = [context.cast(builder, v, t, types.intp) for v, t in zip(raw, raw_types)]
    if checked:
        bounds_check(context, builder, inds, shape, arrty)
    return cgutils.get_item_pointer2(context, builder, ary.data, shape, strides, arrty.layout, inds)


def _fallback(typingctx, fn, argtys):
    """(signature, codegen) of the ordinary ``fn(*args)`` (operator.getitem / setitem)."""
    fnty = typingctx.resolve_value_type(fn)
    sig = typingctx.resolve_function_type(fnty, argtys, {})
    if sig is None:
        return None

    def codegen(context, builder, _sig, args):
        impl = context.get_function(fnty, sig)
        cast = [context.cast(builder, v, t, ft) for v, t, ft in zip(args, argtys, sig.args)]
        return impl(builder, cast)

    return sig.return_type(*argtys), codegen


def _reject_float_index(arr, idx, what) -> None:
    """``a[i / 2]``: our error, instead of Numba's report on every ``getitem`` overload."""
    if isinstance(arr, types.Array) and any(isinstance(t, types.Float) for t in
                                            (idx if isinstance(idx, types.BaseTuple) else (idx,))):
        raise typing_error(QuadrantsTypeError(
            f"cannot {what} {arr} with {idx}: indices must be integers (i / 2 is a float; i // 2 is not)"))


def _load(typingctx, arr, idx, checked):
    _reject_float_index(arr, idx, "read")
    if not _is_element_access(arr, idx):
        return _fallback(typingctx, operator.getitem, (arr, idx))

    def codegen(context, builder, sig, args):
        ptr = _element_pointer(context, builder, sig.args[0], args[0], sig.args[1], args[1], checked)
        return context.unpack_value(builder, sig.return_type, ptr)

    return arr.dtype(arr, idx), codegen


def _store(typingctx, arr, idx, value, checked):
    _reject_float_index(arr, idx, "write")
    if not _is_element_access(arr, idx) or not arr.mutable or not typingctx.can_convert(value, arr.dtype):
        return _fallback(typingctx, operator.setitem, (arr, idx, value))

    def codegen(context, builder, sig, args):
        arrty, idxty, valty = sig.args
        ptr = _element_pointer(context, builder, arrty, args[0], idxty, args[1], checked)
        context.pack_value(builder, arrty.dtype, context.cast(builder, args[2], valty, arrty.dtype), ptr)
        return context.get_dummy_value()

    return types.none(arr, idx, value), codegen


@intrinsic
def array_load(typingctx, arr, idx):
    """``arr[idx]``; one element of an array: no wraparound."""
    return _load(typingctx, arr, idx, False)


@intrinsic
def array_store(typingctx, arr, idx, value):
    """``arr[idx] = value``; one element of a writable array: no wraparound."""
    return _store(typingctx, arr, idx, value, False)


@intrinsic
def checked_array_load(typingctx, arr, idx):
    """``arr[idx]`` with a bounds check (``debug=True``)."""
    return _load(typingctx, arr, idx, True)


@intrinsic
def checked_array_store(typingctx, arr, idx, value):
    """``arr[idx] = value`` with a bounds check (``debug=True``)."""
    return _store(typingctx, arr, idx, value, True)
