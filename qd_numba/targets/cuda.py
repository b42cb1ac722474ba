"""The CUDA target: compile a kernel's tasks to cubins and launch them through the driver.

Compilation (once per kernel and argument spec): the untyped pipeline runs on numba-cuda's IR
classes, :mod:`.cuda_tasks` splits the result into task kernels, :mod:`.cuda_compile` turns each
into a cubin, and the cubins are loaded with ``cuModuleLoadData``. The result is a
:class:`LaunchPlan`: one ``CUfunction`` per task, its grid and block, and a pre-packed
``void*[]`` parameter array per task whose cells are shared by all tasks of the kernel.

A call then only (1) checks the argument spec (type, dtype, ndim, contiguity per ndarray
argument), (2) writes the cells of arguments that changed (a new pointer, a scalar value),
(3) computes iteration counts that depend on argument shapes (generated Python, no device
round trip) and (4) calls ``cuLaunchKernel`` once per task on the legacy default stream. No
typing, no ``typeof``, no allocation, no numba-cuda dispatcher on that path.

Fields live in device memory; every task kernel receives one pointer to its instance's field
table (data pointers of the fields it uses, in kernel-local slots) instead of one parameter per
field (lowering/device.py).
"""

from __future__ import annotations

import ctypes
import re
import threading

import numpy as np
from numba.core import types

from .. import config, profiler, runtime
from ..errors import QuadrantsRuntimeError, QuadrantsTypeError, take_pending
from ..field import Ndarray
from ..frontend.args import INT_TYPES, NUMBER_TYPES, argument_where, check_scalar, ndarray_type, template_key
from ..frontend.diagnostics import compile_error
from ..frontend.keys import artifact_key
from ..generated_code import exec_generated
from ..lowering import device
from ..lowering.raising import device_exception
from . import cuda_tasks
from .base import KernelBackend, Target

CODEGEN_STAGES = ("split into task kernels: range-for -> grid-stride kernel, serial code -> 1-thread kernel "
                  "(targets/cuda_tasks.py)",
                  "per task: numba-cuda typing + lowering, NVVM, nvJitLink -> cubin (targets/cuda_compile.py)",
                  "launch plan: cubins loaded, parameters pre-packed, host iteration counts (targets/cuda.py)")

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

_native_launch_all = None

# Layout of a plan's packed launch array (int64): [number of tasks, stream handle, then per task
# (CUfunction, grid, block, address of its void*[] parameter array)].
PACK_HEAD, PACK_TASK = 2, 4


def native_launcher():
    """``launch_all(packed) -> status``: a Numba-compiled loop calling the driver's
    ``cuLaunchKernel`` through ctypes for every task with a positive grid. One
    Python-to-native transition, with one array argument, per kernel call. The status is -1,
    or ``task index << 32 | CUresult`` of the first failure."""
    global _native_launch_all
    if _native_launch_all is None:
        import numba

        libcuda = ctypes.CDLL("libcuda.so.1")
        launch = libcuda.cuLaunchKernel
        # pointers pass as 64-bit integers (same registers in the x86-64/aarch64 C ABIs)
        launch.argtypes = [ctypes.c_uint64] + [ctypes.c_uint32] * 7 + [ctypes.c_uint64] * 3
        launch.restype = ctypes.c_int32

        @numba.njit(nogil=True)
        def launch_all(packed):
            stream = packed[1]
            for k in range(packed[0]):
                base = PACK_HEAD + PACK_TASK * k
                grid = packed[base + 1]
                if grid > 0:
                    err = launch(packed[base], grid, 1, 1, packed[base + 2], 1, 1, 0, stream, packed[base + 3], 0)
                    if err != 0:
                        return (k << 32) | err
            return -1

        @numba.njit(nogil=True)
        def launch_task(packed, k):
            base = PACK_HEAD + PACK_TASK * k
            grid = packed[base + 1]
            if grid > 0:
                err = launch(packed[base], grid, 1, 1, packed[base + 2], 1, 1, 0, packed[1], packed[base + 3], 0)
                if err != 0:
                    return (k << 32) | err
            return -1

        _native_launch_all = launch_all, launch_task
    return _native_launch_all[0]


def native_task_launcher():
    """``launch_task(packed, k) -> status``: launch task k alone (debug plans check each task's
    error word before launching the next, so a failed check stops the kernel there, as on the
    CPU)."""
    native_launcher()
    return _native_launch_all[1]


_native_launch_timed = None


def native_timed_launcher():
    """``launch_timed(packed, events) -> status``: :func:`native_launcher`'s loop for the kernel
    profiler, recording the CUDA event ``events[2k]`` before task k and ``events[2k + 1]`` after
    it (also around a task with an empty grid, which does not launch)."""
    global _native_launch_timed
    if _native_launch_timed is None:
        import numba

        libcuda = ctypes.CDLL("libcuda.so.1")
        launch = libcuda.cuLaunchKernel
        launch.argtypes = [ctypes.c_uint64] + [ctypes.c_uint32] * 7 + [ctypes.c_uint64] * 3
        launch.restype = ctypes.c_int32
        record = libcuda.cuEventRecord
        record.argtypes = [ctypes.c_uint64, ctypes.c_uint64]
        record.restype = ctypes.c_int32

        @numba.njit(nogil=True)
        def launch_timed(packed, events):
            stream = packed[1]
            for k in range(packed[0]):
                base = PACK_HEAD + PACK_TASK * k
                grid = packed[base + 1]
                err = record(events[2 * k], stream)
                if err == 0 and grid > 0:
                    err = launch(packed[base], grid, 1, 1, packed[base + 2], 1, 1, 0, stream, packed[base + 3], 0)
                if err == 0:
                    err = record(events[2 * k + 1], stream)
                if err != 0:
                    return (k << 32) | err
            return -1

        _native_launch_timed = launch_timed
    return _native_launch_timed


# -- the runtime: device, context table ---------------------------------------------------------------

class CudaRuntime:
    """Process-wide CUDA state: the device, the field context table, loaded modules."""

    _instance = None
    _lock = threading.Lock()

    def __init__(self):
        from numba import cuda

        from .cuda_compile import cuda_available, install_cuda_ufunc_math_fallbacks

        if not cuda_available():
            raise QuadrantsRuntimeError("the CUDA backend needs an NVIDIA GPU and a CUDA driver; none was found")
        self.cuda = cuda
        self.context = cuda.current_context()
        dev = self.context.device
        self.cc = tuple(dev.compute_capability)
        self.sm_count = int(dev.MULTIPROCESSOR_COUNT)
        # every resident thread of the device: the most a saturating grid-stride launch uses
        self.max_threads = self.sm_count * int(dev.MAX_THREADS_PER_MULTIPROCESSOR)
        install_cuda_ufunc_math_fallbacks()
        self.plan_builds = 0

    @classmethod
    def get(cls) -> CudaRuntime:
        if cls._instance is None:
            with cls._lock:
                if cls._instance is None:
                    cls._instance = CudaRuntime()
        return cls._instance

    def field_table(self, fields):
        """A device table of the data pointers of ``fields`` (a kernel instance's fields, in the
        order of its context slots). Field buffers never move, so the table is written once."""
        for f in fields:
            ensure_device(f)
        host = np.array([f._dev.device_ctypes_pointer.value for f in fields] or [0], np.uint64)
        return self.cuda.to_device(host)

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


# -- device storage of fields and qd.ndarrays --------------------------------------------------------

def ensure_device(data) -> None:
    """Give a field/qd.ndarray its device buffer (from its host data, the first time)."""
    if data._dev is None:
        rt = CudaRuntime.get()
        data._dev = rt.cuda.to_device(np.ascontiguousarray(data._arr))


# -- arguments -------------------------------------------------------------------------------------------

_TORCH_DTYPES = {}


def _torch_dtype(t):
    key = t.dtype
    dt = _TORCH_DTYPES.get(key)
    if dt is None:
        dt = _TORCH_DTYPES[key] = np.dtype(str(key).replace("torch.", ""))
    return dt


class ArrayView:
    """What the launcher needs of an ndarray argument."""

    __slots__ = ("dtype", "shape", "strides", "ptr", "readonly", "host", "keep", "c_contiguous", "spec")

    def __init__(self, dtype, shape, strides, ptr, readonly, host=None, keep=None):
        self.dtype, self.shape, self.strides, self.ptr = dtype, shape, strides, ptr
        self.readonly, self.host, self.keep = readonly, host, keep
        contiguous, step = True, dtype.itemsize
        for n, s in zip(reversed(shape), reversed(strides)):
            if n != 1 and s != step:
                contiguous = False
                break
            step *= n
        self.c_contiguous = contiguous
        self.spec = (dtype.num, dtype.itemsize, len(shape), contiguous, readonly)  # cheap to hash

    @property
    def ndim(self) -> int:
        return len(self.shape)

    @property
    def size(self) -> int:
        n = 1
        for s in self.shape:
            n *= s
        return n


def array_view(a, where: str) -> ArrayView:
    if isinstance(a, Ndarray):  # its buffer never moves: one view per qd.ndarray
        view = a._cuda_view
        if view is None:
            ensure_device(a)
            view = a._cuda_view = array_view(a._dev, where)
        return view
    if isinstance(a, np.ndarray):
        rt = CudaRuntime.get()
        dev = rt.cuda.to_device(np.ascontiguousarray(a))
        return ArrayView(a.dtype, a.shape, dev.strides, int(dev.device_ctypes_pointer.value),
                         not a.flags.writeable, host=a, keep=dev)
    mod = type(a).__module__
    if mod.startswith("torch"):
        if not a.is_cuda:
            raise QuadrantsTypeError(f"{where}: a CPU torch tensor cannot be passed to a CUDA kernel; "
                                     "use .cuda() or a numpy array")
        dt = _torch_dtype(a)
        return ArrayView(dt, tuple(a.shape), tuple(s * dt.itemsize for s in a.stride()), a.data_ptr(), False,
                         keep=a)
    if hasattr(a, "device_ctypes_pointer"):   # numba-cuda DeviceNDArray
        return ArrayView(a.dtype, tuple(a.shape), tuple(a.strides), int(a.device_ctypes_pointer.value or 0), False,
                         keep=a)
    cai = getattr(a, "__cuda_array_interface__", None)
    if cai is not None:
        dt = np.dtype(cai["typestr"])
        shape = tuple(cai["shape"])
        strides = cai.get("strides") or device.c_strides(shape, dt.itemsize)
        ptr, readonly = cai["data"]
        return ArrayView(dt, shape, tuple(strides), int(ptr or 0), bool(readonly), keep=a)
    if hasattr(a, "__array_interface__"):
        raise QuadrantsTypeError(f"{where}: a host array ({type(a).__name__}, through __array_interface__) cannot be "
                                 "passed to a CUDA kernel; pass a numpy array (copied to the GPU and back) or a CUDA "
                                 "array")
    if hasattr(a, "__dlpack__") and hasattr(a, "__dlpack_device__"):
        return _dlpack_view(a, where)
    raise QuadrantsTypeError(f"{where}: expected an ndarray (numpy, qd.ndarray, or a CUDA array: torch, cupy, "
                             f"numba-cuda), got {type(a).__name__}")


# -- DLPack: arrays that offer neither a CUDA array interface nor a numba-cuda view ---------------

class _DLDevice(ctypes.Structure):
    _fields_ = [("device_type", ctypes.c_int32), ("device_id", ctypes.c_int32)]


class _DLDataType(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint8), ("bits", ctypes.c_uint8), ("lanes", ctypes.c_uint16)]


class _DLTensor(ctypes.Structure):
    _fields_ = [("data", ctypes.c_void_p), ("device", _DLDevice), ("ndim", ctypes.c_int32),
                ("dtype", _DLDataType), ("shape", ctypes.POINTER(ctypes.c_int64)),
                ("strides", ctypes.POINTER(ctypes.c_int64)), ("byte_offset", ctypes.c_uint64)]


class _DLManagedTensor(ctypes.Structure):
    pass


_DLManagedTensor._fields_ = [("dl_tensor", _DLTensor), ("manager_ctx", ctypes.c_void_p),
                             ("deleter", ctypes.CFUNCTYPE(None, ctypes.POINTER(_DLManagedTensor)))]

_DL_CUDA, _DL_CUDA_MANAGED = 2, 13
_DL_KINDS = {0: "i", 1: "u", 2: "f", 6: "b"}  # DLPack type codes: int, uint, float, bool


class _DLPackOwner:
    """Holds a consumed DLPack tensor for as long as a view of it is in use, then calls its
    deleter (the producer's storage stays alive until then)."""

    def __init__(self, managed):
        self.managed = managed

    def __del__(self):
        deleter = self.managed.contents.deleter
        if deleter:
            deleter(self.managed)


def _dlpack_view(a, where: str) -> ArrayView:
    """An ArrayView of a CUDA DLPack producer. ``stream=1`` asks the producer to order its
    pending work before the legacy default stream, where qd_numba launches."""
    device_type, _ = a.__dlpack_device__()
    if int(device_type) not in (_DL_CUDA, _DL_CUDA_MANAGED):
        raise QuadrantsTypeError(f"{where}: a DLPack array on device type {int(device_type)} cannot be passed "
                                 "to a CUDA kernel; move it to the GPU or pass a numpy array")
    capsule = a.__dlpack__(stream=1)
    get_pointer = ctypes.pythonapi.PyCapsule_GetPointer
    get_pointer.restype, get_pointer.argtypes = ctypes.c_void_p, [ctypes.py_object, ctypes.c_char_p]
    set_name = ctypes.pythonapi.PyCapsule_SetName
    set_name.restype, set_name.argtypes = ctypes.c_int, [ctypes.py_object, ctypes.c_char_p]
    managed = ctypes.cast(get_pointer(capsule, b"dltensor"), ctypes.POINTER(_DLManagedTensor))
    set_name(capsule, b"used_dltensor")  # we own it now: the capsule must not delete it
    owner = _DLPackOwner(managed)
    t = managed.contents.dl_tensor
    kind = _DL_KINDS.get(t.dtype.code)
    if kind is None or t.dtype.lanes != 1:
        raise QuadrantsTypeError(f"{where}: unsupported DLPack dtype (code {t.dtype.code}, {t.dtype.bits} bits, "
                                 f"{t.dtype.lanes} lanes)")
    dt = np.dtype(f"{kind}{t.dtype.bits // 8}") if kind != "b" else np.dtype(np.bool_)
    shape = tuple(t.shape[k] for k in range(t.ndim))
    strides = tuple(t.strides[k] * dt.itemsize for k in range(t.ndim)) if t.strides else \
        device.c_strides(shape, dt.itemsize)
    return ArrayView(dt, shape, strides, int(t.data or 0) + int(t.byte_offset), False, keep=owner)


def _view_type(where, spec, view):
    """The Numba type of an ndarray argument, through the CPU typing of an equivalent numpy view."""
    stand_in = np.lib.stride_tricks.as_strided(np.zeros(1, view.dtype), shape=view.shape,
                                               strides=[0] * len(view.shape))
    stand_in = np.ascontiguousarray(stand_in) if view.c_contiguous else stand_in
    if view.readonly:
        stand_in = stand_in.view()
        stand_in.flags.writeable = False
    ty = ndarray_type(where, spec, stand_in, config.current.debug)
    if not view.c_contiguous:
        ty = ty.copy(layout="A") if isinstance(ty, types.Array) else ty
    return ty


# -- cells: one ctypes value per kernel parameter slot -------------------------------------------------

_CTYPES = {"b": ctypes.c_int8, "B": ctypes.c_uint8, "h": ctypes.c_int16, "H": ctypes.c_uint16,
           "i": ctypes.c_int32, "I": ctypes.c_uint32, "q": ctypes.c_int64, "Q": ctypes.c_uint64,
           "f": ctypes.c_float, "d": ctypes.c_double, "e": ctypes.c_uint16}


class TaskLaunch:
    """One task of a plan: its function, launch shape and parameter array."""

    __slots__ = ("task", "fn", "module", "argv_array", "argv", "grid", "block", "total_index", "compiled")

    def __init__(self, task, fn, module, argv_array, grid, block, total_index, compiled):
        self.task, self.fn, self.module = task, fn, module
        self.argv_array = argv_array                    # keeps the void*[] alive
        self.argv = ctypes.addressof(argv_array)
        self.grid = grid                                # the saturating grid (1 for serial tasks)
        self.block, self.total_index, self.compiled = block, total_index, compiled


class LaunchPlan:
    """Everything one kernel instance needs to launch: built once, replayed on every call.

    :attr:`run` is Python generated for this plan (see :func:`_runner_source`): straight-line
    code that patches the cells of arguments that changed, updates grids whose iteration
    counts depend on arguments, calls the native launcher once and copies numpy arguments
    back. It takes the kernel's arguments followed by the views of its ndarray arguments.
    """

    def __init__(self, kernel, state, launches, cells, params, totals_fn, static_totals, tmp_dev, field_table,
                 ret):
        self.kernel, self.state, self.launches = kernel, state, launches
        self.cells = cells                  # runtime param name -> list of ctypes cells
        self.params = params                # (name, kind) per kernel parameter, call order
        self.totals_fn = totals_fn
        self.static_totals = static_totals
        self.tmp_dev = tmp_dev
        self.field_table = field_table      # the device table the context parameter points to
        self.ret = ret                      # (byte offset, numpy dtype, element count) or None
        self.tasks = [launch.task for launch in launches]
        self.rt = CudaRuntime.get()
        self.artifact_key = artifact_key(kernel, state.param_types, state.template_values, state.hidden,
                                         state.config, f"cuda-sm{''.join(map(str, self.rt.cc))}")
        # the arguments the host iteration counts read (parsed from the generated source)
        self.totals_args = sorted(set(getattr(totals_fn, "qd_args", ())))
        self.packed = self._pack(self.rt)
        self.launch_all = native_launcher()
        # qd.init(kernel_profiler=True): this plan launches through CUDA events (profiler.py)
        self.timer = profiler.CudaLaunchTimer(kernel.qualname, [t.name for t in self.tasks], native_timed_launcher(),
                                              self.packed[PACK_HEAD + 1::PACK_TASK]) \
            if config.current.kernel_profiler else None
        # debug=True: (launch, device address of its int32 error word) per task that records exceptions
        self.error_words = [(launch, self.rt.global_address(launch.module, launch.compiled.error_symbol))
                            for launch in launches if launch.compiled.error_symbol]
        words = {id(launch): address for launch, address in self.error_words}
        # debug plans compile every task with an error word
        self.error_word_of = [words[id(launch)] for launch in launches] if words else []
        self.run = self._make_runner()

    def _pack(self, rt):
        """The native launcher's array; grids of loops with host-known counts are final."""
        packed = np.zeros(PACK_HEAD + PACK_TASK * len(self.launches), np.int64)
        packed[0] = len(self.launches)
        packed[1] = 0  # the legacy default stream
        for k, launch in enumerate(self.launches):
            grid = launch.grid
            if launch.total_index is not None and self.static_totals is not None:
                total = self.static_totals[launch.total_index]
                if total is not None:
                    grid = _grid(total, launch.block, launch.grid)
            packed[PACK_HEAD + PACK_TASK * k:PACK_HEAD + PACK_TASK * (k + 1)] = (
                int(launch.fn), grid, launch.block, launch.argv)
        return packed

    # -- pieces the generated runner calls ------------------------------------------------------
    def _patch_view(self, name, view, last_key):
        """Write an ndarray argument's cells (meminfo, parent, nitems, itemsize, data, shape,
        strides); returns the new key, skipping the writes when it equals ``last_key``."""
        key = (view.ptr, view.shape, view.strides)
        if key != last_key:
            values = (0, 0, view.size, view.dtype.itemsize, view.ptr, *view.shape, *view.strides)
            for cell, value in zip(self.cells[name], values):
                cell.value = value
        return key

    def _update_grids(self, args):
        totals = self.totals_fn(args)
        packed = self.packed
        for k, launch in enumerate(self.launches):
            if launch.total_index is not None:
                total = totals[launch.total_index]
                if total is not None:
                    packed[PACK_HEAD + PACK_TASK * k + 1] = _grid(total, launch.block, launch.grid)

    def _check_errors(self, args):
        """After a debug launch: raise the first exception a thread of some task recorded (the
        copy waits for the kernels), naming the kernel and the task. Every word is cleared: the
        tasks after a failing one still ran (their own checks keep them in bounds), and what they
        recorded must not surface at the next call."""
        recorded = []
        for launch, address in self.error_words:
            code = self.rt.read_i32(address)
            if code:
                self.rt.write_i32(address, 0)
                recorded.append((launch, code))
        if recorded:
            launch, code = recorded[0]
            cls, exc_args, loc = device_exception(code) or launch.compiled.exception_of(code)
            # numba-cuda's own raises carry their line; qd_numba's bounds checks name the task,
            # whose location is its loop (or serial region)
            line = f"{loc[1]}:{loc[2]}" if loc else launch.task.loc
            where = f" (task {launch.task.name}" + (f", {line}" if line else "") + ")"
            exc = cls(*exc_args) if exc_args else cls()
            err = self.kernel.runtime_error(exc)
            raise type(err)(f"{err}{where}") from None

    def _failed(self, status):
        task = self.launches[status >> 32].task
        _check((_driver().CUresult(status & 0xFFFFFFFF),), f"launching {task.name}")

    def _result(self):
        off, dt, count = self.ret
        raw = self.tmp_dev[off:off + dt.itemsize * count].copy_to_host()
        return read_return(raw, dt, self.kernel.return_type)

    def _make_runner(self):
        src, ns = _runner_source(self)
        exec_generated(src, f"launch {self.kernel.qualname}", ns)
        return ns["make"]()


def return_slot(ty) -> tuple[np.dtype, int]:
    """(numpy dtype, element count) of a kernel's return value of Numba type ``ty`` in its
    temporary slot: a scalar, or a vector's/matrix's elements, row-major."""
    from numba.np.numpy_support import as_dtype

    from ..typing.matrix import MatrixType

    if isinstance(ty, MatrixType):
        return as_dtype(ty.dtype), ty.count
    return as_dtype(ty), 1


def read_return(raw: np.ndarray, dt: np.dtype, return_type):
    """The value a kernel returns from the bytes of its return slot (elements of dtype ``dt``):
    a Python scalar, or a qd.Vector/qd.Matrix of the annotated type, as on the CPU."""
    from ..matrix import from_flat_tuple
    from ..typing.matrix import MatrixType

    values = raw.view(dt)
    if isinstance(return_type, MatrixType):
        return from_flat_tuple(tuple(values[:return_type.count].tolist()), return_type)
    result = values[0].item()
    if isinstance(return_type, types.Integer):
        return int(result)
    if isinstance(return_type, types.Float):
        return float(result)
    if isinstance(return_type, types.Boolean):
        return bool(result)
    return result


def _copy_back(view):
    """Write a numpy argument's device copy back into it (a strided view through a temporary)."""
    if view.readonly:
        return
    if view.host.flags.c_contiguous:
        view.keep.copy_to_host(view.host)
    else:
        view.host[...] = view.keep.copy_to_host()


_UNSET = object()


def _tuple_src(items) -> str:
    """Source of a tuple display of these expressions."""
    return f"({', '.join(items)}{',' if len(items) == 1 else ''})"


def _runner_source(plan):
    """Source of ``make() -> run(*args, *ndarray views)`` for one plan, and its namespace.

    Per argument only what its kind needs: a scalar writes its cell; an ndarray re-patches
    its cells when its view is not the one of the last call (qd.ndarray views are cached, so
    identity is enough) and is copied back when it is a numpy array. Iteration counts are
    recomputed when an argument they read changed: a different qd.ndarray object (their
    shapes never change) or scalar, or any other array kind (no cheap key)."""
    params = plan.params
    args = [f"a{i}" for i in range(len(params))]
    views = {i: f"v{i}" for i, (_, kind) in enumerate(params) if kind == "ndarray"}
    ns = {"plan": plan, "rt": plan.rt, "launch_all": plan.launch_all, "packed": plan.packed,
          "Ndarray": Ndarray, "copy_back": _copy_back, "UNSET": _UNSET}
    state, body = [], []
    for i, (name, kind) in enumerate(params):
        if kind == "template" or name not in plan.cells:
            continue
        if kind == "scalar":
            (cell,) = plan.cells[name]
            ns[f"c{i}"] = cell
            body.append(f"c{i}.value = a{i}")
        elif kind == "matrix":  # a qd.Vector/Matrix (see CudaKernel): one cell per element
            ns[f"c{i}"] = tuple(plan.cells[name])
            body += [f"for cell, x in zip(c{i}, a{i}.entries.reshape(-1).tolist()):",
                     "    cell.value = x"]
        else:
            ns[f"n{i}"] = name
            state += [f"last{i} = None", f"key{i} = None"]
            body += [f"if v{i} is not last{i}:",
                     f"    last{i} = v{i}",
                     f"    key{i} = plan._patch_view(n{i}, v{i}, key{i})"]
    if plan.totals_fn is not None:
        changed = []
        for i in plan.totals_args:
            state.append(f"t{i} = UNSET")
            kind = params[i][1]
            changed.append(f"type(a{i}) is not Ndarray or a{i} is not t{i}" if kind == "ndarray"
                           else "True" if kind == "matrix"  # a qd.Vector may have changed in place
                           else f"a{i} != t{i}")
        tracked = [f"t{i}" for i in plan.totals_args]
        body += [f"if {' or '.join(changed)}:" if changed else "if True:",
                 *(f"    {t} = a{i}" for t, i in zip(tracked, plan.totals_args)),
                 # ndarrays as their views: every array kind (DLPack producers too) has .shape there
                 f"    plan._update_grids({_tuple_src([views.get(i, a) for i, a in enumerate(args)])})"]
    ns["timer"] = plan.timer
    if plan.error_words:   # debug: one task at a time, stopping at the first that records an error
        ns["launch_task"], ns["error_word_of"] = native_task_launcher(), plan.error_word_of
        body += [f"for k in range({len(plan.launches)}):",
                 "    status = launch_task(packed, k)",
                 "    if status >= 0:",
                 "        plan._failed(status)",
                 "    if rt.read_i32(error_word_of[k]):",
                 "        break"]
    else:
        body += ["status = launch_all(packed)" if plan.timer is None else "status = timer.launch(packed)",
                 "if status >= 0:",
                 "    plan._failed(status)"]
    # numpy arguments get what the tasks wrote before an error is raised, as on the CPU
    for v in views.values():
        body.append(f"if {v}.host is not None: copy_back({v})")
    if plan.error_words:
        body.append(f"plan._check_errors({_tuple_src(args)})")
    body.append("return plan._result()" if plan.ret is not None else "return None")
    names = [s.split(" = ")[0] for s in state]
    lines = ["def make():", *(f"    {s}" for s in state),
             f"    def run({', '.join(args + list(views.values()))}):",
             *([f"        nonlocal {', '.join(names)}"] if names else []),
             *(f"        {line}" for line in body),
             "    return run"]
    return "\n".join(lines) + "\n", ns


def _grid(total: int, block: int, max_grid: int) -> int:
    """Blocks for ``total`` iterations: one per ``block`` up to the saturating grid (the kernels
    are grid-stride loops); 0 (no launch) for an empty loop."""
    return min(-(-total // block), max_grid) if total > 0 else 0


class CudaTarget(Target):
    arch = "cuda"
    codegen_stages = CODEGEN_STAGES

    def kernel_backend(self, kernel) -> CudaKernel:
        return CudaKernel(kernel)

    def place(self, data) -> None:
        ensure_device(data)

    def synchronize(self) -> None:
        CudaRuntime.get().cuda.synchronize()


class CudaKernel(KernelBackend):
    """The CUDA side of one ``@qd.kernel``: its launch plans, per argument spec."""

    arch = "cuda"

    def __init__(self, kernel):
        self.kernel = kernel
        self.plans = {}
        self.lock = threading.RLock()
        self._where = [argument_where(kernel, p) for p in kernel.params]
        for p in kernel.params:
            if p.kind == "scalar":
                p.exact_types = INT_TYPES if isinstance(p.nbtype, types.Integer) else NUMBER_TYPES
        self.caller = self._make_launcher()

    # -- the call path ---------------------------------------------------------------------------
    def make_caller(self):
        """The kernel's ``__call__`` on CUDA: the kernel's parameters (Kernel.caller_prologue),
        then the launcher's generated ``caller``."""
        ns = {"caller": self.caller}
        lines, names = self.kernel.caller_prologue(ns)
        lines.append(f"    return caller({', '.join(names)})")
        exec_generated("\n".join(lines) + "\n", f"call {self.kernel.qualname}", ns)
        return ns["__call__"]

    def call(self, *args):
        return self.caller(*args)

    def tasks(self, args) -> list:
        return list(self.plan_for(args).tasks)

    def _make_launcher(self):
        """Generate this kernel's call path, ``caller(*args)``: views and spec key of the
        arguments, the plan lookup, then the plan's runner (:func:`_runner_source`). Scalars of
        an exact Python or numpy type pass without a check; anything else is validated.
        ``plan_for(args)`` shares the source up to the lookup."""
        params = self.kernel.params
        args = [f"a{i}" for i in range(len(params))]
        ns = {"Ndarray": Ndarray, "array_view": array_view, "template_key": template_key,
              "plans": self.plans, "build": self._plan, "check_scalar": _check_scalar,
              "check_matrix": _check_matrix,
              "kernel": self.kernel}
        body, key, views = [], [], []
        for i, p in enumerate(params):
            if p.kind == "ndarray":
                ns[f"w{i}"] = self._where[i]
                body += [f"v{i} = a{i}._cuda_view if type(a{i}) is Ndarray else None",
                         f"if v{i} is None: v{i} = array_view(a{i}, w{i})"]
                key.append(f"v{i}.spec")
                views.append(f"v{i}")
            elif p.kind == "template":
                key.append(f"template_key(a{i})")
            elif p.kind == "matrix":
                ns[f"p{i}"] = p
                body.append(f"a{i} = check_matrix(kernel, p{i}, a{i})")
            else:
                ns[f"ok{i}"], ns[f"p{i}"] = p.exact_types, p
                body.append(f"if type(a{i}) not in ok{i}: check_scalar(kernel, p{i}, a{i})")
        body += [f"plan = plans.get({_tuple_src(key)})",
                 f"if plan is None: plan = build({_tuple_src(args)}, {_tuple_src(views)}, {_tuple_src(key)})"]
        src = "\n".join([f"def call({', '.join(args)}):", *(f"    {line}" for line in body),
                         f"    return plan.run({', '.join(args + views)})",
                         f"def plan_for({', '.join(args)}):", *(f"    {line}" for line in body),
                         "    return plan"]) + "\n"
        exec_generated(src, f"cuda call {self.kernel.qualname}", ns)
        self._plan_for = ns["plan_for"]
        return ns["call"]

    def plan_for(self, args):
        """The launch plan these arguments select (built if needed), without launching."""
        return self._plan_for(*args)

    def _plan(self, args, view_list, key):
        with self.lock:  # one build per spec, also when threads race for it
            plan = self.plans.get(key)
            if plan is None:
                names = [p.name for p in self.kernel.params if p.kind == "ndarray"]
                plan = self.plans[key] = self._build(args, dict(zip(names, view_list)))
        return plan

    # -- building a plan ------------------------------------------------------------------------
    def _build(self, args, views):
        kernel = self.kernel
        param_types, templates = plan_types(kernel, args, views)
        try:
            with profiler.compiling(kernel.qualname, "cuda"):
                return build_plan(kernel, param_types, templates)
        except Exception as e:
            err = compile_error(kernel.name, e, param_types, config.current.raw_errors)
            if err is None:
                raise
            raise err from None


def _check_scalar(kernel, p, a):
    """A scalar argument whose type is not one of the exact types the fast path takes."""
    where = argument_where(kernel, p)
    check_scalar(where, p, a)
    raise QuadrantsTypeError(f"{where}: expected a {p.nbtype} scalar, got {type(a).__name__}")


def _check_matrix(kernel, p, a):
    """A vector/matrix argument as a qd.Vector/qd.Matrix of its parameter's type."""
    from ..matrix import matrix_argument

    try:
        return matrix_argument(a, p.nbtype)
    except QuadrantsTypeError as e:
        raise QuadrantsTypeError(f"kernel '{kernel.name}', argument '{p.name}': {e}") from None


def field_token(field):
    from ..field import Ndarray
    from ..typing.field import FieldType

    fty = FieldType(field.dtype, len(field.shape), field.elem_type, "C", checked=config.current.debug,
                    kind="field" if not isinstance(field, Ndarray) else "ndarray")
    return device.TypeToken(fty, tuple(field.shape) + tuple(field.element_shape))


def compile_state(kernel, param_types, templates):
    """Run the untyped pipeline on numba-cuda's IR classes."""
    from ..passes.base import CompileState, IRTools, copy_ir
    from ..passes.pipeline import run_untyped_pipeline

    tools = IRTools.for_cuda()
    runtime_params = [p.name for p in kernel.params if p.kind != "template"]
    cfg = config.current.for_kernel(fuse=kernel.fuse, graph=kernel.graph)
    with profiler.stage("frontend"):
        func_ir = copy_ir(tools.ir, kernel.frontend_ir(tools))
    state = CompileState(tools=tools, func_ir=func_ir, kernel_name=kernel.name,
                         config=cfg, runtime_params=runtime_params, param_types=param_types,
                         template_values=templates, kernel_qualname=kernel.qualname,
                         returns_value=kernel.return_type is not None, random_state=runtime.random_state)
    take_pending()
    with profiler.stage("untyped passes"):
        run_untyped_pipeline(state, codegen_stages=CODEGEN_STAGES)
    return state


def compile_tasks(kernel, state, cc, field_slot):
    """Compile every task kernel to a cubin, in program order. Returns (plan_ir, [(unit, compiled)])."""
    from .cuda_compile import compile_task_to_cubin

    plan_ir = state.task_plan
    temp_types, out = {}, []
    debug = config.current.debug
    for unit in plan_ir.units:
        with profiler.stage("task split"):
            tk = cuda_tasks.build_task_ir(state, unit, temp_types, field_slot, field_token, plan_ir.ret_slot)
        if config.current.print_ir:
            import sys

            print(f"=== qd_numba CUDA task {unit.task.name} ===", file=sys.stderr)
            tk.func_ir.dump()
        argtypes = [types.uint64, types.uint64] + [state.param_types[n] for n in tk.runtime_args]
        compiled = compile_task_to_cubin(tk.func_ir, argtypes, cc=cc, debug=False, lineinfo=debug, exceptions=debug)
        typemap = compiled.typemap or {}
        for name in unit.stores:
            temp_types[name] = _lookup_type(typemap, name, unit.task)
        if unit.ret_var is not None:
            temp_types["$qd_return"] = _lookup_type(typemap, unit.ret_var, unit.task)
        out.append((unit, tk, compiled))
    return plan_ir, out, temp_types


def kernel_field_slots(state):
    """``field -> context slot`` of one kernel instance: the field's position among the fields
    the kernel uses (``state.hidden``, in order of first reference), so compiled code depends on
    the kernel alone, never on how many fields the process created before (relocatable)."""
    slots = {id(f): k for k, f in enumerate(state.hidden)}
    return lambda field: slots[id(field)]


def compile_check(kernel, param_types, templates, cc=(9, 0)):
    """Compile every task of this kernel instance for CUDA down to cubins, without a GPU.

    Fields get placeholder context slots (no device memory is touched). Returns the compiled
    tasks; raises what a real CUDA compile would raise."""
    with profiler.compiling(kernel.qualname, "cuda (compile check)"):
        state = compile_state(kernel, param_types, templates)
        _, compiled, _ = compile_tasks(kernel, state, cc, kernel_field_slots(state))
        host_totals(kernel, state, param_types, [u for u, _, _ in compiled])  # the launcher's host code too
    return compiled


def host_totals(kernel, state, param_types, units):
    """(totals function taking the kernel's arguments or None, iteration counts known now or None)."""
    param_ndims = {name: getattr(ty, "ndim", None) for name, ty in param_types.items()}
    runtime_positions = [i for i, p in enumerate(kernel.params) if p.kind != "template"]
    src, env = cuda_tasks.totals_source(state, units, param_ndims, runtime_positions)
    if src is None:
        return None, None
    ns = dict(env)
    exec_generated(src, f"totals {kernel.qualname}", ns)
    fn = ns["totals"]
    if "args[" in src:
        fn.qd_args = tuple(int(k) for k in re.findall(r"args\[(\d+)\]", src))
        return fn, None
    return None, fn(())


def _lookup_type(typemap, name, task):
    if name in typemap:
        return types.unliteral(typemap[name])
    versions = [t for n, t in typemap.items() if n.split(".")[0] == name]
    if versions:
        return types.unliteral(versions[-1])
    raise QuadrantsRuntimeError(f"internal error: no type for '{name}' in {task.name}")


def plan_types(kernel, args, views):
    """(runtime parameter name -> Numba type, template name -> value) of a call's arguments."""
    param_types, templates = {}, {}
    for p, a in zip(kernel.params, args):
        where = f"kernel '{kernel.name}', argument '{p.name}'"
        if p.kind == "template":
            templates[p.name] = a
        elif p.kind in ("scalar", "matrix"):
            param_types[p.name] = p.nbtype
        else:
            param_types[p.name] = _view_type(where, p.annotation, views[p.name])
    return param_types, templates


def build_plan(kernel, param_types, templates) -> LaunchPlan:
    rt = CudaRuntime.get()
    state = compile_state(kernel, param_types, templates)
    plan_ir, compiled, temp_types = compile_tasks(kernel, state, rt.cc, kernel_field_slots(state))
    rt.plan_builds += 1
    kernel.compile_count += 1

    field_table = rt.field_table(state.hidden)
    cells = {cuda_tasks.PARAM_CTX: [ctypes.c_uint64(int(field_table.device_ctypes_pointer.value))]}
    tmp_bytes = max(1, plan_ir.temp_slots) * device.TEMP_SLOT_BYTES
    tmp_dev = rt.cuda.device_array(tmp_bytes, np.uint8)
    cells[cuda_tasks.PARAM_TMP] = [ctypes.c_uint64(int(tmp_dev.device_ctypes_pointer.value))]
    for _, tk, c in compiled:
        for name in tk.runtime_args:
            if name not in cells:  # same Numba type in every task -> same slots
                cells[name] = [_CTYPES[s.fmt]() for s in c.param_layout if s.arg_name == name]
    launches = []
    range_index = 0
    for unit, tk, c in compiled:
        with profiler.stage("module load"):
            module, fn = rt.load_function(c.cubin, c.entry_name)
        order = [cuda_tasks.PARAM_CTX, cuda_tasks.PARAM_TMP] + tk.runtime_args
        ptrs = [ctypes.addressof(cell) for name in order for cell in cells[name]]
        argv = (ctypes.c_void_p * max(1, len(ptrs)))(*ptrs)
        if unit.kind == "range_for" and not unit.task.serialize:
            (grid, block), total_index = rt.occupancy(fn), range_index
        else:
            grid, block, total_index = 1, 1, None
        if unit.kind == "range_for":
            range_index += 1
        launches.append(TaskLaunch(unit.task, fn, module, argv, grid, block, total_index, c))
    # iteration counts on the host
    totals_fn, static_totals = host_totals(kernel, state, param_types, [u for u, _, _ in compiled])
    ret = None
    if plan_ir.ret_slot is not None:
        ret = (plan_ir.ret_slot * device.TEMP_SLOT_BYTES, *return_slot(temp_types["$qd_return"]))
    params = [(p.name, p.kind) for p in kernel.params]
    return LaunchPlan(kernel, state, launches, cells, params, totals_fn, static_totals, tmp_dev, field_table, ret)
