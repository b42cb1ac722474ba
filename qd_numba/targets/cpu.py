"""CPU target: one native call per kernel, one parallel region per range-for task.

Code shape. The kernel's serial code stays in one *driver* function, in program order; each
range-for task is cut out into its own *task function* ``task(lo, hi, *live_ins)`` that runs
iterations ``[lo, hi)`` serially. Where the loop was, the driver calls :func:`launch_range`,
whose codegen splits ``[0, total)`` into chunks and hands them to Numba's threading layer
(``numba_parallel_for``, the entry point parfors use) — so values computed by serial code
flow to tasks as ordinary arguments, and a whole kernel is one call into native code.

Why not parfors: Numba's parfor passes cost ~0.25 s of compile time per loop (measured: 32
``prange`` loops 9.0 s vs 1.5 s for the same loops serial; bench/compile_time.py); compiling
task bodies as plain functions avoids all of it. Exceptions raised in a task (bounds checks
under ``debug=True``) are caught per chunk and re-raised by the driver after the region.
"""

from __future__ import annotations

import itertools
import threading

from llvmlite import ir as llir
from numba.core import cgutils, compiler, types
from numba.core import ir as numba_ir
from numba.core.imputils import lower_constant
from numba.core.registry import cpu_target
from numba.core.typing.typeof import typeof_impl
from numba.extending import intrinsic, models, register_model

from ..passes.base import copy_ir, derive_ir, exec_stub
from ..passes.liveness import Liveness
from ..profiler import CLOCK_MONOTONIC, TASK_COUNTER_WORDS, counter_at

CODEGEN_STAGES = ("split into a driver (serial code, launches) and one task function per range-for "
                  "(targets/cpu.py build_driver)",
                  "Numba typing + lowering of the driver; each task function lowered into its library at its "
                  "launch site; LLVM optimises and emits the kernel once")

_threads_ready = False
_lock = threading.RLock()


def ensure_threading_layer() -> None:
    """Start Numba's thread pool and register its symbols (``numba_parallel_for``)."""
    global _threads_ready
    if not _threads_ready:
        from numba.np.ufunc.parallel import _launch_threads

        _launch_threads()
        cpu_target.target_context.refresh()
        _threads_ready = True


def compile_flags(debug: bool, entry: bool) -> compiler.Flags:
    flags = compiler.Flags()
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

    def __init__(self, task, func_ir, debug: bool, timed: bool = False):
        self.task = task
        self.func_ir = func_ir
        self.debug = debug
        self.error = None
        # kernel profiler: the launch site's counter, a global of the kernel's library
        self.clock_symbol = f"qd_task_clock_{next(_clock_ids)}_{task.uid}" if timed else None
        self._consumed = False   # func_ir was handed to Numba (which mutates it)
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
                                           flags, {}, library=context.active_code_library)
            except Exception as e:
                self.error = e
                raise
        self._environments.append((context.get_env_name(cres.fndesc), cres.environment))
        return cres.fndesc

    def install_environments(self, library) -> None:
        """Point each task's environment global at its Environment (what ``get_executable``
        does for a separately compiled function); the objects stay alive with the task."""
        for name, env in self._environments:
            library.codegen.set_env(name, env)

    def __deepcopy__(self, memo):
        return self


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
            return context.call_conv.call_function(b, fn, types.none, argtys, [lo, hi, *values])[0]

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

def _param_name(var_name: str, k: int) -> str:
    clean = "".join(ch if ch.isalnum() else "_" for ch in var_name)
    return f"v{k}_{clean}"


class _Liveness:
    """Per kernel, before the driver's preheaders are rewritten: the variables live at the
    entry of each block, and the blocks that assign each variable."""

    def __init__(self, state):
        ir = state.ir
        blocks = state.func_ir.blocks
        self.liveness = Liveness(state.tools.analysis, ir, blocks)   # linear in the IR (passes/liveness.py)
        self.assigned_in = {}
        for lbl, block in blocks.items():
            for stmt in block.body:
                if isinstance(stmt, ir.Assign):
                    self.assigned_in.setdefault(stmt.target.name, set()).add(lbl)

    def live_ins(self, state, lp):
        """The driver variables a task reads: assigned outside the loop, live at its header and
        read in its body. Liveness matters: a name that an earlier loop also assigned (``for i``
        twice) is read in this body only after this loop assigned it, and the driver has no
        value for it."""
        usedefs = state.tools.analysis.compute_use_defs({lbl: state.func_ir.blocks[lbl] for lbl in lp.body})
        used = set().union(*usedefs.usemap.values()) if usedefs.usemap else set()
        live = self.liveness.live_at(lp.header, used)   # used in the body: reachable from the header
        return sorted(name for name in live if name != lp.iter_var.name
                      and not self.assigned_in.get(name, set()) <= lp.body)


def build_task_function(state, lp, task, debug: bool, liveness) -> tuple[TaskFunction, list[str]]:
    """A TaskFunction for one offloaded loop, and the names of the driver variables it needs."""
    ir = state.ir
    blocks = state.func_ir.blocks
    live = liveness.live_ins(state, lp)
    params = ["qd_lo", "qd_hi"] + [_param_name(v, k) for k, v in enumerate(live)]
    stub = exec_stub(f"qd_task{task.index}", params)
    entry_block = blocks[lp.preheader]
    scope = entry_block.scope
    loc = blocks[lp.header].loc
    entry = ir.Block(scope, loc)
    lo = scope.redefine("$qd_lo", loc)
    hi = scope.redefine("$qd_hi", loc)
    entry.body.append(ir.Assign(ir.Arg(params[0], 0, loc), lo, loc))
    entry.body.append(ir.Assign(ir.Arg(params[1], 1, loc), hi, loc))
    for k, name in enumerate(live):
        entry.body.append(ir.Assign(ir.Arg(params[k + 2], k + 2, loc), ir.Var(scope, name, loc), loc))
    rng = scope.redefine("$qd_range", loc)
    call = scope.redefine("$qd_range_call", loc)
    it = scope.redefine("$qd_iter", loc)
    entry.body += [ir.Assign(ir.Global("range", range, loc), rng, loc),
                   ir.Assign(ir.Expr.call(rng, [lo, hi], (), loc), call, loc),
                   ir.Assign(ir.Expr.getiter(call, loc), it, loc),
                   ir.Assign(it, lp.iter_var, loc),
                   ir.Jump(lp.header, loc)]
    exit_block = ir.Block(scope, loc)
    none = scope.redefine("$qd_none", loc)
    ret = scope.redefine("$qd_ret", loc)
    exit_block.body = [ir.Assign(ir.Const(None, loc), none, loc),
                       ir.Assign(ir.Expr.cast(none, loc), ret, loc),
                       ir.Return(ret, loc)]
    # Numba takes the block with the smallest label as the entry; 0 is the kernel's own entry,
    # which never belongs to a loop body
    new_blocks = {0: entry, lp.exit: exit_block}
    for lbl in lp.body:
        new_blocks[lbl] = copy_ir(ir, blocks[lbl])
    task_ir = derive_ir(state, stub, new_blocks, params)
    timed = state.config.kernel_profiler and CLOCK_MONOTONIC is not None
    return TaskFunction(task, task_ir, debug, timed), live


def build_driver(state, debug: bool):
    """The driver IR (serial code + launches) and the task functions, for ``compile_ir``."""
    ir = state.ir
    blocks = state.func_ir.blocks
    task_functions = []
    by_index = {t.index: t for t in state.tasks}
    liveness = _Liveness(state)  # before the loop below rewrites the preheaders
    for lp in state.loops:
        task = by_index[lp.task_index]
        tf, live = build_task_function(state, lp, task, debug, liveness)
        task_functions.append(tf)
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
    params = list(state.runtime_params) + [f"__qd_field_{k}" for k in range(len(state.hidden))]
    stub = exec_stub(_identifier(state.kernel_name), params)
    driver = derive_ir(state, stub, dict(blocks), params)
    return driver, task_functions


def _identifier(name: str) -> str:
    clean = "".join(ch if ch.isalnum() else "_" for ch in name.split(".")[-1])
    return clean if clean and not clean[0].isdigit() else f"k_{clean}"


def compile_driver(driver_ir, argtypes, task_functions, debug: bool):
    ensure_threading_layer()
    with _lock:
        cres = compiler.compile_ir(cpu_target.typing_context, cpu_target.target_context, driver_ir,
                                   tuple(argtypes), None, compile_flags(debug, entry=True), {})
        for tf in task_functions:
            tf.install_environments(cres.library)
        return cres
