"""The CUDA runtime: the driver, the device, and the native launchers.

``_driver``/``_check`` wrap ``cuda.bindings.driver`` calls (a failure becomes a
QuadrantsRuntimeError). The packed-launch layout (``PACK_HEAD``, ``PACK_TASK``) is the int64 array
a plan hands to the Numba-compiled launchers (:func:`native_launcher`, :func:`native_task_launcher`,
:func:`native_timed_launcher`), which call ``cuLaunchKernel`` once per task in one
Python-to-native transition. :class:`CudaRuntime` is the process-wide state (device, occupancy,
module loading, field tables); :func:`ensure_device` gives a field or qd.ndarray its device buffer.

This module never compiles kernels and never looks at kernel arguments (arrays.py, plan.py).
"""

from __future__ import annotations

import ctypes
import threading

import numpy as np

from ...errors import QuadrantsRuntimeError

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


def cu_launch_kernel():
    """The driver's ``cuLaunchKernel`` through ctypes, callable from Numba-compiled code:
    pointers pass as 64-bit integers (same registers in the x86-64/aarch64 C ABIs)."""
    launch = ctypes.CDLL("libcuda.so.1").cuLaunchKernel
    launch.argtypes = [ctypes.c_uint64] + [ctypes.c_uint32] * 7 + [ctypes.c_uint64] * 3
    launch.restype = ctypes.c_int32
    return launch


def native_launcher():
    """``launch_all(packed) -> status``: a Numba-compiled loop calling the driver's
    ``cuLaunchKernel`` through ctypes for every task with a positive grid. One
    Python-to-native transition, with one array argument, per kernel call. The status is -1,
    or ``task index << 32 | CUresult`` of the first failure."""
    global _native_launch_all
    if _native_launch_all is None:
        import numba

        launch = cu_launch_kernel()

        @numba.njit(nogil=True)
        def launch_task(packed, k):
            base = PACK_HEAD + PACK_TASK * k
            grid = packed[base + 1]
            if grid > 0:
                err = launch(packed[base], grid, 1, 1, packed[base + 2], 1, 1, 0, packed[1], packed[base + 3], 0)
                if err != 0:
                    return (k << 32) | err
            return -1

        @numba.njit(nogil=True)
        def launch_all(packed):   # the hot path: launch_task's body inlined by hand, the stream read once
            stream = packed[1]
            for k in range(packed[0]):
                base = PACK_HEAD + PACK_TASK * k
                grid = packed[base + 1]
                if grid > 0:
                    err = launch(packed[base], grid, 1, 1, packed[base + 2], 1, 1, 0, stream, packed[base + 3], 0)
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
        launch = cu_launch_kernel()
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

        from .compile import cuda_available, install_cuda_ufunc_math_fallbacks

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

    def device_words(self, count: int):
        """A device buffer of ``count`` int64 words and its address (adstack heaps)."""
        buf = self.cuda.device_array(count, np.int64)
        return buf, int(buf.device_ctypes_pointer.value)

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
