"""HIP through hip-python: what ``qd.init(arch=qd.amdgpu)`` checks, the device, memory, modules,
pre-packed launches, streams and events.

hip-python (``pip install hip-python``, the release matching the ROCm install) is imported
lazily: importing this module never fails. Every call returns hip-python's ``(hipError_t,
*results)`` tuple; :func:`_check` turns an error into our QuadrantsRuntimeError naming the call.
Launches use ``hipModuleLaunchKernel`` with a ``void*[]`` of ctypes cells built once per plan
(kernel.py), as the CUDA target's ``cuLaunchKernel`` does.
"""

from __future__ import annotations

import ctypes
import os
import threading

import numpy as np

from ... import config
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

    def copy_to_host(self) -> np.ndarray:
        out = np.empty(self.shape, self.dtype)
        rt = HipRuntime.get()
        _check(rt.hip.hipMemcpyDtoH(out, self.address, self.nbytes), "hipMemcpyDtoH")
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
        _check(hip.hipSetDevice(0), "hipSetDevice")
        props = hip.hipDeviceProp_t()
        _check(hip.hipGetDeviceProperties(props, 0), "hipGetDeviceProperties")
        name = props.gcnArchName
        self.arch = (name.decode() if isinstance(name, bytes) else str(name)).split(":")[0]
        self.cu_count = int(props.multiProcessorCount)
        self.max_threads = self.cu_count * int(props.maxThreadsPerMultiProcessor)
        self.plan_builds = 0

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

    # -- streams and events (handles are ints) ------------------------------------------------------------
    def stream_create(self) -> int:
        return int(_check(self.hip.hipStreamCreate(), "hipStreamCreate"))

    def stream_destroy(self, handle: int) -> None:
        _check(self.hip.hipStreamDestroy(handle), "hipStreamDestroy")

    def stream_synchronize(self, handle: int) -> None:
        _check(self.hip.hipStreamSynchronize(handle), "hipStreamSynchronize")

    def event_create(self) -> int:
        return int(_check(self.hip.hipEventCreateWithFlags(self.hip.hipEventDisableTiming), "hipEventCreate"))

    def event_destroy(self, handle: int) -> None:
        _check(self.hip.hipEventDestroy(handle), "hipEventDestroy")

    def event_record(self, event: int, stream: int) -> None:
        _check(self.hip.hipEventRecord(event, stream or None), "hipEventRecord")

    def stream_wait_event(self, stream: int, event: int) -> None:
        _check(self.hip.hipStreamWaitEvent(stream or None, event, 0), "hipStreamWaitEvent")

    def event_synchronize(self, event: int) -> None:
        _check(self.hip.hipEventSynchronize(event), "hipEventSynchronize")


def ensure_device(data) -> None:
    """Give a field/qd.ndarray its HIP buffer (from its host data, the first time). Fields of an
    SNode tree (``qd.root.dense(...).place(...)``) are refused: their tree has no HIP storage yet."""
    if getattr(data, "_tree", None) is not None:
        raise QuadrantsRuntimeError(f"field {getattr(data, 'name', '') or ''!r} is placed in an SNode tree; SNode "
                                    "trees are not supported on qd.amdgpu yet (docs/amdgpu.md)")
    if not isinstance(data._dev, HipArray):
        dev = HipArray(data._arr.shape, data._arr.dtype)
        dev.copy_to_device(data._arr)
        data._dev = dev
