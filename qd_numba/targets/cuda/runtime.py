"""The CUDA runtime: the driver, the device, and the native launchers.

``_driver``/``_check`` wrap ``cuda.bindings.driver`` calls (a failure becomes a
QuadrantsRuntimeError). The packed-launch layout (``PACK_HEAD``, ``PACK_TASK``) is the int64 array
a plan hands, by address, to the native launch loops (:class:`Launchers`, built with llvmlite),
which call ``cuLaunchKernel`` once per task in one Python-to-native transition.
:class:`CudaRuntime` is the process-wide state (device, occupancy, module loading, field tables);
:func:`ensure_device` gives a field or qd.ndarray its device buffer.

This module never compiles kernels and never looks at kernel arguments (arrays.py, plan.py).
"""

from __future__ import annotations

import ctypes
import functools
import os
import threading

import numpy as np

from ... import config, offline_cache
from ...errors import QuadrantsConfigError, QuadrantsRuntimeError

FALLBACK_BLOCK = 256  # when the driver's occupancy calculator is unavailable


def _driver():
    from cuda.bindings import driver

    return driver


def _check(result, what):
    err = result[0] if isinstance(result, tuple) else result
    if int(err) != 0:
        drv = _driver()
        _, name = drv.cuGetErrorName(err)
        raise QuadrantsRuntimeError(f"CUDA driver error in {what}: {name.decode() if name else err}")
    return result[1] if isinstance(result, tuple) and len(result) == 2 else result


# -- launching: one native call for all tasks of a kernel -------------------------------------------------

# Layout of a plan's packed launch array (int64): [number of tasks, stream handle, then per task
# (CUfunction, grid, block, address of its void*[] parameter array)].
PACK_HEAD, PACK_TASK = 2, 4


def _launchers_ir() -> str:
    """The LLVM IR of :class:`Launchers`. It holds no address of this process: the functions it
    calls are reached through the globals of ``_EXTERNALS``, set once the code is loaded, so the
    object code can be cached on disk and loaded by any process."""
    from llvmlite import ir

    i32, i64 = ir.IntType(32), ir.IntType(64)
    launch_ty = ir.FunctionType(i32, [i64, i32, i32, i32, i32, i32, i32, i32, i64, i64, i64])
    record_ty = ir.FunctionType(i32, [i64, i64])
    module = ir.Module("qd_launchers")
    one, zero32 = ir.Constant(i32, 1), ir.Constant(i32, 0)
    externals = {}
    for name in _EXTERNALS:
        externals[name] = ir.GlobalVariable(module, i64, name)
        externals[name].initializer = ir.Constant(i64, 0)

    def external(b, name, fnty):
        return b.inttoptr(b.load(externals[name]), fnty.as_pointer())

    def word(b, packed, index):
        return b.load(b.gep(packed, [index]))

    def task_words(b, packed, k):
        base = b.add(ir.Constant(i64, PACK_HEAD), b.mul(k, ir.Constant(i64, PACK_TASK)))
        return [word(b, packed, b.add(base, ir.Constant(i64, j))) for j in range(PACK_TASK)]

    def failed(b, k, err):   # (k << 32) | err
        return b.or_(b.shl(k, ir.Constant(i64, 32)), b.zext(err, i64))

    def loop(name, extra, body):
        """``name(packed, *extra)``: for k in range(packed[0]): body(...) -> err (i32, 0: go on)."""
        fn = ir.Function(module, ir.FunctionType(i64, [i64.as_pointer(), *extra]), name)
        entry, head, work, fail, done = (fn.append_basic_block(n) for n in ("entry", "head", "work", "fail",
                                                                              "done"))
        b = ir.IRBuilder(entry)
        packed = fn.args[0]
        n, stream = word(b, packed, ir.Constant(i64, 0)), word(b, packed, ir.Constant(i64, 1))
        b.branch(head)
        b.position_at_end(head)
        k = b.phi(i64)
        k.add_incoming(ir.Constant(i64, 0), entry)
        b.cbranch(b.icmp_signed("<", k, n), work, done)
        b.position_at_end(work)
        err = body(b, fn, packed, k, stream)
        nxt = b.add(k, ir.Constant(i64, 1))
        k.add_incoming(nxt, b.block)
        b.cbranch(b.icmp_unsigned("!=", err, zero32), fail, head)
        b.position_at_end(fail)
        b.ret(failed(b, k, err))
        b.position_at_end(done)
        b.ret(ir.Constant(i64, -1))

    def launch_if_work(b, fn, packed, k, stream):
        """cuLaunchKernel of task k if its grid is positive -> CUresult (0 without a launch)."""
        task, grid, block, params = task_words(b, packed, k)
        start = b.block
        go, join = fn.append_basic_block("go"), fn.append_basic_block("join")
        b.cbranch(b.icmp_signed(">", grid, ir.Constant(i64, 0)), go, join)
        b.position_at_end(go)
        target = external(b, "qd_extern_cuLaunchKernel", launch_ty)
        err = b.call(target, [task, b.trunc(grid, i32), one, one, b.trunc(block, i32), one, one, zero32, stream,
                              params, ir.Constant(i64, 0)])
        b.branch(join)
        b.position_at_end(join)
        result = b.phi(i32)
        result.add_incoming(zero32, start)
        result.add_incoming(err, go)
        return result

    def timed(b, fn, packed, k, stream):
        events = fn.args[1]
        rec = external(b, "qd_extern_cuEventRecord", record_ty)
        two_k = b.shl(k, ir.Constant(i64, 1))
        err = b.call(rec, [word(b, events, two_k), stream])
        before = b.block
        launched, recorded, after = (fn.append_basic_block(n) for n in ("launch", "record_after", "after"))
        b.cbranch(b.icmp_unsigned("==", err, zero32), launched, after)
        b.position_at_end(launched)
        err2 = launch_if_work(b, fn, packed, k, stream)
        launched_end = b.block
        b.cbranch(b.icmp_unsigned("==", err2, zero32), recorded, after)
        b.position_at_end(recorded)
        err3 = b.call(rec, [word(b, events, b.add(two_k, ir.Constant(i64, 1))), stream])
        b.branch(after)
        b.position_at_end(after)
        result = b.phi(i32)
        result.add_incoming(err, before)
        result.add_incoming(err2, launched_end)
        result.add_incoming(err3, recorded)
        return result

    loop("qd_launch_all", [], launch_if_work)
    loop("qd_launch_timed", [i64.as_pointer()], timed)
    one_task = ir.Function(module, ir.FunctionType(i64, [i64.as_pointer(), i64]), "qd_launch_task")
    b = ir.IRBuilder(one_task.append_basic_block("entry"))
    packed, k = one_task.args
    err = launch_if_work(b, one_task, packed, k, word(b, packed, ir.Constant(i64, 1)))
    b.ret(b.select(b.icmp_unsigned("==", err, zero32), ir.Constant(i64, -1), failed(b, k, err)))

    # launch_all as a CPython builtin (METH_NOARGS) whose ``self`` is the packed array's
    # address: the hot path's call costs what calling len() does, no argument conversion
    obj = ir.IntType(8).as_pointer()
    builtin = ir.Function(module, ir.FunctionType(obj, [obj, obj]), "qd_launch_all_builtin")
    b = ir.IRBuilder(builtin.append_basic_block("entry"))
    as_ptr = external(b, "qd_extern_PyLong_AsVoidPtr", ir.FunctionType(obj, [obj]))
    from_i64 = external(b, "qd_extern_PyLong_FromLongLong", ir.FunctionType(obj, [i64]))
    packed = b.bitcast(b.call(as_ptr, [builtin.args[0]]), i64.as_pointer())
    b.ret(b.call(from_i64, [b.call(module.get_global("qd_launch_all"), [packed])]))
    return str(module)


class Launchers:
    """The native launch loops, built straight with llvmlite (no Numba compile, so a process
    whose kernels all come from the offline cache never starts Numba's CPU compiler), each
    taking the address of a packed launch array and returning -1 or ``task index << 32 |
    CUresult`` of the first failure:

    - ``launch_all(packed)``: ``cuLaunchKernel`` for every task with a positive grid (the plans
      call it as a builtin bound to their packed array, :meth:`bind_launch_all`);
    - ``launch_task(packed, k)``: task k alone (debug plans check each task's error word
      before launching the next, so a failed check stops the kernel there, as on the CPU);
    - ``launch_timed(packed, events)``: ``launch_all``'s loop for the kernel profiler, recording
      CUDA event ``events[2k]`` before task k and ``events[2k + 1]`` after it (also around a
      task with an empty grid, which does not launch).

    ``launch`` and ``record`` are the addresses of ``cuLaunchKernel`` and ``cuEventRecord`` (the
    tests pass stand-ins)."""

    def __init__(self, launch: int, record: int):
        import llvmlite.binding as llvm

        llvm.initialize_native_target()
        llvm.initialize_native_asmprinter()
        key = _launchers_key()
        cached = offline_cache.load_blob(key) if config.current.offline_cache else None
        ir_text, obj = cached if cached is not None else (_launchers_ir(), None)
        # with the object code cached, MCJIT is handed an empty module and loads the cached
        # object in its place (the object cache answers for the module being "compiled"; symbols
        # are then found in the loaded object): parsing the IR again would cost ~0.5 ms
        parsed = llvm.parse_assembly("" if obj is not None else ir_text)
        parsed.verify()
        machine = llvm.Target.from_default_triple().create_target_machine(opt=2)
        self._engine = llvm.create_mcjit_compiler(parsed, machine)
        compiled = []
        self._engine.set_object_cache(lambda _module, buffer: compiled.append(bytes(buffer)), lambda _module: obj)
        self._engine.finalize_object()
        if obj is None and compiled and config.current.offline_cache:
            offline_cache.store_blob(key, (ir_text, compiled[0]))
        # engines live until the process ends: a test run that disposed several of them next to
        # Numba's own engine aborted at exit in LLVM's StringMap (seen with llvmlite 0.50)
        _ENGINES.append(self._engine)
        api = {name: ctypes.cast(getattr(ctypes.pythonapi, name), ctypes.c_void_p).value
               for name in ("PyLong_AsVoidPtr", "PyLong_FromLongLong")}
        addresses = {"qd_extern_cuLaunchKernel": launch, "qd_extern_cuEventRecord": record,
                     "qd_extern_PyLong_AsVoidPtr": api["PyLong_AsVoidPtr"],
                     "qd_extern_PyLong_FromLongLong": api["PyLong_FromLongLong"]}
        for name in _EXTERNALS:
            ctypes.c_int64.from_address(self._engine.get_global_value_address(name)).value = addresses[name]
        address = self._engine.get_function_address
        c_i64, c_ptr = ctypes.c_int64, ctypes.c_void_p
        self.launch_all = ctypes.CFUNCTYPE(c_i64, c_ptr)(address("qd_launch_all"))
        self.launch_task = ctypes.CFUNCTYPE(c_i64, c_ptr, c_i64)(address("qd_launch_task"))
        self.launch_timed = ctypes.CFUNCTYPE(c_i64, c_ptr, c_ptr)(address("qd_launch_timed"))
        self._method = _PyMethodDef(b"launch_all", address("qd_launch_all_builtin"), _METH_NOARGS, None)

    def bind_launch_all(self, packed: int):
        """``launch_all()`` of the packed array at address ``packed`` (kept alive by the caller),
        as a builtin function taking no arguments."""
        return _new_builtin(ctypes.addressof(self._method), packed, None)


_ENGINES: list = []
_EXTERNALS = ("qd_extern_cuLaunchKernel", "qd_extern_cuEventRecord", "qd_extern_PyLong_AsVoidPtr",
              "qd_extern_PyLong_FromLongLong")


def _launchers_key() -> str:
    """The offline-cache key of the launchers' code: this module's source (which builds it), the
    host triple and llvmlite's version (its LLVM makes the object code)."""
    import hashlib

    import llvmlite
    import llvmlite.binding as llvm

    with open(__file__, "rb") as f:
        source = f.read()
    return hashlib.sha256(b"qd_launchers\0" + source + llvm.get_process_triple().encode() +
                          llvmlite.__version__.encode()).hexdigest()


class _PyMethodDef(ctypes.Structure):
    _fields_ = [("ml_name", ctypes.c_char_p), ("ml_meth", ctypes.c_void_p), ("ml_flags", ctypes.c_int),
                ("ml_doc", ctypes.c_char_p)]


_METH_NOARGS = 0x0004
_new_builtin = ctypes.pythonapi.PyCFunction_NewEx
_new_builtin.restype = ctypes.py_object
_new_builtin.argtypes = [ctypes.c_void_p, ctypes.py_object, ctypes.py_object]


class PyLaunchers:
    """The launch loops of :class:`Launchers` in Python over ctypes: same functions, same
    results. A plan launches through them while the native loops are still being built on the
    thread :func:`start_launchers` starts, so a process whose kernels come from the offline cache
    does not wait ~2 ms (MCJIT's set-up) before its first launch; the plan moves to the native
    loops once they exist (:func:`bind_launch_all`). A launch costs more here: Python per task."""

    def __init__(self, launch: int, record: int):
        c_int, c_uint, c_ptr = ctypes.c_int, ctypes.c_uint, ctypes.c_void_p
        self._launch = ctypes.CFUNCTYPE(c_int, c_ptr, c_uint, c_uint, c_uint, c_uint, c_uint, c_uint, c_uint,
                                        c_ptr, c_ptr, c_ptr)(launch)
        self._record = ctypes.CFUNCTYPE(c_int, c_ptr, c_ptr)(record)

    @staticmethod
    def _words(packed: int):
        n = ctypes.c_int64.from_address(packed).value
        return (ctypes.c_int64 * (PACK_HEAD + PACK_TASK * n)).from_address(packed)

    def _launch_if_work(self, words, k: int, stream: int) -> int:
        base = PACK_HEAD + PACK_TASK * k
        task, grid, block, params = words[base:base + PACK_TASK]
        if grid <= 0:
            return 0
        return self._launch(task, grid, 1, 1, block, 1, 1, 0, stream, params, None)

    def launch_all(self, packed: int) -> int:
        words = self._words(packed)
        for k in range(words[0]):
            err = self._launch_if_work(words, k, words[1])
            if err:
                return (k << 32) | err
        return -1

    def launch_task(self, packed: int, k: int) -> int:
        words = self._words(packed)
        err = self._launch_if_work(words, k, words[1])
        return (k << 32) | err if err else -1

    def launch_timed(self, packed: int, events: int) -> int:
        words = self._words(packed)
        n, stream = words[0], words[1]
        marks = (ctypes.c_int64 * (2 * n)).from_address(events) if n else ()
        for k in range(n):
            err = self._record(marks[2 * k], stream) or self._launch_if_work(words, k, stream) \
                or self._record(marks[2 * k + 1], stream)
            if err:
                return (k << 32) | err
        return -1

    def bind_launch_all(self, packed: int):
        return functools.partial(self.launch_all, packed)


# the process's launchers: built once, on the thread start_launchers() starts (qd.init(arch=qd.cuda))
# or, if nothing started it, by the first launchers() call
_launchers: Launchers | None = None
_launchers_error: BaseException | None = None
_launchers_thread: threading.Thread | None = None
_launchers_lock = threading.Lock()      # the globals below
_build_mutex = threading.Lock()         # one build at a time
_waiting: list = []            # callbacks of plans launching through PyLaunchers until _launchers exists
_py_launchers: PyLaunchers | None = None


def _driver_entry_points() -> tuple[int, int]:
    libcuda = ctypes.CDLL("libcuda.so.1")
    return (ctypes.cast(libcuda.cuLaunchKernel, ctypes.c_void_p).value,
            ctypes.cast(libcuda.cuEventRecord, ctypes.c_void_p).value)


def _build_launchers(entry_points=None) -> None:
    """Build the native loops unless done (here, or waiting for the thread that builds them).
    Under Numba's compiler lock: MCJIT uses LLVM's global context, which Numba's compiles share;
    the locks are always taken in this order, so a thread compiling with Numba that calls
    :func:`launchers` builds them itself instead of waiting for a thread that waits for it."""
    global _launchers, _launchers_error
    from numba.core.compiler_lock import global_compiler_lock

    with global_compiler_lock, _build_mutex:
        if _launchers is not None or _launchers_error is not None:
            return
        try:
            built = Launchers(*(entry_points or _driver_entry_points()))
        except BaseException as e:   # re-raised by launchers(); plans keep the Python loops
            with _launchers_lock:
                _launchers_error = e
                _waiting.clear()
            return
        with _launchers_lock:
            _launchers = built
            waiting = list(_waiting)
            _waiting.clear()
    for on_native in waiting:
        on_native(built)


def _set_up(entry_points) -> None:
    """The work of :func:`start_launchers`' thread: the toolchain versions the offline cache's
    keys need (from their record, toolchain.py), then the launchers."""
    from . import toolchain

    try:
        toolchain.read_record()
    except Exception:   # the first lookup reads it again and reports what is wrong
        pass
    _build_launchers(entry_points)


def start_launchers(entry_points=None) -> None:
    """Build the native launch loops on a thread (once per process; ``entry_points``: the
    addresses of ``cuLaunchKernel`` and ``cuEventRecord``, the driver's by default), after
    reading the toolchain's versions for the offline cache (:func:`_set_up`)."""
    global _launchers_thread
    with _launchers_lock:
        if _launchers_thread is not None or _launchers is not None:
            return
        _launchers_thread = threading.Thread(target=_set_up, args=(entry_points,),
                                             name="qd_numba launchers", daemon=True)
        _launchers_thread.start()


def launchers() -> Launchers:
    """The process's native :class:`Launchers` (built here, or waited for when the thread
    :func:`start_launchers` started is building them)."""
    if _launchers is None:
        _build_launchers()
        if _launchers is None:
            raise QuadrantsRuntimeError(f"the CUDA launch loops could not be built: {_launchers_error!r}") \
                from _launchers_error
    return _launchers


def bind_launch_all(packed: int, on_native):
    """``launch_all()`` of the packed array at ``packed``: the native builtin when the native
    loops exist; else the Python loop, and ``on_native(native_launch_all)`` is called (on the
    building thread) once they do, for the plan to switch."""
    global _py_launchers
    start_launchers()
    with _launchers_lock:
        native = _launchers
        if native is None and _launchers_error is None:
            _waiting.append(lambda built: on_native(built.bind_launch_all(packed)))
            if _py_launchers is None:
                _py_launchers = PyLaunchers(*_driver_entry_points())
            return _py_launchers.bind_launch_all(packed)
    return launchers().bind_launch_all(packed)


# -- the runtime: device, context table ---------------------------------------------------------------

def _check_device_id(device_id: int | None, count: int) -> None:
    if device_id is not None and not 0 <= device_id < count:
        raise QuadrantsConfigError(f"device_id={device_id} (qd.init(device_id=...) or QD_DEVICE): no such CUDA "
                                   f"device; {_device_list(count)}")


class CudaRuntime:
    """Process-wide CUDA state: the device, the field context table, loaded modules."""

    _instance = None
    _lock = threading.Lock()

    def __init__(self, device_id: int | None = None):
        from numba import cuda

        from .compile import cuda_available, install_cuda_ufunc_math_fallbacks

        if not cuda_available():
            raise QuadrantsRuntimeError("the CUDA backend needs an NVIDIA GPU and a CUDA driver; none was found")
        self.cuda = cuda
        self.device_count = len(cuda.gpus)
        _check_device_id(device_id, self.device_count)
        try:
            # numba-cuda pushes the device's primary context in this thread; None: the device
            # current in this thread (torch.cuda.set_device's), else device 0
            if device_id is not None:
                cuda.select_device(device_id)
            self.context = cuda.current_context()
        except RuntimeError as e:
            raise QuadrantsConfigError(f"device_id={device_id}: numba-cuda cannot use that device's context in this "
                                       f"thread ({e}); qd_numba runs on one device per process") from None
        self.device_id = int(self.context.device.id)
        dev = self.context.device
        self.cc = tuple(dev.compute_capability)
        self.sm_count = int(dev.MULTIPROCESSOR_COUNT)
        # every resident thread of the device: the most a saturating grid-stride launch uses
        self.max_threads = self.sm_count * int(dev.MAX_THREADS_PER_MULTIPROCESSOR)
        install_cuda_ufunc_math_fallbacks()
        self.plan_builds = 0
        self.stack_limit = 0        # the cuda_stack_limit applied (0: the driver's default)
        self._fence_event = None    # fence(): created on first use
        self._own_streams = set()   # handles of live streams stream_create made (blocking)
        self._fence_lock = threading.Lock()

    def apply_stack_limit(self, limit: int) -> None:
        """Set the per-thread device stack to ``limit`` bytes (``qd.init(cuda_stack_limit=...)``;
        recursive ``qd.real_func`` calls need it); 0 leaves the driver's default."""
        if limit and limit != self.stack_limit:
            self.context.push()
            try:
                drv = _driver()
                _check(drv.cuCtxSetLimit(drv.CUlimit.CU_LIMIT_STACK_SIZE, int(limit)), "cuCtxSetLimit(stack size)")
            finally:
                self.context.pop()
            self.stack_limit = limit

    @classmethod
    def open(cls, device_id: int | None) -> CudaRuntime:
        """The runtime on CUDA device ``device_id`` (``qd.init``; None: the device current in
        this thread): made on first use; one device per process (docs/multi_gpu.md), so asking
        for another one later is our error."""
        with cls._lock:
            rt = cls._instance
            if rt is None:
                rt = cls._instance = CudaRuntime(device_id)
            elif device_id is not None and rt.device_id != device_id:
                _check_device_id(device_id, rt.device_count)    # an id out of range says so first
                raise QuadrantsConfigError(f"qd.init(device_id={device_id}): this process already runs on CUDA device "
                                           f"{rt.device_id}; qd_numba uses one device per process (start one "
                                           "process per GPU, e.g. with torchrun)")
        return rt

    @classmethod
    def get(cls) -> CudaRuntime:
        if cls._instance is None:
            return cls.open(config.current.device_id)
        return cls._instance

    def device_of_pointer(self, ptr: int) -> int:
        """The ordinal of the device holding device pointer ``ptr``: the driver's answer, asked
        at every call. Not remembered per address: freed memory's addresses are reused by
        allocations on other devices (unified addressing), so a remembered answer can be stale
        (on two H200s a tensor on device 1 passed the remembering check: the likely cause)."""
        drv = _driver()
        attr = drv.CUpointer_attribute.CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL
        return int(_check(drv.cuPointerGetAttribute(attr, ptr), "cuPointerGetAttribute(device ordinal)"))

    def context_buffers(self, fields, tmp_bytes: int):
        """A kernel instance's device buffers, in one allocation: the table of the data pointers
        of ``fields`` (its fields, in the order of its context slots; field buffers never move,
        so it is written once), then ``tmp_bytes`` of zeroed temporaries at the next 64-byte
        boundary. Returns (the allocation, freed when it is dropped; the table's address; the
        temporaries' address). A raw allocation: a device array costs ~0.1 ms more of Python,
        in a cached kernel's first call."""
        for f in fields:
            f.claim()           # a field of an earlier qd.init is our error (field.py)
            ensure_device(f)
        head = -(-8 * max(1, len(fields)) // 64) * 64
        table = np.array([f._dev.device_ctypes_pointer.value for f in fields], np.uint64)
        buf = self.context.memalloc(head + tmp_bytes)
        address = int(buf.device_ctypes_pointer.value)
        drv = _driver()
        if len(fields):
            # pageable memory: returns once the bytes are staged, ordered before later launches
            _check(drv.cuMemcpyHtoD(address, table.ctypes.data, table.nbytes), "cuMemcpyHtoD(field table)")
        if tmp_bytes:
            _check(drv.cuMemsetD8(address + head, 0, tmp_bytes), "cuMemsetD8(temporaries)")
        return buf, address, address + head

    def read_bytes(self, address: int, nbytes: int) -> np.ndarray:
        """``nbytes`` bytes of device memory at ``address`` (after the work queued before)."""
        raw = np.empty(nbytes, np.uint8)
        if nbytes:
            _check(_driver().cuMemcpyDtoH(raw.ctypes.data, address, nbytes), "cuMemcpyDtoH")
        return raw

    def device_words(self, count: int):
        """A device buffer of ``count`` int64 words and its address (adstack heaps)."""
        buf = self.cuda.device_array(count, np.int64)
        return buf, int(buf.device_ctypes_pointer.value)

    def pinned_words(self, count: int):
        """``count`` int64 words of page-locked host memory (never freed: a few per adstack) and
        their address, for copies the device makes asynchronously."""
        address = _check(_driver().cuMemAllocHost(8 * count), "cuMemAllocHost")
        words = (ctypes.c_int64 * count).from_address(int(address))
        return words, int(address)

    def event(self):
        drv = _driver()
        return _check(drv.cuEventCreate(drv.CUevent_flags.CU_EVENT_DISABLE_TIMING), "cuEventCreate")

    # -- explicit streams and events (streams.py); handles are ints ----------------------------------------
    def stream_create(self) -> int:
        """A new blocking stream: CUDA orders it with the legacy default stream."""
        drv = _driver()
        self.context  # noqa: B018  (numba made the primary context current in this thread)
        handle = int(_check(drv.cuStreamCreate(drv.CUstream_flags.CU_STREAM_DEFAULT), "cuStreamCreate"))
        self._own_streams.add(handle)
        return handle

    def stream_destroy(self, handle: int) -> None:
        self._own_streams.discard(handle)
        _check(_driver().cuStreamDestroy(handle), "cuStreamDestroy")

    def stream_synchronize(self, handle: int) -> None:
        _check(_driver().cuStreamSynchronize(handle), "cuStreamSynchronize")

    def stream_nonblocking(self, handle: int) -> bool:
        """Whether the stream ``handle`` runs unordered with the legacy default stream (created
        non-blocking, as torch's pool streams are); the special handles 1 and 2 (legacy,
        per-thread default) and the streams :meth:`stream_create` made are ordered with it
        (no driver call); other handles are asked each time (a freed handle may come back)."""
        if handle in (1, 2) or handle in self._own_streams:
            return False
        drv = _driver()
        flags = _check(drv.cuStreamGetFlags(handle), "cuStreamGetFlags")
        return bool(int(flags) & int(drv.CUstream_flags.CU_STREAM_NON_BLOCKING))

    def event_create(self) -> int:
        self.context  # noqa: B018
        return int(self.event())

    def event_destroy(self, handle: int) -> None:
        _check(_driver().cuEventDestroy(handle), "cuEventDestroy")

    def event_record(self, event: int, stream: int) -> None:
        _check(_driver().cuEventRecord(event, stream), "cuEventRecord")

    def stream_wait_event(self, stream: int, event: int) -> None:
        _check(_driver().cuStreamWaitEvent(stream, event, 0), "cuStreamWaitEvent")

    def event_synchronize(self, event: int) -> None:
        _check(_driver().cuEventSynchronize(event), "cuEventSynchronize")

    def fence(self, before: int, after: int) -> None:
        """Order the work queued later on stream ``after`` behind the work queued so far on
        stream ``before`` (an event, no host wait). One event serves every fence: a wait
        takes the event's state when it is queued."""
        with self._fence_lock:
            if self._fence_event is None:
                self._fence_event = self.event_create()
            self.event_record(self._fence_event, before)
            self.stream_wait_event(after, self._fence_event)

    def read_async(self, host_address: int, device_address: int, nbytes: int, event) -> None:
        """Copy ``nbytes`` (a multiple of 4) of device memory to pinned host memory and zero them,
        after the work queued on the legacy default stream (the plans' stream), and record
        ``event`` after that; no waiting."""
        drv = _driver()
        stream = drv.CUstream(0)
        _check(drv.cuMemcpyDtoHAsync(host_address, device_address, nbytes, stream), "cuMemcpyDtoHAsync")
        _check(drv.cuMemsetD32Async(device_address, 0, nbytes // 4, stream), "cuMemsetD32Async")
        _check(drv.cuEventRecord(event, stream), "cuEventRecord")

    def write_async(self, device_address: int, host_address: int, nbytes: int, event) -> None:
        """Copy pinned host memory to the device, ordered on the legacy default stream before the
        work queued after it, and record ``event`` after the copy (the host memory may be reused
        once it has passed); no waiting."""
        drv = _driver()
        stream = drv.CUstream(0)
        _check(drv.cuMemcpyHtoDAsync(device_address, host_address, nbytes, stream), "cuMemcpyHtoDAsync")
        _check(drv.cuEventRecord(event, stream), "cuEventRecord")

    def event_done(self, event) -> bool:
        """Whether the work before ``event`` has finished (never waits)."""
        drv = _driver()
        (err,) = drv.cuEventQuery(event)
        if err == drv.CUresult.CUDA_ERROR_NOT_READY:
            return False
        _check((err,), "cuEventQuery")
        return True

    def wait_event(self, event) -> None:
        _check(_driver().cuEventSynchronize(event), "cuEventSynchronize")

    def global_address(self, module, symbol: str) -> int:
        err, address, _ = _driver().cuModuleGetGlobal(module, symbol.encode())
        _check((err,), f"cuModuleGetGlobal({symbol})")
        return int(address)

    def read_i32(self, address: int) -> int:
        value = ctypes.c_int32()
        _check(_driver().cuMemcpyDtoH(ctypes.addressof(value), address, 4), "cuMemcpyDtoH")
        return value.value

    def write_i32(self, address: int, value: int) -> None:
        _check(_driver().cuMemsetD32(address, value, 1), "cuMemsetD32")

    def occupancy(self, fn) -> tuple[int, int]:
        """(saturating grid, block size) of a grid-stride kernel: the driver's occupancy
        calculator picks the block size with the most resident warps for this function's
        registers, and the smallest grid reaching that occupancy on every SM."""
        err, min_grid, block = _driver().cuOccupancyMaxPotentialBlockSize(fn, None, 0, 0)
        if int(err) != 0 or block <= 0 or min_grid <= 0:
            block = FALLBACK_BLOCK
            return max(1, self.max_threads // block), block
        return int(min_grid), int(block)

    def load_function(self, cubin: bytes, entry: str):
        drv = _driver()
        self.context  # noqa: B018  (numba made the primary context current in this thread)
        module = _check(drv.cuModuleLoadData(cubin), "cuModuleLoadData")
        fn = _check(drv.cuModuleGetFunction(module, entry.encode()), "cuModuleGetFunction")
        return module, fn


def _device_list(count: int) -> str:
    """How many CUDA devices this process sees, for error messages."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    seen = f" (CUDA_VISIBLE_DEVICES={visible})" if visible is not None else ""
    return f"this process sees {count} CUDA device(s){seen}, ids 0 to {count - 1}"


# -- device storage of fields and qd.ndarrays --------------------------------------------------------

def ensure_device(data) -> None:
    """Give a field/qd.ndarray its device buffer (from its host data, the first time). Host data
    that is all zero bytes (a field nothing wrote yet) is set on the device rather than copied:
    numba-cuda's ``to_device`` costs ~0.2 ms of Python for a small array, an allocation and a
    memset ~0.05 ms (H100), and a large zero field moves no bytes. Both are ordered on the legacy
    default stream before the launches that follow, as the copy was."""
    if data._dev is None:
        rt = CudaRuntime.get()
        host = np.ascontiguousarray(data._arr)
        if not _all_zero_bytes(host):
            data._dev = rt.cuda.to_device(host)
            return
        dev = rt.cuda.device_array(host.shape, host.dtype)
        if host.nbytes:
            _check(_driver().cuMemsetD8(int(dev.device_ctypes_pointer.value), 0, host.nbytes), "cuMemsetD8")
        data._dev = dev


def _all_zero_bytes(host: np.ndarray, chunk: int = 1 << 20) -> bool:
    """Whether a C-contiguous array's bytes are all zero (a -0.0 is not), stopping at the first
    chunk that is not."""
    flat = host.reshape(-1).view(np.uint8)
    return not any(flat[start:start + chunk].any() for start in range(0, flat.size, chunk))
