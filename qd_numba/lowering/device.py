"""Intrinsics of task kernels: thread indexing, field storage, values passed between tasks.

A CUDA task kernel takes two pointer-sized parameters before the kernel's own arguments:

* ``ctx``: the kernel instance's field table, ``uint64`` data pointers in kernel-local slots.
  ``field_from_ctx(ctx, slot, token)`` builds the field's array view from its slot, with the
  field's shape and strides as compile-time constants, so a kernel pays one parameter for all
  the fields it touches and a field never costs a parameter per launch. The CPU target passes
  its fields the same way (targets/cpu.py: the driver's and task functions' ``ctx``).
* ``tmp``: the kernel instance's temporaries, 64-byte slots holding values one task computes
  and a later task reads (``temp_store`` / ``temp_load``), and the kernel's return value.

A :class:`TypeToken` carries a Numba type into the IR as a compile-time constant.
"""

from __future__ import annotations

import math

from llvmlite import ir as llir
from numba.core import cgutils, types
from numba.core.imputils import lower_builtin, lower_constant
from numba.extending import intrinsic, models, register_model, typeof_impl

from .array_struct import abi_sizeof

TEMP_SLOT_BYTES = 64


class TypeToken:
    """A compile-time constant naming a Numba type (and, for fields, the shape and, for a strided
    view, its byte strides; None: C-contiguous)."""

    def __init__(self, ty, shape=(), strides=None):
        self.ty, self.shape = ty, tuple(shape)
        self.strides = None if strides is None else tuple(int(s) for s in strides)

    def __deepcopy__(self, memo):
        return self


class TypeTokenType(types.Dummy):
    def __init__(self, ty, shape, strides=None):
        self.ty, self.shape, self.strides = ty, shape, strides
        super().__init__(name=f"qd.token({ty}, {shape}{f', strides={strides}' if strides else ''})")

    @property
    def key(self):
        return self.ty, self.shape, self.strides


@typeof_impl.register(TypeToken)
def _typeof_token(val, c):
    return TypeTokenType(val.ty, val.shape, val.strides)


register_model(TypeTokenType)(models.OpaqueModel)


@lower_constant(TypeTokenType)
def _lower_token(context, builder, ty, pyval):
    return context.get_dummy_value()


def _sreg(builder, name):
    fn = cgutils.get_or_insert_function(builder.module, llir.FunctionType(llir.IntType(32), ()),
                                        f"llvm.nvvm.read.ptx.sreg.{name}")
    return builder.zext(builder.call(fn, ()), llir.IntType(64))


def _grid_start(builder):
    return builder.add(builder.mul(_sreg(builder, "ctaid.x"), _sreg(builder, "ntid.x")), _sreg(builder, "tid.x"))


def _grid_stride(builder):
    return builder.mul(_sreg(builder, "nctaid.x"), _sreg(builder, "ntid.x"))


@intrinsic
def grid_start(typingctx):
    """blockIdx.x * blockDim.x + threadIdx.x, as int64."""
    def codegen(context, builder, sig, args):
        return _grid_start(builder)
    return types.int64(), codegen


@intrinsic
def grid_stride(typingctx):
    """gridDim.x * blockDim.x, as int64."""
    def codegen(context, builder, sig, args):
        return _grid_stride(builder)
    return types.int64(), codegen


# -- the grid-stride loop of a range-for task ---------------------------------------------------------

class GridRange(types.SimpleIteratorType):
    """The iteration of a range-for task kernel's grid-stride loop: ``i = start; while i < stop:
    ...; i += step`` over int64, every back edge marked not to unroll
    (:func:`keep_grid_loops_rolled`). Numba's ``range`` computes the trip count up front, a
    64-bit division per thread that also lets NVVM unroll the loop 4x with a remainder loop:
    2-3x the NVVM + nvJitLink time of a whole one-statement task (docs/compile_time.md), and no
    faster for independent iterations, which a thread of a saturating grid runs one after another
    at full occupancy either way."""

    def __init__(self):
        super().__init__("qd.grid_range", types.int64)


grid_range_type = GridRange()


@register_model(GridRange)
class _GridRangeModel(models.StructModel):
    def __init__(self, dmm, fe_type):
        super().__init__(dmm, fe_type, [("index", types.CPointer(types.int64)), ("stop", types.int64),
                                        ("step", types.int64)])


@intrinsic
def grid_loop(typingctx, stop):
    """The grid-stride iteration of this thread below ``stop`` (from :func:`grid_start` by
    :func:`grid_stride`), rolled: one call, as a task's prologue is typed and lowered statement by
    statement (~0.4 ms each)."""
    if not isinstance(stop, (types.Integer, types.Boolean)):   # what range() takes
        return None

    def codegen(context, builder, sig, args):
        start, step = _grid_start(builder), _grid_stride(builder)
        it = cgutils.create_struct_proxy(grid_range_type)(context, builder)
        it.index = cgutils.alloca_once_value(builder, start)
        it.stop, it.step = context.cast(builder, args[0], sig.args[0], types.int64), step
        return it._getvalue()

    return grid_range_type(stop), codegen


@lower_builtin("getiter", GridRange)
def _grid_range_iter(context, builder, sig, args):
    return args[0]


@lower_builtin("iternext", GridRange)
def _grid_range_next(context, builder, sig, args):
    # (not numba's iternext_impl decorator: numba-cuda installs only implementations whose
    # module is outside numba from numba's registry, and the decorator's wrapper is numba's)
    it = cgutils.create_struct_proxy(grid_range_type)(context, builder, value=args[0])
    # the loop's header: the back edges to it are found once the task is lowered
    headers = builder.function.__dict__.setdefault("_qd_grid_headers", [])
    if builder.block not in headers:
        headers.append(builder.block)
    index = builder.load(it.index)
    valid = builder.icmp_signed("<", index, it.stop)
    builder.store(builder.add(index, it.step), it.index)
    pair = context.make_helper(builder, sig.return_type)
    pair.first, pair.second = index, valid
    return pair._getvalue()


def keep_grid_loops_rolled(function) -> int:
    """Mark every back edge to a grid-stride loop's header in ``function`` (an llvmlite function
    whose lowering recorded its headers) with ``llvm.loop.unroll.disable``; returns how many
    branches were marked. Unrolling a loop of independent iterations only adds code (and the
    trip-count division it needs): at full occupancy the warps hide each thread's latency either
    way (saxpy, a copy, a stencil: as fast or faster on an H100, bench/results/session12.md).
    Loops inside the body keep NVVM's unrolling. A branch to the header is a back edge when the
    header dominates it: when the branch's block is unreachable from the entry without passing
    the header."""
    headers = function.__dict__.pop("_qd_grid_headers", ())
    if not headers or not function.blocks:
        return 0
    marked = 0
    for k, header in enumerate(headers):
        before_header, work = {function.blocks[0]}, [function.blocks[0]]
        while work:
            block = work.pop()
            if block is header:
                continue
            for succ in _successors(block):
                if succ not in before_header:
                    before_header.add(succ)
                    work.append(succ)
        latches = [b for b in function.blocks
                   if (b is header or b not in before_header) and header in _successors(b)]
        if not latches:
            continue
        module = function.module
        disable = module.add_metadata([llir.MetaDataString(module, "llvm.loop.unroll.disable")])
        # a node of its own (unique first operand), then made to refer to itself as a loop id must
        loop_id = module.add_metadata([llir.MetaDataString(module, f"qd.grid_loop.{function.name}.{k}"), disable])
        loop_id.operands = (loop_id, disable)
        for b in latches:
            b.terminator.set_metadata("llvm.loop", loop_id)
            marked += 1
    return marked


def _successors(block):
    term = block.terminator
    if term is None:
        return ()
    if isinstance(term, llir.SwitchInstr):
        return (term.default, *(dest for _, dest in term.cases))
    if isinstance(term, llir.IndirectBranch):
        return tuple(term.destinations)
    return tuple(op for op in term.operands if isinstance(op, llir.Block))


def c_strides(shape, itemsize):
    """Byte strides of a C-contiguous array."""
    strides, step = [], itemsize
    for n in reversed(shape):
        strides.append(step)
        step *= max(int(n), 1)
    return list(reversed(strides))


def array_view(context, builder, arrty, data, shape, strides, itemsize):
    """The array struct of ``arrty`` over ``data`` with constant ``shape``, ``strides`` and
    ``itemsize`` and no meminfo or parent: one constant and one ``insertvalue``. What
    ``context.populate_array`` builds, without its struct proxy (an alloca, a store per member,
    a load): the commonest statement of a task's prologue lowered ~5x faster, in less IR."""
    model = context.data_model_manager[arrty]
    llty = model.get_value_type()
    members = {"meminfo": None, "parent": None, "nitems": math.prod(shape), "itemsize": itemsize,
               "data": None, "shape": tuple(shape), "strides": tuple(strides)}
    parts = [None] * len(llty.elements)
    for name, value in members.items():
        pos = model.get_field_position(name)
        ety = llty.elements[pos]
        if isinstance(value, tuple):
            parts[pos] = llir.Constant(ety, [llir.Constant(ety.element, int(v)) for v in value]) if value \
                else llir.Constant(ety, None)
        else:
            parts[pos] = llir.Constant(ety, None if value is None else int(value))
    return builder.insert_value(llir.Constant(llty, parts), data, model.get_field_position("data"))


@intrinsic
def field_from_ctx(typingctx, ctx, slot, token):
    """The field in context slot ``slot`` (a constant in the IR), typed ``token.ty`` (a
    FieldType). The slot is typed as a plain integer, not a literal: one signature serves every
    slot, so a kernel's tasks type and register this intrinsic once per field layout instead of
    once per field (each new signature refreshes numba-cuda's registries); the lowered constant
    folds into the table load all the same."""
    if not (isinstance(token, TypeTokenType) and isinstance(slot, types.Integer)):
        return None
    fty = token.ty
    shape = token.shape
    strides = token.strides

    def codegen(context, builder, sig, args):
        arrty = fty.array_type
        i64 = llir.IntType(64)
        table = builder.inttoptr(args[0], i64.as_pointer())
        cell = builder.gep(table, [context.cast(builder, args[1], sig.args[1], types.int64)])
        raw = builder.load(cell)
        # the table only changes between launches: let NVVM use the read-only data path
        raw.set_metadata("invariant.load", builder.module.add_metadata([]))
        dtype_ll = context.get_data_type(arrty.dtype)
        data = builder.inttoptr(raw, dtype_ll.as_pointer())
        itemsize = abi_sizeof(context, dtype_ll)
        view = array_view(context, builder, arrty, data, shape, strides or c_strides(shape, itemsize), itemsize)
        field_model = context.data_model_manager[fty]
        return builder.insert_value(llir.Constant(field_model.get_value_type(), llir.Undefined), view,
                                    field_model.get_field_position("arr"))

    return fty(ctx, slot, token), codegen


@intrinsic
def temp_store(typingctx, tmp, offset, value):
    """Store ``value`` at byte ``offset`` (a constant) of the temporaries buffer."""
    if not isinstance(offset, types.IntegerLiteral):
        return None

    def codegen(context, builder, sig, args):
        llty = context.get_value_type(sig.args[2])
        if abi_sizeof(context, llty) > TEMP_SLOT_BYTES:
            raise TypeError(f"a {sig.args[2]} value does not fit a {TEMP_SLOT_BYTES}-byte task temporary")
        base = builder.inttoptr(args[0], llir.IntType(8).as_pointer())
        ptr = builder.bitcast(builder.gep(base, [llir.Constant(llir.IntType(64), offset.literal_value)]),
                              llty.as_pointer())
        builder.store(args[2], ptr)
        return context.get_dummy_value()

    return types.none(tmp, offset, value), codegen


@intrinsic
def temp_load(typingctx, tmp, offset, token):
    """Load the value of type ``token.ty`` stored at byte ``offset`` by an earlier task."""
    if not (isinstance(offset, types.IntegerLiteral) and isinstance(token, TypeTokenType)):
        return None
    ty = token.ty

    def codegen(context, builder, sig, args):
        llty = context.get_value_type(ty)
        base = builder.inttoptr(args[0], llir.IntType(8).as_pointer())
        ptr = builder.bitcast(builder.gep(base, [llir.Constant(llir.IntType(64), offset.literal_value)]),
                              llty.as_pointer())
        return builder.load(ptr)

    return ty(tmp, offset, token), codegen


# -- atomics ------------------------------------------------------------------------------------------

def is_cuda_context(context) -> bool:
    """True when ``context`` (an intrinsic's target context) is numba-cuda's, so one intrinsic
    registered with plain ``numba.extending`` can emit CUDA-specific code."""
    mod = type(context).__module__
    return mod.startswith("numba.cuda.") or mod.startswith("numba_cuda.")


_ATOMIC_OPS = ("add", "sub", "max", "min")


def cuda_atomic_rmw(builder, op: str, ptr, val, *, signed: bool = True):
    """Emit an atomic read-modify-write that libNVVM accepts; returns the old value.

    libNVVM (IR 2.0, an LLVM 7 era parser) rejects ``atomicrmw fadd``/``fmax`` and float
    ``xchg``; integers use ``atomicrmw`` (relaxed, ``monotonic``), floats use the
    ``llvm.nvvm.atomic.load.add.f32/f64`` intrinsics (sub = add of the negation) and numba-cuda's
    ``___numba_atomic_{float,double}_{max,min}`` helpers (defined by numba-cuda's NVVM step, so
    they only link inside numba-cuda-lowered modules).  ``ptr`` is a generic-address-space
    pointer to the element; ``op`` is one of add, sub, max, min."""
    from llvmlite import ir as llir
    from numba.cuda import nvvmutils

    if op not in _ATOMIC_OPS:
        raise ValueError(f"unsupported atomic op {op!r}; expected one of {_ATOMIC_OPS}")
    ty = val.type
    if isinstance(ty, llir.IntType):
        llop = {
            "add": "add",
            "sub": "sub",
            "max": "max" if signed else "umax",
            "min": "min" if signed else "umin",
        }
        return builder.atomic_rmw(llop[op], ptr, val, "monotonic")
    if isinstance(ty, (llir.FloatType, llir.DoubleType)):
        f32 = isinstance(ty, llir.FloatType)
        mod = builder.module
        if op in ("add", "sub"):
            if op == "sub":  # fsub -0.0, x: libNVVM's parser predates the fneg instruction
                val = builder.fsub(llir.Constant(ty, -0.0), val)
            fn = nvvmutils.declare_atomic_add_float32(mod) if f32 else _declare_atomic_add_f64(mod)
        elif op == "max":
            fn = (
                nvvmutils.declare_atomic_max_float32(mod)
                if f32
                else nvvmutils.declare_atomic_max_float64(mod)
            )
        else:
            fn = (
                nvvmutils.declare_atomic_min_float32(mod)
                if f32
                else nvvmutils.declare_atomic_min_float64(mod)
            )
        return builder.call(fn, (ptr, val))
    raise TypeError(f"atomic {op} on LLVM type {ty} is not supported")


def _declare_atomic_add_f64(mod):
    # nvvmutils.declare_atomic_add_float64 reads the cc from numba-cuda's config stack (which is
    # only set while numba-cuda lowers); every cc we target (>= 7.0) has the native instruction.
    from llvmlite import ir as llir
    from numba.cuda import cgutils as cuda_cgutils

    dbl = llir.DoubleType()
    fnty = llir.FunctionType(dbl, (dbl.as_pointer(), dbl))
    return cuda_cgutils.get_or_insert_function(mod, fnty, "llvm.nvvm.atomic.load.add.f64.p0f64")
