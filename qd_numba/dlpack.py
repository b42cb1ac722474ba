"""DLPack: the protocol's C structures, and zero-copy export of fields and qd.ndarrays.

``qd.ndarray`` and fields with a buffer of their own have ``__dlpack__``/``__dlpack_device__``,
so ``torch.from_dlpack(x)`` (or ``numpy.from_dlpack``, cupy, jax) views their memory without a
copy: host memory on the CPU arch, device memory of the process's device on CUDA and AMDGPU.
:func:`export` builds the capsule (DLPack 1.0's ``"dltensor_versioned"`` for consumers that pass
``max_version``, else ``"dltensor"``): the consumer renames it once it owns the tensor and calls
the deleter when its view dies; until then the array's buffer is kept alive here. A capsule
never consumed releases it when the capsule itself is freed.

The device type is the target's (``Target.dlpack_device_type``: kDLCUDA on CUDA, kDLROCM on
AMDGPU). On a GPU, the capsule is made safe for the consumer's ``stream``: qd_numba launches on
the default (null) stream, so a stream not ordered with it (a non-blocking one) waits for the
work queued there (an event, no host wait); see docs/multi_gpu.md.

:func:`consume` is the other direction: the GPU targets' argument code (targets/cuda/arrays.py,
targets/amdgpu/kernel.py) views a DLPack producer's memory with the same structures.
"""

from __future__ import annotations

import ctypes

import numpy as np

from . import config
from .errors import QuadrantsTypeError


class DLDevice(ctypes.Structure):
    _fields_ = [("device_type", ctypes.c_int32), ("device_id", ctypes.c_int32)]


class DLDataType(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint8), ("bits", ctypes.c_uint8), ("lanes", ctypes.c_uint16)]


class DLTensor(ctypes.Structure):
    _fields_ = [("data", ctypes.c_void_p), ("device", DLDevice), ("ndim", ctypes.c_int32),
                ("dtype", DLDataType), ("shape", ctypes.POINTER(ctypes.c_int64)),
                ("strides", ctypes.POINTER(ctypes.c_int64)), ("byte_offset", ctypes.c_uint64)]


class DLManagedTensor(ctypes.Structure):
    pass


class DLManagedTensorVersioned(ctypes.Structure):
    pass


DELETER = ctypes.CFUNCTYPE(None, ctypes.POINTER(DLManagedTensor))
DELETER_VERSIONED = ctypes.CFUNCTYPE(None, ctypes.POINTER(DLManagedTensorVersioned))
DLManagedTensor._fields_ = [("dl_tensor", DLTensor), ("manager_ctx", ctypes.c_void_p), ("deleter", DELETER)]
DLManagedTensorVersioned._fields_ = [("major", ctypes.c_uint32), ("minor", ctypes.c_uint32),
                                     ("manager_ctx", ctypes.c_void_p), ("deleter", DELETER_VERSIONED),
                                     ("flags", ctypes.c_uint64), ("dl_tensor", DLTensor)]

CPU, CUDA, ROCM, CUDA_MANAGED = 1, 2, 10, 13       # DLPack device types
KINDS = {0: "i", 1: "u", 2: "f", 6: "b"}           # DLPack type codes: int, uint, float, bool
_CODES = {kind: code for code, kind in KINDS.items()}

# DLManagedTensor address -> what must outlive the consumer's view (the struct, its shape and
# strides, the array's buffer); the deleter drops the entry
_exported: dict = {}


@DELETER
def _deleter(managed) -> None:
    _exported.pop(ctypes.addressof(managed.contents), None)


@DELETER_VERSIONED
def _deleter_versioned(managed) -> None:
    _exported.pop(ctypes.addressof(managed.contents), None)


@ctypes.CFUNCTYPE(None, ctypes.c_void_p)
def _capsule_destructor(capsule) -> None:
    # a capsule still under its first name was never consumed: it still owns the tensor
    for name in (_NAME, _NAME_VERSIONED):
        if _capsule_is_valid(capsule, name):
            _exported.pop(_capsule_pointer(capsule, name), None)


_NAME, _NAME_VERSIONED = b"dltensor", b"dltensor_versioned"
_capsule_new = ctypes.PYFUNCTYPE(ctypes.py_object, ctypes.c_void_p, ctypes.c_char_p, ctypes.c_void_p)(
    ("PyCapsule_New", ctypes.pythonapi))
_capsule_is_valid = ctypes.PYFUNCTYPE(ctypes.c_int, ctypes.c_void_p, ctypes.c_char_p)(
    ("PyCapsule_IsValid", ctypes.pythonapi))
_capsule_pointer = ctypes.PYFUNCTYPE(ctypes.c_void_p, ctypes.c_void_p, ctypes.c_char_p)(
    ("PyCapsule_GetPointer", ctypes.pythonapi))


def capsule(ptr: int, shape: tuple, strides: tuple, dtype: np.dtype, device: tuple[int, int], owner,
            versioned: bool = False):
    """A capsule of the memory at ``ptr`` (``strides`` in elements), keeping ``owner`` alive
    until the consumer's deleter runs: ``"dltensor_versioned"`` (DLPack 1.0, writable) for a
    consumer that asks for it with ``max_version``, else the older ``"dltensor"``."""
    code = _CODES.get(dtype.kind)
    if code is None:
        raise QuadrantsTypeError(f"DLPack export: dtype {dtype} has no DLPack type here (ints, uints, floats, bool)")
    managed = DLManagedTensorVersioned() if versioned else DLManagedTensor()
    dims = (ctypes.c_int64 * max(1, len(shape)))(*shape)
    steps = (ctypes.c_int64 * max(1, len(shape)))(*strides)
    t = managed.dl_tensor
    t.data, t.device, t.ndim = ptr or None, DLDevice(*device), len(shape)
    t.dtype = DLDataType(code, dtype.itemsize * 8, 1)
    t.shape, t.strides, t.byte_offset = dims, steps, 0
    if versioned:
        managed.major, managed.minor, managed.flags = 1, 0, 0
    managed.deleter = _deleter_versioned if versioned else _deleter
    address = ctypes.addressof(managed)
    _exported[address] = (managed, dims, steps, owner)
    return _capsule_new(address, _NAME_VERSIONED if versioned else _NAME,
                        ctypes.cast(_capsule_destructor, ctypes.c_void_p).value)


def _buffer(data, stream=None, copy=None):
    """(pointer, shape, strides in elements, dtype, (device type, id), owner) of a field's or
    ndarray's own buffer (its device buffer on a GPU target, targets/base.py ``dlpack_buffer``),
    or our error for a field stored in an SNode tree."""
    from .targets.base import target_for

    if getattr(data, "_tree", None) is not None:
        raise QuadrantsTypeError(f"DLPack export: {data._describe()} is stored in an SNode tree, not in a buffer of "
                                 "its own; use to_numpy()/to_torch() (a copy) or a field with a shape")
    shape = tuple(data.shape) + tuple(data.element_shape)
    host = data._arr
    dtype = host.dtype
    on_device = target_for(config.current.arch).dlpack_buffer(data, stream, copy)
    if on_device is None:
        host = np.array(host) if copy else host
        return (host.ctypes.data, shape, tuple(s // dtype.itemsize for s in host.strides), dtype, (CPU, 0), host)
    ptr, device_id, owner = on_device
    device_type = target_for(config.current.arch).dlpack_device_type
    strides, step = [], 1
    for n in reversed(shape):   # a device buffer is C-contiguous (0-d: numba-cuda keeps one element)
        strides.append(step)
        step *= n
    return ptr, shape, tuple(reversed(strides)), dtype, (device_type, device_id), owner


def device(data) -> tuple[int, int]:
    """``__dlpack_device__``: (DLPack device type, device id)."""
    return _buffer(data)[4]


def export(data, stream=None, max_version=None, dl_device=None, copy=None):
    """``__dlpack__`` of a field or ndarray (the protocol's keywords; see the module docstring).
    ``copy=True`` exports a copy; a ``dl_device`` other than the array's own is our error."""
    where = device(data)
    if dl_device is not None and tuple(int(v) for v in dl_device) != where:
        raise QuadrantsTypeError(f"DLPack export: {data._describe()} is on DLPack device {where}, not "
                                 f"{tuple(dl_device)}; copy it with to_numpy()/to_torch(device=...)")
    ptr, shape, strides, dtype, where, owner = _buffer(data, stream, copy)
    versioned = max_version is not None and int(max_version[0]) >= 1
    return capsule(ptr, shape, strides, dtype, where, owner, versioned)


# -- consuming: a DLPack producer's memory as a kernel argument ---------------------------------------

class _Consumed:
    """Holds a consumed DLPack tensor for as long as a view of it is in use, then calls its
    deleter (the producer's storage stays alive until then)."""

    def __init__(self, managed):
        self.managed = managed

    def __del__(self):
        deleter = self.managed.contents.deleter
        if deleter:
            deleter(self.managed)


_set_name = ctypes.PYFUNCTYPE(ctypes.c_int, ctypes.py_object, ctypes.c_char_p)(("PyCapsule_SetName", ctypes.pythonapi))
_pointer_of = ctypes.PYFUNCTYPE(ctypes.c_void_p, ctypes.py_object, ctypes.c_char_p)(
    ("PyCapsule_GetPointer", ctypes.pythonapi))


def consume(a, where: str, target: str, device_types: tuple[int, ...], device_id: int, stream: int, other_device):
    """(data address, shape, byte strides, dtype, owner) of DLPack producer ``a``, a kernel
    argument of a ``target`` kernel (its name in messages): zero-copy, the owner keeping the
    producer's tensor alive. Its device type must be one of ``device_types``; on the first of
    them its device id must be ``device_id`` (else ``other_device(where, theirs, ours)``, our
    error). ``stream`` is what the producer is asked to order its pending work before (the
    stream the target launches on, in DLPack's numbering for that device type)."""
    from .lowering.device import c_strides

    device_type, their_id = (int(v) for v in a.__dlpack_device__())
    if device_type not in device_types:
        raise QuadrantsTypeError(f"{where}: a DLPack array on device type {device_type} cannot be passed to a "
                                 f"{target} kernel; move it to the GPU or pass a numpy array")
    if device_type == device_types[0] and their_id != device_id:
        raise other_device(where, their_id, device_id)
    capsule = a.__dlpack__(stream=stream)
    managed = ctypes.cast(_pointer_of(capsule, _NAME), ctypes.POINTER(DLManagedTensor))
    _set_name(capsule, b"used_dltensor")  # we own it now: the capsule must not delete it
    owner = _Consumed(managed)
    t = managed.contents.dl_tensor
    kind = KINDS.get(t.dtype.code)
    if kind is None or t.dtype.lanes != 1:
        raise QuadrantsTypeError(f"{where}: unsupported DLPack dtype (code {t.dtype.code}, {t.dtype.bits} bits, "
                                 f"{t.dtype.lanes} lanes)")
    dt = np.dtype(f"{kind}{t.dtype.bits // 8}") if kind != "b" else np.dtype(np.bool_)
    shape = tuple(t.shape[k] for k in range(t.ndim))
    strides = tuple(t.strides[k] * dt.itemsize for k in range(t.ndim)) if t.strides else \
        tuple(c_strides(shape, dt.itemsize))
    return int(t.data or 0) + int(t.byte_offset), shape, strides, dt, owner
