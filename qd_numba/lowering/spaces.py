"""Iteration spaces of top-level loops, in compiled code and on the host.

The loop canonicaliser (passes/offload.py) turns every top-level ``for`` into a flat loop
``for flat in range(space_total(space))`` plus ``idx = space_index(space, flat)``, where a
*space* is a tuple of ``(start, stop, step)`` int64 triples, one per dimension, last
dimension fastest (row-major, as Quadrants). The helpers here build spaces from
``range(...)`` arguments, ``qd.ndrange`` arguments and field/ndarray shapes.

In compiled code they are intrinsics that emit a few LLVM instructions each: nothing here
goes through Numba's dispatcher, so the first kernel of a process pays no compile of helper
functions (an ``@overload`` version cost ~0.5 s of cold compile). The ``host_*`` functions
are the same semantics in Python, for iteration counts computed on the host (CUDA launcher).
"""

from __future__ import annotations

from llvmlite import ir as llir
from numba.core import cgutils, types
from numba.extending import intrinsic

from ..typing.field import FieldType
from .array_struct import array_struct
from .raising import raise_user_error

I64 = types.int64
DIM = types.UniTuple(I64, 3)
ZERO_STEP = "range() arg 3 must not be zero"
I64_ZERO = llir.Constant(llir.IntType(64), 0)
_STAR = (types.StarArgTuple, types.StarArgUniTuple)


def _int(t) -> bool:
    return isinstance(t, (types.Integer, types.Boolean))


def _is_space(space) -> bool:
    return isinstance(space, types.BaseTuple) and all(isinstance(d, types.BaseTuple) and len(d) == 3 for d in space)


def _space_type(ndim: int):
    return types.UniTuple(DIM, ndim)


def _make_space(context, builder, dims):
    """A space value from ``[(start, stop, step), ...]`` int64 LLVM values."""
    return context.make_tuple(builder, _space_type(len(dims)),
                              [context.make_tuple(builder, DIM, list(d)) for d in dims])


def _dims(builder, space_ty, space):
    return [cgutils.unpack_tuple(builder, d, 3) for d in cgutils.unpack_tuple(builder, space, len(space_ty))]


def _count(builder, start, stop, step):
    """Trip count of ``range(start, stop, step)``: ceil((stop - start) / step), at least 0."""
    zero, one = I64_ZERO, llir.Constant(start.type, 1)
    up = builder.icmp_signed(">", step, zero)
    # the distance in the direction of the step, minus one; the division is exact in sign
    # because a non-positive numerator gives 0 either way
    num = builder.select(up, builder.sub(builder.add(builder.sub(stop, start), step), one),
                         builder.sub(builder.sub(builder.sub(start, stop), step), one))
    den = builder.select(up, step, builder.neg(step))
    den = builder.select(builder.icmp_signed("==", den, zero), one, den)  # step 0 never gets here
    positive = builder.icmp_signed(">", num, zero)
    return builder.select(positive, builder.sdiv(num, den), zero)


def _i64(context, builder, ty, value):
    return context.cast(builder, value, ty, I64)


@intrinsic
def range_dim(typingctx, *args):
    """``range(stop)`` / ``range(start, stop)`` / ``range(start, stop, step)`` as a 1-d space."""
    if len(args) == 1 and isinstance(args[0], _STAR):
        args = tuple(args[0])
    if not 1 <= len(args) <= 3 or not all(_int(a) for a in args):
        return None

    def codegen(context, builder, sig, llargs):
        tys = sig.args
        if len(tys) == 1 and isinstance(tys[0], _STAR):
            tys, llargs = tuple(tys[0]), cgutils.unpack_tuple(builder, llargs[0], len(tys[0]))
        vals = [_i64(context, builder, t, v) for t, v in zip(tys, llargs)]
        one = llir.Constant(llir.IntType(64), 1)
        if len(vals) == 1:
            dim = (I64_ZERO, vals[0], one)
        elif len(vals) == 2:
            dim = (vals[0], vals[1], one)
        else:
            dim = tuple(vals)
            with cgutils.if_unlikely(builder, builder.icmp_signed("==", vals[2], I64_ZERO)):
                raise_user_error(context, builder, ValueError, (ZERO_STEP,))
        return _make_space(context, builder, [dim])

    return _space_type(1)(types.StarArgTuple.from_types(args)), codegen


@intrinsic
def ndrange_dim(typingctx, arg):
    """One ``qd.ndrange`` argument (``n`` or ``(start, stop)``) as a ``(start, stop, 1)`` triple."""
    pair = isinstance(arg, types.BaseTuple) and len(arg) == 2 and all(_int(t) for t in arg)
    if not (_int(arg) or pair):
        return None

    def codegen(context, builder, sig, llargs):
        one = llir.Constant(llir.IntType(64), 1)
        if pair:
            lo, hi = cgutils.unpack_tuple(builder, llargs[0], 2)
            dim = [_i64(context, builder, arg[0], lo), _i64(context, builder, arg[1], hi), one]
        else:
            dim = [I64_ZERO, _i64(context, builder, arg, llargs[0]), one]
        return context.make_tuple(builder, DIM, dim)

    return DIM(arg), codegen


@intrinsic
def shape_space(typingctx, x):
    """The space of a field's or array's index shape (a field's element dimensions excluded)."""
    if isinstance(x, FieldType):
        arrty, ndim = x.array_type, x.ndim
    elif isinstance(x, types.Array):
        arrty, ndim = x, x.ndim
    else:
        return None

    def codegen(context, builder, sig, llargs):
        value = llargs[0]
        if isinstance(x, FieldType):
            value = cgutils.create_struct_proxy(x)(context, builder, value=value).arr
        arr = array_struct(context, builder, arrty, value)
        shape = cgutils.unpack_tuple(builder, arr.shape, arrty.ndim)
        if getattr(x, "levels", None):    # a blocked layout: the index shape is a constant
            shape = [llir.Constant(context.get_value_type(types.intp), n) for n in x.logical_shape]
        i64 = llir.IntType(64)
        one = llir.Constant(i64, 1)
        offset = (getattr(x, "offset", None) or (0,) * ndim)    # a field's offset shifts its indices
        return _make_space(context, builder, [
            (llir.Constant(i64, o), builder.add(_i64(context, builder, types.intp, s), llir.Constant(i64, o)), one)
            for s, o in zip(shape[:ndim], offset)])

    return _space_type(ndim)(x), codegen


@intrinsic
def space_total(typingctx, space):
    """Number of points of a space (the product of its dimensions' trip counts)."""
    if not _is_space(space):
        return None

    def codegen(context, builder, sig, llargs):
        total = llir.Constant(llir.IntType(64), 1)
        for start, stop, step in _dims(builder, space, llargs[0]):
            total = builder.mul(total, _count(builder, start, stop, step))
        return total

    return I64(space), codegen


@intrinsic
def space_index(typingctx, space, flat):
    """The index tuple of flat position ``flat`` in a space (last dimension fastest)."""
    if not (_is_space(space) and _int(flat)):
        return None
    ndim = len(space)

    def codegen(context, builder, sig, llargs):
        dims = _dims(builder, space, llargs[0])
        rest = _i64(context, builder, flat, llargs[1])
        ks = [None] * ndim
        for d in reversed(range(1, ndim)):
            count = _count(builder, *dims[d])
            ks[d] = builder.srem(rest, count)
            rest = builder.sdiv(rest, count)
        if ndim:                    # a 0-d space (a 0-d field's struct-for) has one point, ()
            ks[0] = rest
        idx = [builder.add(dims[d][0], builder.mul(ks[d], dims[d][2])) for d in range(ndim)]
        return context.make_tuple(builder, types.UniTuple(I64, ndim), idx)

    return types.UniTuple(I64, ndim)(space, flat), codegen


# -- the same on the host -----------------------------------------------------------------------

def host_count(start: int, stop: int, step: int) -> int:
    if step > 0:
        return max(0, (stop - start + step - 1) // step)
    return max(0, (start - stop - step - 1) // (-step))


def host_range_dim(*args):
    if len(args) == 1:
        return ((0, int(args[0]), 1),)
    if len(args) == 2:
        return ((int(args[0]), int(args[1]), 1),)
    if int(args[2]) == 0:
        raise ValueError(ZERO_STEP)
    return ((int(args[0]), int(args[1]), int(args[2])),)


def host_ndrange_dim(arg):
    if isinstance(arg, tuple):
        return (int(arg[0]), int(arg[1]), 1)
    return (0, int(arg), 1)


def host_space_total(space) -> int:
    total = 1
    for d in space:
        total *= host_count(*d)
    return total
