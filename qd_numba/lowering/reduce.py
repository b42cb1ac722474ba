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
* ``reduction_cell(buf, k, like)``: an array of ``like``'s element type over the 8-byte cells
  ``k, k+1, ...`` of the ``u64`` field ``buf`` (the value of a kernel-scope local while its loop
  runs: one cell for a scalar, one per element for a vector/matrix local); ``cell_store`` and
  ``cell_load`` move the local's value in and out.

Supported element types: 32- and 64-bit integers and floats; a kernel-scope local may also be a
vector or matrix of them (at most ``CELLS_PER_LOCAL`` elements), reduced element by element.
"""

from __future__ import annotations

import numpy as np
from llvmlite import ir as llir
from numba.core import cgutils, types
from numba.extending import intrinsic, overload

from ..errors import QuadrantsTypeError, typing_error
from ..typing.field import FieldType
from ..typing.matrix import MatrixType
from .array_struct import abi_sizeof, array_struct
from .field import _layout, element_atomic
from .matrix import matrix_from_tuple, matrix_to_tuple
from .subscripts import as_index_tuple

__all__ = ["reduce_identity", "reduce_step", "reduce_combine", "reduction_cell", "cell_store", "cell_load",
           "warp_reduce", "CELL_BYTES", "CELLS_PER_LOCAL"]

CELL_BYTES = 8
CELLS_PER_LOCAL = 16        # cells a kernel-scope local may use: a vector/matrix of up to 16 elements
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
    """The reduced scalar type of ``ty``, a vector/matrix local's element type included."""
    scalar = _scalar(ty.dtype) if _is_local_matrix(ty) else _scalar(ty)
    if scalar is None:
        raise typing_error(QuadrantsTypeError(
            f"a parallel reduction into a {types.unliteral(ty)} is not supported: use a scalar, vector or "
            f"matrix (at most {CELLS_PER_LOCAL} elements) of a 32- or 64-bit integer or float type"))
    return scalar


def _is_local_matrix(ty) -> bool:
    """A vector/matrix kernel-scope local small enough for its block of cells."""
    return isinstance(ty, MatrixType) and ty.count <= CELLS_PER_LOCAL


def _generated(name: str, params: str, body: str, **namespace):
    """A function of one return expression, written per type (one expression per component)."""
    exec(f"def {name}({params}):\n    return {body}\n", namespace)
    return namespace[name]


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
    if _is_local_matrix(like):
        mty = types.unliteral(like)
        return _generated("identity", "like, op", f"matrix_from_tuple(({'value, ' * mty.count}), mty)",
                          matrix_from_tuple=matrix_from_tuple, value=value, mty=mty)
    return lambda like, op: value


_STEP = {"add": "ty({p} + ty({v}))", "sub": "ty({p} - ty({v}))", "min": "min({p}, ty({v}))",
         "max": "max({p}, ty({v}))"}


@overload(reduce_step)
def _reduce_step(partial, value, op):
    if not isinstance(op, types.StringLiteral):
        return None
    ty = _checked_scalar(partial)
    step = _STEP[op.literal_value]
    if not _is_local_matrix(partial):
        return _generated("step", "partial, value, op", step.format(p="partial", v="value"), ty=ty)
    mty = types.unliteral(partial)
    if isinstance(value, MatrixType) and value.shape != mty.shape:
        return None
    v = "matrix_to_tuple(value)[{k}]" if isinstance(value, MatrixType) else "value"   # a scalar broadcasts
    parts = ", ".join(step.format(p=f"matrix_to_tuple(partial)[{k}]", v=v.format(k=k)) for k in range(mty.count))
    return _generated("step", "partial, value, op", f"matrix_from_tuple(({parts},), mty)", ty=ty, mty=mty,
                      matrix_from_tuple=matrix_from_tuple, matrix_to_tuple=matrix_to_tuple)


@overload(reduce_combine)
def _reduce_combine(data, index, partial, op, warp):
    if not (isinstance(op, types.StringLiteral) and isinstance(warp, types.BooleanLiteral)):
        return None
    if _is_local_matrix(partial):   # a vector/matrix local's cells: one combine per component
        parts = [f"reduce_combine(data, {k}, matrix_to_tuple(partial)[{k}], op, warp)"
                 for k in range(partial.count)]
        return _generated("combine", "data, index, partial, op, warp", f"({', '.join(parts)},)",
                          reduce_combine=reduce_combine, matrix_to_tuple=matrix_to_tuple)
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

def cell_store(cells, value):
    """``cells[...] = value``: a kernel-scope local into its cells (a vector: one per element)."""
    _compiled_only()


def cell_load(cells, like):
    """The value of a kernel-scope local of ``like``'s type, from its cells."""
    _compiled_only()


@overload(cell_store)
def _cell_store(cells, value):
    if not isinstance(cells, types.Array):
        return None
    if _is_local_matrix(value):
        def store_all(cells, value):
            elements = matrix_to_tuple(value)
            for k in range(len(elements)):
                cells[k] = elements[k]
        return store_all

    def store(cells, value):
        cells[0] = value
    return store


@overload(cell_load)
def _cell_load(cells, like):
    if not isinstance(cells, types.Array):
        return None
    if _is_local_matrix(like):
        mty = types.unliteral(like)
        parts = "".join(f"cells[{k}], " for k in range(mty.count))
        return _generated("load", "cells, like", f"matrix_from_tuple(({parts}), mty)",
                          matrix_from_tuple=matrix_from_tuple, mty=mty)
    return lambda cells, like: cells[0]


@intrinsic
def reduction_cell(typingctx, buf, k, like):
    if not (isinstance(buf, FieldType) and isinstance(k, types.IntegerLiteral)):
        return None
    ty = _checked_scalar(like)
    count = like.count if _is_local_matrix(like) else 1
    arrty = types.Array(ty, 1, "A")

    def codegen(context, builder, sig, args):
        bufty = sig.args[0]
        field = cgutils.create_struct_proxy(bufty)(context, builder, value=args[0])
        src = array_struct(context, builder, bufty.array_type, field.arr)
        i8p = llir.IntType(8).as_pointer()
        raw = builder.gep(builder.bitcast(src.data, i8p), [llir.IntType(64)(k.literal_value * CELL_BYTES)])
        dtype_ll = context.get_data_type(ty)
        itemsize = abi_sizeof(context, dtype_ll)
        intp = context.get_value_type(types.intp)
        ary = array_struct(context, builder, arrty)
        context.populate_array(ary, data=builder.bitcast(raw, dtype_ll.as_pointer()), shape=[intp(count)],
                               strides=[intp(CELL_BYTES)], itemsize=intp(itemsize), meminfo=None)
        return ary._getvalue()

    return arrty(buf, k, like), codegen
