"""CPU target: one native call per kernel, one parallel region per range-for task.

Code shape. The kernel's serial code stays in one *driver* function, in program order; each
range-for task is cut out (passes/task_ir.py, with :class:`CpuTaskABI`) into its own *task
function* ``task(lo, hi, *live_ins)`` that runs iterations ``[lo, hi)`` serially. Where the
loop was, the driver calls :func:`launch_range`, whose codegen splits ``[0, total)`` into chunks
and hands them to Numba's threading layer (``numba_parallel_for``, the entry point parfors
use) — so values computed by serial code flow to tasks as ordinary arguments, and a whole kernel
is one call into native code.

Why not parfors: Numba's parfor passes cost ~0.25 s of compile time per loop (measured: 32
``prange`` loops 9.0 s vs 1.5 s for the same loops serial; bench/compile_time.py); compiling
task bodies as plain functions avoids all of it. Exceptions raised in a task (bounds checks
under ``debug=True``) are caught per chunk and re-raised by the driver after the region.
"""

from __future__ import annotations

import itertools
import secrets
import threading

import numpy as np
from llvmlite import ir as llir
from numba.core import cgutils, compiler, types
from numba.core import config as numba_config
from numba.core import ir as numba_ir
from numba.core.codegen import JITCodeLibrary, remove_redundant_nrt_refct
from numba.core.imputils import lower_constant
from numba.core.registry import cpu_target
from numba.core.typing.typeof import typeof_impl
from numba.extending import intrinsic, models, register_model

from ..frontend.args import field_type
from ..lowering import device
from ..lowering.array_struct import remember_abi_sizes
from ..passes.base import copy_ir, derive_ir, exec_stub
from ..passes.task_ir import LABEL_SHIFT as TASK_LABEL_SHIFT
from ..passes.task_ir import Emitter, TaskABI, cut_task
from ..passes.task_types import TypedPiece
from ..profiler import CLOCK_MONOTONIC, TASK_COUNTER_WORDS, counter_at
from .task_pipeline import gate

CODEGEN_STAGES = ("split into a driver (serial code, launches) and one task function per range-for, cut by "
                  "passes/task_ir.py with CpuTaskABI (targets/cpu.py build_driver)",
                  "Numba typing + lowering of the driver; each task function lowered into its library at its "
                  "launch site; LLVM optimises and emits the kernel once (module passes only: KernelLibrary)",
                  "task typing: each Task given the types its driver or task function was lowered with "
                  "(passes/task_types.py TaskTyper)")

_threads_ready = False
_lock = threading.RLock()


def ensure_threading_layer() -> None:
    """Start Numba's thread pool and register its symbols (``numba_parallel_for``), and set up
    Numba's CPU target in full (its registries: what a compile needs)."""
    global _threads_ready
    if not _threads_ready:
        start_runtime()
        cpu_target.target_context.refresh()
        remember_abi_sizes(cpu_target.target_context)
        _threads_ready = True


_runtime_ready = False


def start_runtime() -> None:
    """Numba's thread pool with its symbols, and NRT's (no registries)."""
    global _runtime_ready
    if not _runtime_ready:
        from numba.core.runtime import rtsys
        from numba.np.ufunc.parallel import _launch_threads

        _launch_threads()
        rtsys.initialize(cpu_target.target_context)
        _runtime_ready = True


def ensure_runtime_for(obj: bytes | None) -> None:
    """What loading compiled object code (an offline-cache hit) needs: the thread pool and NRT,
    and every symbol the object references. Numba's full set-up (``refresh``: ~0.2-0.3 s of
    registries, what a compile needs) runs only when one is still missing — a symbol that an
    implementation registers when its module is imported — or when there is no object to read."""
    if _threads_ready:
        return
    start_runtime()
    import llvmlite.binding as llvm

    names = undefined_symbols(obj) if obj is not None else None
    if names is None or any(not llvm.address_of_symbol(name) for name in names):
        ensure_threading_layer()


def undefined_symbols(obj: bytes) -> list | None:
    """The names an ELF64 little-endian object file references and does not define (the
    entries of its symbol table in section 0), or None for any other or malformed object. Read
    with ``struct`` alone (every offset checked): llvmlite's object-file reader crashes the
    process on a truncated file."""
    import struct

    if obj[:6] != b"\x7fELF\x02\x01":
        return None
    try:
        shoff, = struct.unpack_from("<Q", obj, 0x28)
        shentsize, shnum = struct.unpack_from("<HH", obj, 0x3A)
        if shentsize != 64:
            return None
        # Elf64_Shdr: name, type, flags, addr, offset, size, link, info, addralign, entsize
        headers = [struct.unpack_from("<IIQQQQIIQQ", obj, shoff + k * 64) for k in range(shnum)]
        symtab = next(h for h in headers if h[1] == 2)           # SHT_SYMTAB
        strtab = headers[symtab[6]]
        if symtab[4] + symtab[5] > len(obj) or strtab[4] + strtab[5] > len(obj):
            return None
        strings = obj[strtab[4]:strtab[4] + strtab[5]]
        names = []
        for offset in range(symtab[4], symtab[4] + symtab[5] - 23, 24):
            # Elf64_Sym: name, info, other, shndx, value, size
            name, _info, _other, shndx, _value, _size = struct.unpack_from("<IBBHQQ", obj, offset)
            if name and shndx == 0:
                names.append(strings[name:strings.index(b"\0", name)].decode())
        return names
    except (struct.error, StopIteration, IndexError, ValueError, UnicodeDecodeError):
        return None


def compile_flags(debug: bool, entry: bool) -> compiler.Flags:
    from .task_pipeline import lean_flags

    flags = lean_flags(compiler.Flags)()
    flags.nrt = True
    flags.error_model = "numpy"         # no ZeroDivisionError checks: Quadrants semantics
    flags.boundscheck = bool(debug)
    flags.no_cpython_wrapper = not entry
    flags.no_cfunc_wrapper = True
    return flags


# -- task functions ------------------------------------------------------------------------------

class TaskFunction:
    """One range-for task's IR, lowered into the library of the driver that launches it.

    A kernel is one LLVM library: each task function is compiled (typed and lowered, no
    machine code) at its launch site, while the driver is being lowered, straight into the
    driver's library. LLVM then optimises and emits the whole kernel once, instead of once
    per task plus again for the linked driver (32 loops: about half the cold compile time).
    """

    def __init__(self, task, func_ir, debug: bool, timed: bool = False, kernel_label: dict | None = None):
        self.task = task
        self.func_ir = func_ir
        self.kernel_label = kernel_label or {}   # the task function's labels -> the kernel's
        self.debug = debug
        self.error = None
        # kernel profiler: the launch site's counter, a global of the kernel's library
        self.clock_symbol = f"qd_task_clock_{next(_clock_ids)}_{task.uid}" if timed else None
        self._consumed = False   # func_ir was handed to Numba (which mutates it)
        self.typed = None        # (blocks, typemap) of its last typing: the Task's types
        self._environments = []  # (env name, Environment) to install once the library is finalised

    def lower_into(self, context, argtypes):
        """Type and lower the task into ``context``'s active library; returns its fndesc."""
        flags = compile_flags(self.debug, entry=False)
        flags.no_compile = True
        # Numba's passes mutate the IR they compile: the first lowering may consume ours
        func_ir = copy_ir(numba_ir, self.func_ir) if self._consumed else self.func_ir
        self._consumed = True
        with _lock:
            try:
                cres = compiler.compile_ir(cpu_target.typing_context, context, func_ir, argtypes, types.none,
                                           flags, {}, library=context.active_code_library,
                                           pipeline_class=TaskCompiler)
            except Exception as e:
                self.error = e
                raise
        self._environments.append((context.get_env_name(cres.fndesc), cres.environment))
        self.typed = (cres.type_annotation.blocks, cres.type_annotation.typemap)
        return cres.fndesc

    def install_environments(self, library) -> None:
        """Point each task's environment global at its Environment (what ``get_executable``
        does for a separately compiled function); the objects stay alive with the task."""
        for name, env in self._environments:
            library.codegen.set_env(name, env)

    def __deepcopy__(self, memo):
        return self


class TaskCompiler(compiler.CompilerBase):
    """Numba's nopython pipeline with the passes a task rarely needs gated (task_pipeline.py):
    task functions and drivers (a driver is a kernel's serial code and its launches)."""

    def define_pipelines(self):
        return [gate(compiler.DefaultPassBuilder.define_nopython_pipeline(self.state), "numba.core")]


class TaskFunctionType(types.Dummy):
    def __init__(self, task_function):
        self.task_function = task_function
        super().__init__(name=f"qd.task({task_function.task.name}, {id(task_function):x})")


@typeof_impl.register(TaskFunction)
def _typeof_task_function(val, c):
    return TaskFunctionType(val)


register_model(TaskFunctionType)(models.OpaqueModel)


@lower_constant(TaskFunctionType)
def _lower_task_function(context, builder, ty, pyval):
    return context.get_dummy_value()


_wrapper_ids = itertools.count()
_clock_ids = itertools.count()
# symbol ids of drivers and task functions, unique across processes: the offline cache links
# libraries compiled by other processes into this one
_symbol_ids = itertools.count(secrets.randbits(40) << 16)


@intrinsic
def launch_range(typingctx, task_fn, total, args, serial):
    """Run ``task_fn(lo, hi, *args)`` over chunks of ``[0, total)`` on the thread pool."""
    if not isinstance(task_fn, TaskFunctionType) or not isinstance(args, types.BaseTuple):
        return None
    tf = task_fn.task_function
    argtys = (types.intp, types.intp, *args.types)
    # qd.loop_config(serialize=True): the task itself knows (the ``serial`` argument is typed
    # as a plain bool once Numba retries without literals, so it cannot be trusted to be literal)
    run_serially = bool(tf.task.serialize) or (isinstance(serial, types.BooleanLiteral) and serial.literal_value)

    def codegen(context, builder, sig, llargs):
        module = builder.module
        fn = context.declare_function(module, tf.lower_into(context, argtys))
        intp = context.get_value_type(types.intp)
        total_v = context.cast(builder, llargs[1], sig.args[1], types.intp)
        args_v = llargs[2]
        arg_values = cgutils.unpack_tuple(builder, args_v, len(args)) if len(args) else []

        def call_task(b, lo, hi, values):
            status = context.call_conv.call_function(b, fn, types.none, argtys, [lo, hi, *values])[0]
            _keep_out_of_line(b, fn)
            return status

        with builder.if_then(builder.icmp_signed(">", total_v, intp(0))):
            started = _read_clock(builder) if tf.clock_symbol else None
            get_num_threads = cgutils.get_or_insert_function(module, llir.FunctionType(intp, []),
                                                             "get_num_threads")
            nthreads = intp(1) if run_serially else builder.call(get_num_threads, [])
            one_chunk = builder.or_(builder.icmp_signed("<=", nthreads, intp(1)),
                                    builder.icmp_signed("==", total_v, intp(1)))
            with builder.if_else(one_chunk) as (direct, parallel):
                with direct:
                    status = call_task(builder, intp(0), total_v, arg_values)
                    with cgutils.if_unlikely(builder, status.is_error):
                        context.call_conv.return_status_propagate(builder, status)
                with parallel:
                    _emit_parallel(context, builder, fn, argtys, args, args_v, total_v, nthreads, call_task)
            if started is not None:
                _add_to_clock(builder, tf.clock_symbol, started, _read_clock(builder))
        return context.get_dummy_value()

    return types.none(task_fn, total, args, serial), codegen


def _keep_out_of_line(builder, fn) -> None:
    """Mark the call of task function ``fn`` just emitted ``noinline``. The driver calls a task
    at two sites (one chunk here, several on the thread pool), and LLVM inlined it into both and
    vectorized each copy (with its epilogue loops): three times the code of one task for one
    call per chunk saved. Out of line, the loop is optimized and compiled once."""
    for instr in reversed(builder.block.instructions):
        if isinstance(instr, llir.CallInstr) and instr.callee is fn:
            instr.attributes.add("noinline")
            return


# -- kernel profiler: a clock read around each launch (only in kernels compiled with it on) -----------

_I64 = llir.IntType(64)
_TIMESPEC = llir.LiteralStructType([_I64, _I64])   # struct timespec on 64-bit Unix


def _read_clock(builder):
    """``clock_gettime(CLOCK_MONOTONIC)`` in nanoseconds (the clock profiler.now_ns reads)."""
    i32 = llir.IntType(32)
    clock_gettime = cgutils.get_or_insert_function(
        builder.module, llir.FunctionType(i32, [i32, _TIMESPEC.as_pointer()]), "clock_gettime")
    ts = cgutils.alloca_once(builder, _TIMESPEC)
    builder.call(clock_gettime, [i32(CLOCK_MONOTONIC), ts])
    seconds = builder.load(builder.gep(ts, [i32(0), i32(0)]))
    nanoseconds = builder.load(builder.gep(ts, [i32(0), i32(1)]))
    return builder.add(builder.mul(seconds, _I64(1_000_000_000)), nanoseconds)


def _add_to_clock(builder, symbol, started, ended):
    """Count one launch of ``[started, ended)`` in the launch site's counter ``symbol``:
    launches, nanoseconds, start of the first launch (profiler.TASK_COUNTER_WORDS)."""
    i32 = llir.IntType(32)
    module = builder.module
    counter = module.globals.get(symbol)
    if counter is None:  # common: one counter however many modules of the library declare it
        counter = llir.GlobalVariable(module, llir.ArrayType(_I64, TASK_COUNTER_WORDS), name=symbol)
        counter.linkage = "common"
        counter.initializer = llir.ArrayType(_I64, TASK_COUNTER_WORDS)(None)
    launches, total, first = (builder.gep(counter, [i32(0), i32(k)]) for k in range(TASK_COUNTER_WORDS))
    count = builder.load(launches)
    builder.store(builder.add(count, _I64(1)), launches)
    builder.store(builder.add(builder.load(total), builder.sub(ended, started)), total)
    builder.store(builder.select(builder.icmp_signed("==", count, _I64(0)), started, builder.load(first)), first)


def task_clocks(cres, task_functions) -> list:
    """(task name, its counter as an int64 array) per timed launch site of a compiled kernel."""
    engine = cres.library.codegen._engine  # as Numba's own set_env finds its environment globals
    return [(tf.task.name, counter_at(engine.get_global_value_address(tf.clock_symbol)))
            for tf in task_functions if tf.clock_symbol]


def _data_type(context, args):
    """{total, nchunks, error flag, error code, excinfo*, packed task arguments}"""
    from numba.core.callconv import excinfo_ptr_t

    intp = context.get_value_type(types.intp)
    i32 = llir.IntType(32)
    return llir.LiteralStructType([intp, intp, i32, i32, excinfo_ptr_t, context.get_value_type(args)])


def _emit_parallel(context, builder, fn, argtys, args, args_v, total_v, nthreads, call_task):
    module = builder.module
    intp = context.get_value_type(types.intp)
    i8p = llir.IntType(8).as_pointer()
    i32 = llir.IntType(32)
    data_ty = _data_type(context, args)

    # chunk wrapper: void(char **args, intp *dims, intp *steps, void *data), as numba_parallel_for calls it
    wrapper_ty = llir.FunctionType(llir.VoidType(), [i8p.as_pointer(), intp.as_pointer(), intp.as_pointer(), i8p])
    wrapper = llir.Function(module, wrapper_ty, name=f"qd_chunks_{next(_wrapper_ids)}_{fn.name}"[:200])
    wrapper.linkage = "internal"
    wb = llir.IRBuilder(wrapper.append_basic_block("entry"))
    w_args, w_dims, w_steps, w_data = wrapper.args
    data = wb.bitcast(w_data, data_ty.as_pointer())
    base = wb.ptrtoint(wb.load(w_args), intp)
    count = wb.load(w_dims)
    step = wb.load(w_steps)
    total = wb.load(wb.gep(data, [i32(0), i32(0)]))
    nchunks = wb.load(wb.gep(data, [i32(0), i32(1)]))
    packed = wb.load(wb.gep(data, [i32(0), i32(5)]))
    values = cgutils.unpack_tuple(wb, packed, len(args)) if len(args) else []
    with cgutils.for_range(wb, count) as loop:
        chunk = wb.add(base, wb.mul(loop.index, step))
        lo = wb.sdiv(wb.mul(chunk, total), nchunks)
        hi = wb.sdiv(wb.mul(wb.add(chunk, intp(1)), total), nchunks)
        status = call_task(wb, lo, hi, values)
        with cgutils.if_unlikely(wb, status.is_error):
            flag = wb.gep(data, [i32(0), i32(2)])
            res = wb.cmpxchg(flag, i32(0), i32(1), "monotonic", "monotonic")
            with wb.if_then(wb.extract_value(res, 1)):
                wb.store(status.code, wb.gep(data, [i32(0), i32(3)]))
                wb.store(status.excinfoptr, wb.gep(data, [i32(0), i32(4)]))
    wb.ret_void()

    # the region itself
    data_ptr = cgutils.alloca_once(builder, data_ty)
    nchunks_v = builder.select(builder.icmp_signed("<", total_v, nthreads), total_v, nthreads)
    builder.store(total_v, builder.gep(data_ptr, [i32(0), i32(0)]))
    builder.store(nchunks_v, builder.gep(data_ptr, [i32(0), i32(1)]))
    builder.store(i32(0), builder.gep(data_ptr, [i32(0), i32(2)]))
    builder.store(args_v, builder.gep(data_ptr, [i32(0), i32(5)]))
    arg_slot = cgutils.alloca_once(builder, i8p)
    builder.store(llir.Constant(i8p, None), arg_slot)
    dims = cgutils.alloca_once(builder, intp)
    builder.store(nchunks_v, dims)
    steps = cgutils.alloca_once(builder, intp)
    builder.store(intp(1), steps)
    parallel_for = cgutils.get_or_insert_function(
        module, llir.FunctionType(llir.VoidType(), [i8p] * 5 + [intp] * 3), "numba_parallel_for")
    # Release the GIL while workers run: a worker may need it (e.g. to seed its RNG state).
    pyapi = context.get_python_api(builder)
    gil_state = pyapi.gil_ensure()
    thread_state = pyapi.save_thread()
    builder.call(parallel_for, [builder.bitcast(wrapper, i8p), builder.bitcast(arg_slot, i8p),
                                builder.bitcast(dims, i8p), builder.bitcast(steps, i8p),
                                builder.bitcast(data_ptr, i8p), intp(0), intp(1), nthreads])
    pyapi.restore_thread(thread_state)
    pyapi.gil_release(gil_state)
    failed = builder.icmp_signed("!=", builder.load(builder.gep(data_ptr, [i32(0), i32(2)])), i32(0))
    with cgutils.if_unlikely(builder, failed):
        code = builder.load(builder.gep(data_ptr, [i32(0), i32(3)]))
        exc = builder.load(builder.gep(data_ptr, [i32(0), i32(4)]))
        status = context.call_conv._get_return_status(builder, code, exc)
        context.call_conv.return_status_propagate(builder, status)


# -- splitting the kernel into a driver and task functions ------------------------------------------

CTX = "$qd_ctx"            # the driver's (and a task function's) context: the field table's address
CTX_TYPE = types.uintp


class CpuTaskABI(TaskABI):
    """A range-for task on the CPU: ``task(lo, hi, *live_ins)`` runs flat iterations ``[lo, hi)``;
    the driver, which runs the serial code, passes every live-in but the fields, which the task
    loads from the kernel's field table (one ``ctx`` parameter, after the other live-ins)."""

    leading_params = ("qd_lo", "qd_hi")

    def __init__(self, fields: dict):
        self.fields = fields    # hidden field variable -> (table slot, TypeToken)

    @classmethod
    def for_state(cls, state) -> CpuTaskABI:
        """The ABI of ``state``'s kernel instance: slot k of the table is ``state.hidden[k]``."""
        return cls({f"__qd_field_{k}": (k, field_token(f, state.config.debug)) for k, f in enumerate(state.hidden)})

    def parameters(self, state, unit, reads):
        live = [n for n in unit.live_ins if n not in self.fields and n in reads]
        return live + [CTX] if any(n in self.fields for n in reads) else live

    def bind_inputs(self, state, unit, emit, leading, reads):
        bind_fields(emit, self.fields, reads)

    def flat_range(self, state, unit, emit, leading):
        lo, hi = leading
        return lo, hi, None

    def stable_id(self, unit) -> int:
        return next(_symbol_ids)


def field_token(field, debug: bool) -> device.TypeToken:
    """The field's type with its shape and (for a strided view) strides, constants of the code."""
    fty = field_type(field, debug)
    return device.TypeToken(fty, field._arr.shape, None if fty.layout == "C" else field._arr.strides)


def bind_fields(emit, fields: dict, reads) -> None:
    """Bind each field variable in ``reads`` to its view built from the table at ``CTX``."""
    ctx = emit.var(CTX)
    for name in sorted(reads & fields.keys(), key=lambda n: fields[n][0]):
        slot, token = fields[name]
        emit.call(device.field_from_ctx, [ctx, emit.const(slot, "slot"), emit.glob(token, "token")], emit.var(name))


def field_table(fields) -> np.ndarray:
    """The table of a kernel instance: the data address of each field's buffer, in slot order.
    Buffers never move (a field's, or its SNode tree's, is allocated once)."""
    return np.array([f._arr.ctypes.data for f in fields] or [0], np.uintp)


def build_task_function(state, unit, abi: CpuTaskABI, debug: bool) -> tuple[TaskFunction, list[str]]:
    """A TaskFunction for one range-for unit, and the names of the driver variables it takes."""
    cut = cut_task(state, unit, abi)
    timed = state.config.kernel_profiler and CLOCK_MONOTONIC is not None
    kernel_label = {label + TASK_LABEL_SHIFT: label for label in unit.labels}
    return TaskFunction(unit.task, cut.func_ir, debug, timed, kernel_label), cut.params


def build_driver(state, debug: bool):
    """The driver IR (serial code + launches) and the task functions, for ``compile_ir``. The
    driver takes the runtime parameters and ``ctx``, the address of the field table
    (:func:`field_table`), and loads the fields its own code reads from it."""
    ir = state.ir
    blocks = state.func_ir.blocks
    abi = CpuTaskABI.for_state(state)
    units = {id(u.loop): u for u in state.task_plan.units if u.kind == "range_for"}
    # every task is cut before the loop below rewrites the preheaders
    task_functions = [build_task_function(state, units[id(lp)], abi, debug) for lp in state.loops]
    for lp, (tf, live) in zip(state.loops, task_functions):
        task = tf.task
        pre = blocks[lp.preheader]
        loc = pre.body[-1].loc
        scope = pre.scope
        plumbing_ids = {id(s) for s in lp.plumbing}
        body = [s for s in pre.body[:-1] if id(s) not in plumbing_ids]
        tvar, fvar, avar, rvar, svar = (scope.redefine(n, loc) for n in
                                        ("$qd_task", "$qd_launch", "$qd_args", "$qd_launched", "$qd_serial"))
        body += [ir.Assign(ir.Global(f"qd_task{task.index}", tf, loc), tvar, loc),
                 ir.Assign(ir.Global("launch_range", launch_range, loc), fvar, loc),
                 ir.Assign(ir.Expr.build_tuple([ir.Var(scope, n, loc) for n in live], loc), avar, loc),
                 ir.Assign(ir.Const(task.serialize, loc), svar, loc),
                 ir.Assign(ir.Expr.call(fvar, [tvar, lp.total_var, avar, svar], (), loc), rvar, loc),
                 ir.Jump(lp.exit, loc)]
        pre.body = body
    for lp in state.loops:
        for lbl in lp.body:
            blocks.pop(lbl, None)
    _bind_driver_fields(state, abi.fields)
    params = list(state.runtime_params) + ["qd_ctx"]
    name = _identifier(state.kernel_name)
    driver = derive_ir(state, exec_stub(name, params), dict(blocks), params, stable_id=next(_symbol_ids))
    return driver, [tf for tf, _ in task_functions]


def _bind_driver_fields(state, fields: dict) -> None:
    """Replace the driver's hidden field arguments by ``ctx`` and the views of the fields its
    code reads (the launches pass ``ctx`` to the tasks that read fields)."""
    ir = state.ir
    for blk in state.func_ir.blocks.values():
        blk.body = [s for s in blk.body if not (isinstance(s, ir.Assign) and isinstance(s.value, ir.Arg)
                                                and s.target.name in fields)]
    reads = {v.name for blk in state.func_ir.blocks.values() for s in blk.body for v in s.list_vars()}
    entry = state.func_ir.blocks[min(state.func_ir.blocks)]
    loc = entry.loc
    emit = Emitter(ir, entry.scope, loc)
    emit.assign(ir.Arg("qd_ctx", len(state.runtime_params), loc), emit.var(CTX))
    bind_fields(emit, fields, reads)
    entry.body = emit.body + entry.body


def _identifier(name: str) -> str:
    clean = "".join(ch if ch.isalnum() else "_" for ch in name.split(".")[-1])
    return clean if clean and not clean[0].isdigit() else f"k_{clean}"


def typed_pieces(cres, task_functions) -> list[TypedPiece]:
    """The typed IR of a compiled driver and its task functions, which together cover the kernel:
    what the Tasks' types are cut from (passes/task_types.py), with no second type inference."""
    annotation = cres.type_annotation
    pieces = [TypedPiece(annotation.blocks, annotation.typemap)]
    for tf in task_functions:
        blocks, typemap = tf.typed
        pieces.append(TypedPiece(blocks, typemap, tf.kernel_label))
    return pieces


class KernelLibrary(JITCodeLibrary):
    """The code library of one kernel (its driver and every task function). Numba runs function
    passes on each function as it is added to a library, then the module passes on the whole
    library; a kernel's library is optimised by the module passes alone, which inline and
    optimise the same code again (about a sixth of the kernel's LLVM time for 32 loops)."""

    def _optimize_functions(self, ll_module):
        ll_module.data_layout = self._codegen._data_layout

    def _optimize_final_module(self):
        """The full module pipeline only. Numba runs a cheaper one first so that inlining brings
        NRT reference-count operations together for pruning; a kernel's fields carry none (they
        come from the field table) and the full pipeline prunes the rest (16% of the LLVM time
        of 32 loops)."""
        if not numba_config.LLVM_REFPRUNE_PASS:   # Numba's own pruning, as its libraries do then
            self._final_module = remove_redundant_nrt_refct(self._final_module)
        mpm, pb = self._codegen._module_pass_manager()
        with self._recorded_timings.record("Module passes (full optimization)", pb):
            mpm.run(self._final_module, pb)


def compile_driver(driver_ir, argtypes, task_functions, debug: bool):
    ensure_threading_layer()
    context = cpu_target.target_context
    library = KernelLibrary(context.codegen(), driver_ir.func_id.func_qualname)
    library.enable_object_caching()     # as Numba's own libraries: the offline cache serialises it
    with _lock:
        cres = compiler.compile_ir(cpu_target.typing_context, context, driver_ir,
                                   tuple(argtypes), None, compile_flags(debug, entry=True), {}, library=library,
                                   pipeline_class=TaskCompiler)
        for tf in task_functions:
            tf.install_environments(cres.library)
        return cres
