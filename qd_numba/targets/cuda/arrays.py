"""Kernel arguments on the CUDA target: every accepted array kind as an :class:`ArrayView`.

:func:`array_view` turns a qd.ndarray (its device buffer, one cached view), a numpy array (copied
to the device, copied back after the launch), a CUDA torch tensor, a numba-cuda device array, any
``__cuda_array_interface__`` producer or a CUDA DLPack producer into the pointer, shape, strides
and dtype the launcher writes into parameter cells. :func:`_view_type` is the Numba type of such
a view (through the CPU typing of an equivalent numpy stand-in).

This module never compiles and never launches; it allocates device memory only for numpy
arguments and qd.ndarrays.
"""

from __future__ import annotations

import numpy as np
from numba.core import types

from ... import config, dlpack
from ...errors import QuadrantsTypeError
from ...field import Field, Ndarray
from ...frontend.args import field_for_ndarray_message, ndarray_type
from ...lowering import device
from .runtime import CudaRuntime, ensure_device

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
        if 0 not in shape:   # an empty array is contiguous whatever its strides (a device array of 0 has (0,))
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
            view = array_view(a._dev, where)
            shape = tuple(a._arr.shape)        # with the element's axes
            if view.shape != shape:            # a 0-d array's buffer is 1-d
                view = ArrayView(view.dtype, shape, tuple(device.c_strides(shape, view.dtype.itemsize)), view.ptr,
                                 view.readonly, keep=view.keep)
            a._cuda_view = view
        return view
    if isinstance(a, np.ndarray):
        rt = CudaRuntime.get()
        dev = rt.cuda.to_device(np.ascontiguousarray(a))   # 1-d for a 0-d array: the view keeps a's shape
        return ArrayView(a.dtype, a.shape, tuple(device.c_strides(a.shape, a.dtype.itemsize)),
                         int(dev.device_ctypes_pointer.value), not a.flags.writeable, host=a, keep=dev)
    mod = type(a).__module__
    if mod.startswith("torch"):
        if not a.is_cuda:
            raise QuadrantsTypeError(f"{where}: a CPU torch tensor cannot be passed to a CUDA kernel; "
                                     "use .cuda() or a numpy array")
        rt = CudaRuntime.get()
        if rt.device_count > 1 and a.get_device() != rt.device_id:
            raise _on_other_device(where, a.get_device(), rt.device_id)
        dt = _torch_dtype(a)
        return ArrayView(dt, tuple(a.shape), tuple(s * dt.itemsize for s in a.stride()), a.data_ptr(), False,
                         keep=a)
    if hasattr(a, "device_ctypes_pointer"):   # numba-cuda DeviceNDArray
        ptr = _on_this_device(int(a.device_ctypes_pointer.value or 0), where)
        return ArrayView(a.dtype, tuple(a.shape), tuple(a.strides), ptr, False, keep=a)
    cai = getattr(a, "__cuda_array_interface__", None)
    if cai is not None:
        dt = np.dtype(cai["typestr"])
        shape = tuple(cai["shape"])
        strides = cai.get("strides") or device.c_strides(shape, dt.itemsize)
        ptr, readonly = cai["data"]
        return ArrayView(dt, shape, tuple(strides), _on_this_device(int(ptr or 0), where), bool(readonly), keep=a)
    if hasattr(a, "__array_interface__"):
        raise QuadrantsTypeError(f"{where}: a host array ({type(a).__name__}, through __array_interface__) cannot be "
                                 "passed to a CUDA kernel; pass a numpy array (copied to the GPU and back) or a CUDA "
                                 "array")
    if isinstance(a, Field):    # before DLPack: fields export one, but are not ndarray arguments
        raise QuadrantsTypeError(field_for_ndarray_message(where, a))
    if hasattr(a, "__dlpack__") and hasattr(a, "__dlpack_device__"):
        return _dlpack_view(a, where)
    raise QuadrantsTypeError(f"{where}: expected an ndarray (numpy, qd.ndarray, or a CUDA array: torch, cupy, "
                             f"numba-cuda), got {type(a).__name__}")


def _on_this_device(ptr: int, where: str) -> int:
    """``ptr``, checked to be memory of the runtime's device when the process sees several
    (the driver's answer at each check: CudaRuntime.device_of_pointer)."""
    rt = CudaRuntime.get()
    if rt.device_count > 1 and ptr:
        ordinal = rt.device_of_pointer(ptr)
        if ordinal != rt.device_id:
            raise _on_other_device(where, ordinal, rt.device_id)
    return ptr


def _on_other_device(where: str, theirs: int, ours: int) -> QuadrantsTypeError:
    return QuadrantsTypeError(f"{where}: the array is on CUDA device {theirs}, but qd_numba runs on device {ours} "
                              f"(qd.init(device_id={ours})); move it to device {ours} (torch: .to('cuda:{ours}')) or "
                              "run this kernel in a process on that device")


def _dlpack_view(a, where: str) -> ArrayView:
    """An ArrayView of a CUDA DLPack producer (dlpack.py ``consume``). ``stream=1`` asks the
    producer to order its pending work before the legacy default stream, where qd_numba launches."""
    ptr, shape, strides, dt, owner = dlpack.consume(a, where, "CUDA", (dlpack.CUDA, dlpack.CUDA_MANAGED),
                                                    CudaRuntime.get().device_id, 1, _on_other_device)
    return ArrayView(dt, shape, strides, ptr, False, keep=owner)


def _view_type(where, spec, view):
    """The Numba type of an ndarray argument, through the CPU typing of an equivalent numpy view."""
    stand_in = np.lib.stride_tricks.as_strided(np.zeros(1, view.dtype), shape=view.shape,
                                               strides=[0] * len(view.shape))
    stand_in = stand_in.copy(order="C") if view.c_contiguous else stand_in   # keeps 0-d views 0-d
    if view.readonly:
        stand_in = stand_in.view()
        stand_in.flags.writeable = False
    ty = ndarray_type(where, spec, stand_in, config.current.debug)
    if not view.c_contiguous:
        ty = ty.copy(layout="A") if isinstance(ty, types.Array) else ty
    return ty
