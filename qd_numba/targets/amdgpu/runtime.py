"""HIP through hip-python: what ``qd.init(arch=qd.amdgpu)`` checks, the device, memory, modules,
pre-packed launches, streams and events.

hip-python (``pip install hip-python``, the release matching the ROCm install) is imported
lazily: importing this module never fails. Every call returns hip-python's ``(hipError_t,
*results)`` tuple; :func:`_check` turns an error into our QuadrantsRuntimeError naming the call.
Launches use ``hipModuleLaunchKernel`` with a ``void*[]`` of ctypes cells built once per plan
(kernel.py), as the CUDA target's ``cuLaunchKernel`` does. The runtime is also the kernel
profiler's event API (profiler.py ``GpuEventPool``: timing events, their elapsed times).
"""

from __future__ import annotations

import ctypes
import os
import threading

import numpy as np

from ... import config, profiler
from ...errors import QuadrantsRuntimeError

_HIP_LIBRARIES = ("libamdhip64.so", "libamdhip64.so.7", "libamdhip64.so.6")


def _hip_library_loads() -> bool:
    """True when ROCm's HIP runtime (libamdhip64) can be loaded: by the loader's search path or
    from the ROCm installation (``ROCM_PATH``, /opt/rocm)."""
    candidates = list(_HIP_LIBRARIES) + [os.path.join(config.rocm_root(), "lib", n) for n in _HIP_LIBRARIES]
    for name in candidates:
        try:
            ctypes.CDLL(name)
            return True
        except OSError:
            continue
    return False


def _hip_python():
    """hip-python's ``hip`` module, or None when it does not import."""
    try:
        from hip import hip
    except Exception:   # ImportError, or its loader failing on a broken ROCm install
        return None
    return hip


def missing() -> list[str]:
    """What running kernels on an AMD GPU needs and this machine lacks, in words (empty: nothing)."""
    out = []
    if not _hip_library_loads():
        out.append("libamdhip64 (ROCm's HIP runtime: install ROCm, or set ROCM_PATH to it)")
    hip = _hip_python()
    if hip is None:
        out.append("hip-python (pip install hip-python, the release matching the ROCm install)")
    if not out:
        result = hip.hipGetDeviceCount()
        if result[0] != hip.hipError_t.hipSuccess or result[1] < 1:
            out.append("an AMD GPU (HIP sees no device)")
    return out


def _check(result, what: str):
    """The results of a hip-python call (one value, a tuple of several, or None), or our error."""
    hip = _hip_python()
    err, *values = result if isinstance(result, tuple) else (result,)
    if err != hip.hipError_t.hipSuccess:
        name = hip.hipGetErrorString(err)
        raise QuadrantsRuntimeError(f"{what} failed: {name.decode() if isinstance(name, bytes) else name}")
    if not values:
        return None
    return values[0] if len(values) == 1 else tuple(values)


class HipArray:
    """A device buffer of HIP memory shaped as a numpy array: the storage of fields and
    ``qd.ndarray``s on ``qd.amdgpu`` (the methods field.py calls on a CUDA device array), with
    ``__cuda_array_interface__`` (which HIP builds of cupy and torch read) for interop."""

    def __init__(self, shape, dtype, address=None, owner=None):
        self.shape, self.dtype = tuple(shape), np.dtype(dtype)
        self.size = int(np.prod(self.shape, dtype=np.int64))
        self.nbytes = self.size * self.dtype.itemsize
        rt = HipRuntime.get()
        if address is None:
            self.address = int(_check(rt.hip.hipMalloc(max(1, self.nbytes)), "hipMalloc"))
            self._owner = None
        else:
            self.address, self._owner = int(address), owner

    def __del__(self):
        if getattr(self, "_owner", True) is None and HipRuntime._instance is not None:
            HipRuntime._instance.hip.hipFree(self.address)

    def copy_to_host(self, out=None) -> np.ndarray:
        """The buffer's data in a new host array, or in ``out`` (a C-contiguous array of as many bytes)."""
        out = np.empty(self.shape, self.dtype) if out is None else out
        rt = HipRuntime.get()
        _check(rt.hip.hipMemcpyDtoH(out, self.address, self.nbytes), "hipMemcpyDtoH")
        return out

    def copy(self) -> HipArray:
        """A new buffer holding this one's data (a device-to-device copy, ordered on the null
        stream like every copy here)."""
        out = HipArray(self.shape, self.dtype)
        _check(HipRuntime.get().hip.hipMemcpyDtoD(out.address, self.address, self.nbytes), "hipMemcpyDtoD")
        return out

    def copy_to_device(self, array) -> None:
        host = np.ascontiguousarray(array, dtype=self.dtype)
        rt = HipRuntime.get()
        _check(rt.hip.hipMemcpyHtoD(self.address, host, self.nbytes), "hipMemcpyHtoD")

    def __getitem__(self, index):
        """A contiguous C-order sub-block (what python-scope ``x[i]`` reads and writes)."""
        index = index if isinstance(index, tuple) else (index,)
        offset, shape = 0, []
        strides = np.cumprod((1,) + self.shape[:0:-1])[::-1]
        for k, i in enumerate(index):
            if isinstance(i, slice):
                start, stop, _ = i.indices(self.shape[k])
                offset += start * int(strides[k])
                shape.append(stop - start)
            else:
                offset += int(i) * int(strides[k])
        shape += self.shape[len(index):]
        return HipArray(shape, self.dtype, self.address + offset * self.dtype.itemsize, owner=self)

    @property
    def __cuda_array_interface__(self):
        return {"shape": self.shape, "typestr": self.dtype.str, "data": (self.address, False), "strides": None,
                "version": 3, "stream": None}


class HipRuntime:
    """Process-wide HIP state: the device, loaded modules, streams and events."""

    _instance = None
    _lock = threading.Lock()

    def __init__(self):
        lacking = missing()
        if lacking:
            raise QuadrantsRuntimeError("qd.init(arch=amdgpu): this machine lacks " + "; ".join(lacking))
        self.hip = hip = _hip_python()
        _check(hip.hipInit(0), "hipInit")
        self.device_id = 0
        _check(hip.hipSetDevice(self.device_id), "hipSetDevice")
        props = hip.hipDeviceProp_t()
        _check(hip.hipGetDeviceProperties(props, 0), "hipGetDeviceProperties")
        name = props.gcnArchName
        self.arch = (name.decode() if isinstance(name, bytes) else str(name)).split(":")[0]
        self.cu_count = int(props.multiProcessorCount)
        self.max_threads = self.cu_count * int(props.maxThreadsPerMultiProcessor)
        self.plan_builds = 0
        self._own_streams: set[int] = set()     # the blocking streams stream_create made
        self._pool: list[int] = []               # stream_parallel()'s non-blocking streams
        self._fence_event = None
        self._fence_lock = threading.Lock()
        self._timing = None                      # the kernel profiler's timing events

    @classmethod
    def get(cls) -> HipRuntime:
        if cls._instance is None:
            with cls._lock:
                if cls._instance is None:
                    cls._instance = HipRuntime()
        return cls._instance

    def synchronize(self) -> None:
        _check(self.hip.hipDeviceSynchronize(), "hipDeviceSynchronize")

    # -- modules and launches ----------------------------------------------------------------------------
    def load_function(self, code_object: bytes, entry: str):
        module = _check(self.hip.hipModuleLoadData(code_object), "hipModuleLoadData")
        fn = _check(self.hip.hipModuleGetFunction(module, entry.encode()), "hipModuleGetFunction")
        return module, fn

    def global_address(self, module, symbol: str) -> int:
        address, _size = _check(self.hip.hipModuleGetGlobal(module, symbol.encode()), "hipModuleGetGlobal")
        return int(address)

    def occupancy(self, fn) -> tuple[int, int]:
        """(saturating grid, block size) of ``fn`` from HIP's occupancy calculator."""
        _grid, block = _check(self.hip.hipModuleOccupancyMaxPotentialBlockSize(fn, 0, 0),
                              "hipModuleOccupancyMaxPotentialBlockSize")
        block = max(64, int(block))
        return max(1, self.max_threads // block), block

    def launch(self, fn, grid: int, block: int, stream: int, argv_address: int) -> None:
        """``hipModuleLaunchKernel`` with a pre-packed ``void*[]`` of parameter cells."""
        _check(self.hip.hipModuleLaunchKernel(fn, grid, 1, 1, block, 1, 1, 0, stream or None, argv_address, None),
               "hipModuleLaunchKernel")

    # -- memory ---------------------------------------------------------------------------------------------
    def read_i32(self, address: int) -> int:
        out = np.zeros(1, np.int32)
        _check(self.hip.hipMemcpyDtoH(out, address, 4), "hipMemcpyDtoH")
        return int(out[0])

    def write_i32(self, address: int, value: int) -> None:
        _check(self.hip.hipMemcpyHtoD(address, np.array([value], np.int32), 4), "hipMemcpyHtoD")

    def field_table(self, fields) -> HipArray:
        """A device table of the data addresses of a kernel instance's fields (context slots)."""
        for f in fields:
            f.claim()
            ensure_device(f)
        table = HipArray((max(1, len(fields)),), np.uint64)
        table.copy_to_device(np.array([f._dev.address for f in fields] or [0], np.uint64))
        return table

    # -- streams and events (handles are ints; streams.py, stream_parallel) -----------------------------------
    def stream_create(self) -> int:
        """A blocking stream (ordered with the null stream, where qd_numba's copies run)."""
        handle = int(_check(self.hip.hipStreamCreate(), "hipStreamCreate"))
        self._own_streams.add(handle)
        return handle

    def stream_destroy(self, handle: int) -> None:
        self._own_streams.discard(handle)
        _check(self.hip.hipStreamDestroy(handle), "hipStreamDestroy")

    def stream_nonblocking(self, handle: int) -> bool:
        """Whether stream ``handle`` runs unordered with the null stream (created non-blocking,
        as torch's pool streams are); streams :meth:`stream_create` made are ordered with it."""
        if handle in self._own_streams:
            return False
        flags = _check(self.hip.hipStreamGetFlags(handle), "hipStreamGetFlags")
        return bool(int(flags) & int(self.hip.hipStreamNonBlocking))

    def fence(self, before: int, after: int) -> None:
        """Order the work queued later on stream ``after`` behind the work queued so far on stream
        ``before`` (one event, no host wait: a wait takes the event's state when it is queued)."""
        with self._fence_lock:
            if self._fence_event is None:
                self._fence_event = self.event_create()
            self.event_record(self._fence_event, before)
            self.stream_wait_event(after, self._fence_event)

    def pool_streams(self, count: int) -> list[int]:
        """The first ``count`` non-blocking streams of stream_parallel()'s pool (created once, on
        first need, and shared by every plan)."""
        with self._fence_lock:
            while len(self._pool) < count:
                self._pool.append(int(_check(self.hip.hipStreamCreateWithFlags(self.hip.hipStreamNonBlocking),
                                             "hipStreamCreateWithFlags(stream pool)")))
        return self._pool[:count]

    def stream_synchronize(self, handle: int) -> None:
        _check(self.hip.hipStreamSynchronize(handle), "hipStreamSynchronize")

    def event_create(self) -> int:
        return int(_check(self.hip.hipEventCreateWithFlags(self.hip.hipEventDisableTiming), "hipEventCreate"))

    def timing_event_create(self) -> int:
        """An event that records a timestamp (hipEventCreate: without hipEventDisableTiming)."""
        return int(_check(self.hip.hipEventCreate(), "hipEventCreate"))

    def event_elapsed_ms(self, start: int, end: int) -> float:
        """Milliseconds between two recorded timing events (both complete)."""
        return float(_check(self.hip.hipEventElapsedTime(start, end), "hipEventElapsedTime"))

    def timing_events(self) -> profiler.GpuEventPool:
        """The kernel profiler's pool of timing events on this device (made on first need)."""
        with self._fence_lock:
            if self._timing is None:
                self._timing = profiler.GpuEventPool(self)
        return self._timing

    def event_destroy(self, handle: int) -> None:
        _check(self.hip.hipEventDestroy(handle), "hipEventDestroy")

    def event_record(self, event: int, stream: int) -> None:
        _check(self.hip.hipEventRecord(event, stream or None), "hipEventRecord")

    def stream_wait_event(self, stream: int, event: int) -> None:
        _check(self.hip.hipStreamWaitEvent(stream or None, event, 0), "hipStreamWaitEvent")

    def event_synchronize(self, event: int) -> None:
        _check(self.hip.hipEventSynchronize(event), "hipEventSynchronize")


def ensure_device(data) -> None:
    """Give a field/qd.ndarray/SNode tree (snode.py ``Tree``) its HIP buffer (from its host data,
    the first time). A field of an SNode tree is a view of its tree's buffer (:func:`tree_views`),
    as on CUDA."""
    tree = getattr(data, "_tree", None)
    if tree is not None:
        tree.place_on("amdgpu")
        return
    if not isinstance(data._dev, HipArray):
        dev = HipArray(data._arr.shape, data._arr.dtype)
        dev.copy_to_device(data._arr)
        data._dev = dev
        if getattr(data, "_fields", None) is not None:     # a tree: its fields' views
            tree_views(data)


def tree_views(tree) -> None:
    """Give each field of an SNode tree (its ``_dev`` a HipArray of the tree's bytes) a HipArray
    starting at the field's byte offset: the address its context slot holds. Its strides are
    compile-time constants of the kernels (lowering/device.py); python scope reads and writes the
    whole tree (``Tree.pull``/``push``)."""
    start = tree.base.ctypes.data
    for f in tree._fields:
        f._dev = HipArray(f._arr.shape, f._arr.dtype, tree._dev.address + (f._arr.ctypes.data - start), owner=tree._dev)
