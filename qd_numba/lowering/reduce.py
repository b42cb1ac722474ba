"""Compiled helpers of passes/reductions.py: per-thread partials and their one combine.

A reduction keeps a private *partial* per thread (CUDA) or per chunk (CPU) instead of one
atomic per iteration:

* ``reduce_identity(like, op)``: the identity of ``op`` in ``like``'s element type (``like`` is
  a field/ndarray, whose value dtype counts, or a scalar);
* ``reduce_step(partial, value, op)``: ``partial op value`` in the partial's type (``op`` is
  the update's own: ``sub`` subtracts, and the combine then adds);
* ``reduce_combine(data, index, partial, op, warp)``: one atomic ``data[index] op= partial``.
  With ``warp`` on CUDA, the lanes of a full warp first reduce their partials with shuffles
  and only lane 0 does the atomic; a partial warp (a lane exited, debug mode) falls back to one
  atomic per lane. On the CPU ``warp`` changes nothing;
* ``reduction_cell(buf, k, like)``: a 1-element array of ``like``'s type over the 8-byte cell
  ``k`` of the ``u64`` field ``buf`` (the value of a kernel-scope local while its loop runs).

Supported element types: 32- and 64-bit integers and floats.
"""

from __future__ import annotations

import numpy as np
from llvmlite import ir as llir
from numba.core import cgutils, types
from numba.extending import intrinsic, overload

from ..errors import QuadrantsTypeError, typing_error
from ..typing.field import FieldType
from .field import _layout, element_atomic
from .subscripts import as_index_tuple

__all__ = ["reduce_identity", "reduce_step", "reduce_combine", "reduction_cell", "warp_reduce", "CELL_BYTES"]

CELL_BYTES = 8
COMBINE_OP = {"add": "add", "sub": "add", "min": "min", "max": "max"}
"""The atomic that combines partials, per update op (``-=`` accumulates, then adds)."""


def _compiled_only(*args):
    raise NotImplementedError("compiled code only")


def reduce_identity(like, op):
    _compiled_only()


def reduce_step(partial, value, op):
    _compiled_only()


def reduce_combine(data, index, partial, op, warp):
    _compiled_only()


def _scalar(ty):
    """The reduced scalar type of a field/ndarray or of a value, or None if not supported."""
    layout = _layout(ty)
    if layout is not None:
        if layout[2]:        # vector/matrix elements
            return None
        ty = layout[0]
    ty = types.unliteral(ty)
    if isinstance(ty, (types.Integer, types.Float)) and ty.bitwidth in (32, 64):
        return ty
    return None


def _checked_scalar(ty):
    scalar = _scalar(ty)
    if scalar is None:
        raise typing_error(QuadrantsTypeError(
            f"a parallel reduction into a {types.unliteral(ty)} is not supported: use a scalar of a 32- or "
            "64-bit integer or float type"))
    return scalar


def _identity(ty, op):
    """``op``'s identity as a numpy scalar of ``ty`` (which a closure freezes with its type)."""
    np_type = np.dtype(str(ty)).type
    if op in ("add", "sub"):
        return np_type(0)
    if isinstance(ty, types.Float):
        return np_type(np.inf if op == "min" else -np.inf)
    return np_type(ty.maxval if op == "min" else ty.minval)


@overload(reduce_identity)
def _reduce_identity(like, op):
    if not isinstance(op, types.StringLiteral):
        return None
    ty = _checked_scalar(like)
    value = _identity(ty, op.literal_value)
    return lambda like, op: value


@overload(reduce_step)
def _reduce_step(partial, value, op):
    if not isinstance(op, types.StringLiteral):
        return None
    ty = _checked_scalar(partial)
    name = op.literal_value
    if name == "add":
        return lambda partial, value, op: ty(partial + ty(value))
    if name == "sub":
        return lambda partial, value, op: ty(partial - ty(value))
    if name == "min":
        return lambda partial, value, op: min(partial, ty(value))
    return lambda partial, value, op: max(partial, ty(value))


@overload(reduce_combine)
def _reduce_combine(data, index, partial, op, warp):
    if not (isinstance(op, types.StringLiteral) and isinstance(warp, types.BooleanLiteral)):
        return None
    if warp.literal_value:
        def combine_warp(data, index, partial, op, warp):
            total, leader = warp_reduce(partial, op)
            if leader:
                element_atomic(data, as_index_tuple(index), total, op)
        return combine_warp

    def combine(data, index, partial, op, warp):
        element_atomic(data, as_index_tuple(index), partial, op)
    return combine


# -- warp reduction ------------------------------------------------------------------------------------

_FULL_MASK = 0xFFFFFFFF


def _combine_values(builder, ty, op, a, b):
    if op == "add":
        return builder.fadd(a, b) if isinstance(ty, types.Float) else builder.add(a, b)
    if isinstance(ty, types.Float):
        pick_a = builder.fcmp_ordered("<" if op == "min" else ">", a, b)
    else:
        cmp = builder.icmp_signed if ty.signed else builder.icmp_unsigned
        pick_a = cmp("<" if op == "min" else ">", a, b)
    return builder.select(pick_a, a, b)


def _shuffle_xor(builder, value, offset: int):
    """``__shfl_xor_sync(full mask, value, offset)`` for a 32- or 64-bit value."""
    i32, i64 = llir.IntType(32), llir.IntType(64)
    fnty = llir.FunctionType(llir.LiteralStructType((i32, llir.IntType(1))), (i32,) * 5)
    shfl = cgutils.get_or_insert_function(builder.module, fnty, "llvm.nvvm.shfl.sync.i32")
    bits = value.type.width if isinstance(value.type, llir.IntType) else \
        (32 if isinstance(value.type, llir.FloatType) else 64)
    as_int = builder.bitcast(value, llir.IntType(bits)) if not isinstance(value.type, llir.IntType) else value

    def one(word):  # mode 3 = bfly; 0x1f: the whole warp is one segment
        return builder.extract_value(builder.call(shfl, (i32(_FULL_MASK), i32(3), word, i32(offset), i32(0x1F))), 0)

    if bits == 32:
        out = one(as_int)
    else:
        lo = one(builder.trunc(as_int, i32))
        hi = one(builder.trunc(builder.lshr(as_int, i64(32)), i32))
        out = builder.or_(builder.shl(builder.zext(hi, i64), i64(32)), builder.zext(lo, i64))
    return builder.bitcast(out, value.type) if not isinstance(value.type, llir.IntType) else out


@intrinsic
def warp_reduce(typingctx, value, op):
    """``(total, leader)``: on CUDA, when all 32 lanes are here, every lane's ``value``
    combined by ``op`` (a butterfly of shuffles) and ``leader`` true on lane 0 only; else (a
    partial warp, or the CPU) the lane's own value and ``leader`` true."""
    if not isinstance(op, types.StringLiteral) or _scalar(value) is None:
        return None
    ty = types.unliteral(value)
    combine_op = COMBINE_OP[op.literal_value]
    sig = types.Tuple((ty, types.boolean))(value, op)

    def codegen(context, builder, sig, args):
        from .device import is_cuda_context

        val = context.cast(builder, args[0], sig.args[0], ty)
        true = cgutils.true_bit
        if not is_cuda_context(context):
            return context.make_tuple(builder, sig.return_type, [val, true])
        i32 = llir.IntType(32)
        activemask = llir.InlineAsm(llir.FunctionType(i32, []), "activemask.b32 $0;", "=r", side_effect=True)
        full = builder.icmp_unsigned("==", builder.call(activemask, []), i32(_FULL_MASK))
        before = builder.block
        with builder.if_then(full):
            total = val
            for offset in (16, 8, 4, 2, 1):
                total = _combine_values(builder, ty, combine_op, total, _shuffle_xor(builder, total, offset))
            laneid = cgutils.get_or_insert_function(builder.module, llir.FunctionType(i32, ()),
                                                    "llvm.nvvm.read.ptx.sreg.laneid")
            is_lane0 = builder.icmp_unsigned("==", builder.call(laneid, ()), i32(0))
            reduced_block = builder.block
        result = builder.phi(val.type)
        result.add_incoming(total, reduced_block)
        result.add_incoming(val, before)
        leader = builder.phi(llir.IntType(1))
        leader.add_incoming(is_lane0, reduced_block)
        leader.add_incoming(true, before)
        return context.make_tuple(builder, sig.return_type, [result, leader])

    return sig, codegen


# -- kernel-scope cells ----------------------------------------------------------------------------------

@intrinsic
def reduction_cell(typingctx, buf, k, like):
    if not (isinstance(buf, FieldType) and isinstance(k, types.IntegerLiteral)):
        return None
    ty = _checked_scalar(like)
    arrty = types.Array(ty, 1, "C")

    def codegen(context, builder, sig, args):
        bufty = sig.args[0]
        field = cgutils.create_struct_proxy(bufty)(context, builder, value=args[0])
        src = context.make_array(bufty.array_type)(context, builder, field.arr)
        i8p = llir.IntType(8).as_pointer()
        raw = builder.gep(builder.bitcast(src.data, i8p), [llir.IntType(64)(k.literal_value * CELL_BYTES)])
        dtype_ll = context.get_data_type(ty)
        itemsize = context.get_abi_sizeof(dtype_ll)
        intp = context.get_value_type(types.intp)
        ary = context.make_array(arrty)(context, builder)
        context.populate_array(ary, data=builder.bitcast(raw, dtype_ll.as_pointer()), shape=[intp(1)],
                               strides=[intp(itemsize)], itemsize=intp(itemsize), meminfo=None)
        return ary._getvalue()

    return arrty(buf, k, like), codegen
