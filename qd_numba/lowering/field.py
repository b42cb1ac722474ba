"""Element access on fields and ndarrays: loads, stores, atomics, bounds checks.

Three intrinsics do all the work, for ``FieldType`` and for plain Numba arrays alike, and
speak in scalars or flat tuples of scalars (one per vector/matrix component, row-major):

* ``element_load(f, idx)``            -> scalar, or tuple of components
* ``element_store(f, idx, value)``    (value: scalar or tuple; cast to the dtype)
* ``element_atomic(f, idx, value, op)`` -> old value; ``op`` in ``ATOMIC_OPS``

``idx`` is an integer, a tuple of integers, or ``None`` (0-d). The number of indices must
match the element dimensions; a mismatch is a :class:`QuadrantsIndexError` at compile time.
``FieldType(checked=True)`` raises ``IndexError`` on an out-of-bounds index (``debug=True``),
which the kernel call turns into ``QuadrantsRuntimeError`` naming the kernel.

The ``getitem``/``setitem``/``shape`` overloads at the bottom give fields Python syntax and
convert component tuples to and from vector/matrix values.
"""

from __future__ import annotations

import operator

from llvmlite import ir as llir
from numba.core import cgutils, types
from numba.core.imputils import lower_builtin
from numba.core.typing.templates import AbstractTemplate, infer_global
from numba.extending import intrinsic, overload, overload_attribute, overload_method

from ..errors import QuadrantsIndexError, QuadrantsTypeError, typing_error
from ..typing.field import FieldType
from ..typing.matrix import MatrixType
from .array_struct import array_struct
from .matrix import matrix_from_tuple, matrix_to_tuple
from .raising import raise_user_error

# qd op name -> (LLVM op for signed ints, unsigned ints, floats); None: not supported.
ATOMIC_OPS = {
    "add": ("add", "add", "fadd"),
    "sub": ("sub", "sub", "fsub"),
    "min": ("min", "umin", "fmin"),
    "max": ("max", "umax", "fmax"),
    "and": ("and", "and", None),
    "or": ("or", "or", None),
    "xor": ("xor", "xor", None),
    "mul": ("mul", "mul", "fmul"),      # lowering/atomics.py: a compare-and-swap loop
    "xchg": ("xchg", "xchg", "xchg"),   # lowering/atomics.py: on the element's bits
}


def _layout(ty):
    """(scalar value dtype, element ndim, element shape, checked, array type) of a field or array
    type (the value dtype of f16 data is f32; typing/field.py)."""
    if isinstance(ty, FieldType):
        return ty.value_dtype, ty.ndim, ty.elem_shape, ty.checked, ty.array_type
    if isinstance(ty, types.Array):
        return ty.dtype, ty.ndim, (), False, ty
    return None


def _index_arity(idx):
    if isinstance(idx, types.NoneType):
        return 0
    if isinstance(idx, types.Integer):
        return 1
    if isinstance(idx, types.BaseTuple) and all(isinstance(t, types.Integer) for t in idx):
        return len(idx)
    return None


def check_index(ty, idx, what="index", component=False):
    """Raise QuadrantsIndexError unless ``idx`` is a valid element (or component) index for ``ty``."""
    _, ndim, elem_shape, _, _ = _layout(ty)
    arity = _index_arity(idx)
    if arity is None:
        raise typing_error(QuadrantsTypeError(f"cannot {what} {ty} with {idx}: indices must be integers"))
    expected = ndim + (len(elem_shape) if component else 0)
    if arity != expected:
        raise typing_error(QuadrantsIndexError(
            f"{ty} has {ndim} dimension(s) but is accessed with {arity} index(es)"
            if not component else f"{ty} component access needs {expected} indices, got {arity}"
        ))


def _index_values(builder, idxty, idxval):
    if isinstance(idxty, types.NoneType):
        return [], []
    if isinstance(idxty, types.Integer):
        return [idxval], [idxty]
    return cgutils.unpack_tuple(builder, idxval, len(idxty)), list(idxty)


def bounds_check(context, builder, inds, shape, ty) -> None:
    """Raise IndexError unless ``0 <= inds[k] < shape[k]`` for every axis (one unsigned compare
    each: a negative index is out of bounds, as in Quadrants; there is no wraparound)."""
    for axis, (ind, dim) in enumerate(zip(inds, shape)):
        out = builder.icmp_unsigned(">=", ind, dim)
        with cgutils.if_unlikely(builder, out):
            raise_user_error(context, builder, IndexError, (f"index out of bounds on axis {axis} of a {ty}",))


def _component_pointers(context, builder, ty, val, idxty, idxval, write=False):
    """Pointers to each component of the selected element, bounds-checked if ``ty.checked``
    (``write``: for a store or an atomic, which reach a pointer node's spare block, not its
    always-zero one, in a cell without a block)."""
    dtype, ndim, elem_shape, checked, arrty = _layout(ty)
    arrval = cgutils.create_struct_proxy(ty)(context, builder, value=val).arr if isinstance(ty, FieldType) else val
    ary = array_struct(context, builder, arrty, arrval)
    shape = cgutils.unpack_tuple(builder, ary.shape, arrty.ndim)
    strides = cgutils.unpack_tuple(builder, ary.strides, arrty.ndim)
    raw, raw_types = _index_values(builder, idxty, idxval)
    intp = context.get_value_type(types.intp)
    inds = [context.cast(builder, v, t, types.intp) for v, t in zip(raw, raw_types)]
    if isinstance(ty, FieldType) and ty.offset:    # qd.field(..., offset=...): x[offset] is the first element
        inds = [builder.sub(v, llir.Constant(intp, o)) if k < len(ty.offset) and ty.offset[k] else v
                for k, (v, o) in enumerate(zip(inds, ty.offset + (0,) * len(inds)))]
    pool = ty.pool if isinstance(ty, FieldType) else None
    levels = ty.levels if isinstance(ty, FieldType) else None
    if checked:
        index_shape = [llir.Constant(intp, n) for n in ty.logical_shape] + shape[arrty.ndim - len(elem_shape):] \
            if ty.logical_shape is not None else shape
        bounds_check(context, builder, inds, index_shape, ty)
    if pool is not None:
        inds = _pool_indices(builder, ary.data, pool, inds[:ndim], write) + inds[ndim:]
    elif levels:
        inds = _level_indices(builder, levels, inds[:ndim]) + inds[ndim:]
    if len(inds) == arrty.ndim:  # a single component of a vector/matrix element
        return [cgutils.get_item_pointer2(context, builder, ary.data, shape, strides, arrty.layout, inds)]
    pointers = []
    for comp in _component_indices(elem_shape):
        full = inds + [llir.Constant(intp, c) for c in comp]
        pointers.append(cgutils.get_item_pointer2(context, builder, ary.data, shape, strides, arrty.layout, full))
    return pointers


def _pool_indices(builder, data, pool, inds, write):
    """The buffer indices of an element of a field below a pointer node (snode.PoolLayout): its
    cell's block (from the node's slot; when the cell has none, the always-zero block ``capacity``
    to read, the spare block ``capacity + 1`` to write), then the digits of the levels below the
    node."""
    levels, outer, slot_offset, slot_strides, capacity = pool
    digits = _level_indices(builder, levels, inds)
    intp = digits[0].type
    i32 = llir.IntType(32)
    addr = builder.add(builder.ptrtoint(data, intp), llir.Constant(intp, slot_offset))
    for d, stride in zip(digits[:outer], slot_strides):
        addr = builder.add(addr, builder.mul(d, llir.Constant(intp, stride)))
    slot = builder.sext(builder.load(builder.inttoptr(addr, i32.as_pointer())), intp)
    none = builder.icmp_signed("==", slot, llir.Constant(intp, 0))
    block = builder.select(none, llir.Constant(intp, capacity + 1 if write else capacity),
                           builder.sub(slot, llir.Constant(intp, 1)))
    return [block] + digits[outer:]


def _level_indices(builder, levels, inds):
    """A blocked layout's buffer indices (typing/field.py): per level, the index's digit there."""
    intp = inds[0].type if inds else llir.IntType(64)
    out = []
    for k, (axis, size) in enumerate(levels):
        inner = 1
        for a, s in levels[k + 1:]:
            if a == axis:
                inner *= s
        digit = builder.sdiv(inds[axis], llir.Constant(intp, inner)) if inner > 1 else inds[axis]
        outer = any(a == axis for a, _ in levels[:k])
        out.append(builder.srem(digit, llir.Constant(intp, size)) if outer else digit)
    return out


def _component_indices(elem_shape):
    if not elem_shape:
        return [()]
    if len(elem_shape) == 1:
        return [(i,) for i in range(elem_shape[0])]
    return [(i, j) for i in range(elem_shape[0]) for j in range(elem_shape[1])]


def _value_type(ty):
    dtype, _, elem_shape, _, _ = _layout(ty)
    if not elem_shape:
        return dtype
    count = 1
    for s in elem_shape:
        count *= s
    return types.UniTuple(dtype, count)


def _components(builder, valty, val, count):
    if isinstance(valty, types.BaseTuple):
        if len(valty) != count:
            raise QuadrantsTypeError(f"cannot store a value with {len(valty)} components into elements of {count}")
        return cgutils.unpack_tuple(builder, val, count), list(valty)
    return [val] * count, [valty] * count  # a scalar fills every component


def _is_half(ty) -> bool:
    return isinstance(ty, FieldType) and ty.dtype == types.float16


def _check_half_conversions(context) -> None:
    """x86 converts f16 <-> f32 with F16C instructions; without them LLVM calls compiler-rt
    helpers that Numba's JIT does not link (the process would crash)."""
    from llvmlite import binding as llvm

    from .device import is_cuda_context

    if is_cuda_context(context) or not llvm.get_process_triple().startswith(("x86_64", "i686")):
        return
    if "+f16c" not in getattr(context.codegen(), "_tm_features", "+f16c"):
        raise typing_error(QuadrantsTypeError("f16 fields need a CPU with F16C instructions; use qd.f32 on "
                                              "this machine"))


def _load_scalar(context, builder, ty, ptr):
    """One element component as the value dtype (f16 bits widen to f32)."""
    if _is_half(ty):
        bits = builder.load(ptr)
        return builder.fpext(builder.bitcast(bits, llir.HalfType()), llir.FloatType())
    return context.unpack_value(builder, _layout(ty)[0], ptr)


def _store_scalar(context, builder, ty, value, valty, ptr) -> None:
    """Store ``value`` (of type ``valty``) into one element component, converted to the dtype."""
    if not _is_half(ty):
        dtype = _layout(ty)[0]
        context.pack_value(builder, dtype, context.cast(builder, value, valty, dtype), ptr)
        return
    if valty == types.float64:  # round once, as numpy's astype(float16) does
        single = _round_to_odd_f32(builder, value)
    else:
        single = context.cast(builder, value, valty, types.float32)
    builder.store(builder.bitcast(builder.fptrunc(single, llir.HalfType()), llir.IntType(16)), ptr)


@intrinsic
def stored_value(typingctx, value, dtype_name):
    """What a load of a scalar element of dtype ``dtype_name`` (not ``f16``) returns after a store
    of ``value`` there: the store's conversion. passes/cfg_optimize.py forwards stores with it."""
    if not isinstance(dtype_name, types.StringLiteral):
        return None
    dtype = getattr(types, dtype_name.literal_value)
    if not typingctx.can_convert(value, dtype):
        return None

    def codegen(context, builder, sig, args):
        return context.cast(builder, args[0], sig.args[0], dtype)

    return dtype(value, dtype_name), codegen


def _round_to_odd_f32(builder, x):
    """``x`` (double) as a float rounded to odd: exact values stay, inexact ones get the odd
    neighbour toward zero. Rounding that to half then equals rounding ``x`` to half directly
    (float keeps at least 2 bits more than half's 11); rounding to nearest twice would not."""
    f32, i32 = llir.FloatType(), llir.IntType(32)
    nearest = builder.fptrunc(x, f32)
    back = builder.fpext(nearest, x.type)
    inexact = builder.fcmp_unordered("!=", back, x)
    # nearest rounded away from zero: step its magnitude back (same sign: bits - 1)
    away = builder.xor(builder.fcmp_ordered(">", back, x), builder.fcmp_ordered("<", x, x.type(0.0)))
    bits = builder.sub(builder.bitcast(nearest, i32), builder.zext(builder.and_(inexact, away), i32))
    return builder.bitcast(builder.or_(bits, builder.zext(inexact, i32)), f32)


def _half_atomic(builder, opname, ptr, value):
    """Atomic ``*ptr op= value`` on f16 bits, computed in f32; returns the old value as f32.
    A compare-and-swap loop on the aligned 32-bit word holding the element (libNVVM rejects
    16-bit cmpxchg; the other half of the word is written back unchanged or the swap retries)."""
    f32, half, i16, i32, i64 = llir.FloatType(), llir.HalfType(), llir.IntType(16), llir.IntType(32), llir.IntType(64)
    addr = builder.ptrtoint(ptr, i64)
    word = builder.inttoptr(builder.and_(addr, i64(~3)), i32.as_pointer())
    shift = builder.trunc(builder.shl(builder.and_(addr, i64(2)), i64(3)), i32)  # little-endian
    keep = builder.not_(builder.shl(i32(0xFFFF), shift))
    entry = builder.block
    initial = builder.load(word)
    loop = builder.append_basic_block("qd_half_atomic")
    done = builder.append_basic_block("qd_half_atomic_done")
    builder.branch(loop)
    builder.position_at_end(loop)
    expected = builder.phi(i32)
    expected.add_incoming(initial, entry)
    old = builder.fpext(builder.bitcast(builder.trunc(builder.lshr(expected, shift), i16), half), f32)
    if opname in ("add", "sub", "mul"):
        new = {"add": builder.fadd, "sub": builder.fsub, "mul": builder.fmul}[opname](old, value)
    elif opname == "xchg":
        new = value
    else:
        new = builder.select(builder.fcmp_ordered(">" if opname == "max" else "<", value, old), value, old)
    new_bits = builder.zext(builder.bitcast(builder.fptrunc(new, half), i16), i32)
    desired = builder.or_(builder.and_(expected, keep), builder.shl(new_bits, shift))
    pair = builder.cmpxchg(word, expected, desired, "monotonic", "monotonic")
    expected.add_incoming(builder.extract_value(pair, 0), builder.block)
    builder.cbranch(builder.extract_value(pair, 1), done, loop)
    builder.position_at_end(done)
    return old


def _load_signature(f, idx):
    """The signature of a load of ``f[idx]`` (None: ``f`` is no field or array); raises on a bad
    index."""
    if _layout(f) is None:
        return None
    check_index(f, idx, "read")
    return _value_type(f)(f, idx)


def _lower_load(context, builder, sig, args):
    if _is_half(sig.args[0]):
        _check_half_conversions(context)
    ptrs = _component_pointers(context, builder, sig.args[0], args[0], sig.args[1], args[1])
    loaded = [_load_scalar(context, builder, sig.args[0], p) for p in ptrs]
    if isinstance(sig.return_type, types.BaseTuple):
        return context.make_tuple(builder, sig.return_type, loaded)
    return loaded[0]


@intrinsic
def element_load(typingctx, f, idx):
    sig = _load_signature(f, idx)
    return None if sig is None else (sig, _lower_load)


def _store_signature(f, idx, value):
    """The signature of a store to ``f[idx]`` (None: ``f`` is no field or array); raises on a bad
    index or a read-only field."""
    if _layout(f) is None:
        return None
    check_index(f, idx, "write")
    if not _layout(f)[4].mutable:
        raise typing_error(QuadrantsTypeError(f"cannot write to a read-only {f}"))
    return types.none(f, idx, value)


def _lower_store(context, builder, sig, args):
    fty, idxty, valty = sig.args
    if _is_half(fty):
        _check_half_conversions(context)
    ptrs = _component_pointers(context, builder, fty, args[0], idxty, args[1], write=True)
    vals, vtys = _components(builder, valty, args[2], len(ptrs))
    for p, v, vt in zip(ptrs, vals, vtys):
        _store_scalar(context, builder, fty, v, vt, p)
    return context.get_dummy_value()


@intrinsic
def element_store(typingctx, f, idx, value):
    sig = _store_signature(f, idx, value)
    return None if sig is None else (sig, _lower_store)


def _llvm_atomic_op(op, dtype):
    if op not in ATOMIC_OPS:
        raise QuadrantsTypeError(f"unknown atomic operation {op!r}")
    signed, unsigned, floating = ATOMIC_OPS[op]
    if isinstance(dtype, types.Float):
        if floating is None or dtype.bitwidth == 16:
            raise QuadrantsTypeError(f"atomic {op} is not supported on {dtype}")
        return floating
    if isinstance(dtype, types.Boolean):
        raise QuadrantsTypeError(f"atomic {op} is not supported on booleans")
    return signed if dtype.signed else unsigned


@intrinsic
def element_atomic(typingctx, f, idx, value, op):
    if _layout(f) is None or not isinstance(op, types.StringLiteral):
        return None
    component = _layout(f)[2] and _index_arity(idx) == _layout(f)[1] + len(_layout(f)[2])
    check_index(f, idx, "update", component=component)
    opname = op.literal_value
    llop = _llvm_atomic_op(opname, _layout(f)[0])
    resty = _layout(f)[0] if component else _value_type(f)

    def codegen(context, builder, sig, args):
        from .atomics import RMW_OPS, emit_rmw
        from .device import cuda_atomic_rmw, is_cuda_context

        fty, idxty, valty, _ = sig.args
        ptrs = _component_pointers(context, builder, fty, args[0], idxty, args[1], write=True)
        dtype = _layout(fty)[0]
        vals, vtys = _components(builder, valty, args[2], len(ptrs))
        # libNVVM rejects float atomicrmw: CUDA float atomics go through NVVM intrinsics
        nvvm_float = isinstance(dtype, types.Float) and is_cuda_context(context)
        olds = []
        for p, v, vt in zip(ptrs, vals, vtys):
            v = context.cast(builder, v, vt, dtype)
            if _is_half(fty):
                olds.append(_half_atomic(builder, opname, p, v))
            elif opname in RMW_OPS:
                olds.append(emit_rmw(builder, opname, p, v))
            elif nvvm_float:
                olds.append(cuda_atomic_rmw(builder, opname, p, v))
            else:
                olds.append(builder.atomic_rmw(llop, p, v, "monotonic"))
        if isinstance(sig.return_type, types.BaseTuple):
            return context.make_tuple(builder, sig.return_type, olds)
        return olds[0]

    return resty(f, idx, value, op), codegen


# -- Python syntax on fields --------------------------------------------------------------

def _vector_in_tuple(idx) -> bool:
    return isinstance(idx, types.BaseTuple) and any(_is_matrix(t) for t in idx)


def _plain_access(f, idx) -> bool:
    """``f[idx]`` on a scalar field with integer indices: typed by a template and lowered in
    place (:class:`_FieldGetItem`); the overloads below handle vectors and matrices."""
    return isinstance(f, FieldType) and f.elem_type is None and not _is_matrix(idx) and not _vector_in_tuple(idx)


# The commonest accesses of a kernel skip the overload machinery: an overload compiles its
# implementation as a function of its own, which every task then calls and links (about a
# tenth of the typing, lowering and NVVM time of a one-statement task).
@infer_global(operator.getitem)
class _FieldGetItem(AbstractTemplate):
    def generic(self, args, kws):
        if len(args) == 2 and not kws and _plain_access(*args):
            return _load_signature(*args)
        return None


@infer_global(operator.setitem)
class _FieldSetItem(AbstractTemplate):
    def generic(self, args, kws):
        if len(args) == 3 and not kws and _plain_access(*args[:2]) and not _is_matrix(args[2]):
            return _store_signature(*args)
        return None


lower_builtin(operator.getitem, FieldType, types.Any)(_lower_load)
lower_builtin(operator.setitem, FieldType, types.Any, types.Any)(_lower_store)


@overload(operator.getitem)
def _field_getitem(f, idx):
    if not isinstance(f, FieldType) or _vector_in_tuple(idx):   # x[I, 1]: lowering/subscripts.py
        return None
    if _is_matrix(idx):
        return lambda f, idx: f[matrix_to_tuple(idx)]
    if f.elem_type is None:             # _FieldGetItem
        return None
    elem = f.value_elem_type
    return lambda f, idx: matrix_from_tuple(element_load(f, idx), elem)


@overload(operator.setitem)
def _field_setitem(f, idx, value):
    if not isinstance(f, FieldType) or _vector_in_tuple(idx):
        return None
    if _is_matrix(idx):
        def store_vector_index(f, idx, value):
            f[matrix_to_tuple(idx)] = value  # the value is converted by the tuple-index overload
        return store_vector_index
    if _is_matrix(value):
        return lambda f, idx, value: element_store(f, idx, matrix_to_tuple(value))
    if f.elem_type is None:             # _FieldSetItem
        return None
    return lambda f, idx, value: element_store(f, idx, value)


@overload_attribute(FieldType, "shape")
def _field_shape(f):
    ndim = f.ndim
    if f.logical_shape is not None:    # a blocked layout or a pointer node's pool
        shape = f.logical_shape
        return lambda f: shape
    return lambda f: _field_array(f).shape[:ndim]


@overload_method(FieldType, "to_array")
def _field_to_array(f):
    if f.logical_shape is not None:
        raise typing_error(QuadrantsTypeError(f"{f} has a blocked layout or is below a pointer SNode: it is no "
                                              "array"))
    return lambda f: _field_array(f)


@intrinsic
def _field_array(typingctx, f):
    if not isinstance(f, FieldType):
        return None

    def codegen(context, builder, sig, args):
        arr = cgutils.create_struct_proxy(sig.args[0])(context, builder, value=args[0]).arr
        return _incref(context, builder, sig.return_type, arr)

    return f.array_type(f), codegen


def _incref(context, builder, ty, val):
    if context.enable_nrt:
        context.nrt.incref(builder, ty, val)
    return val


def _is_matrix(ty):
    return isinstance(ty, MatrixType)
