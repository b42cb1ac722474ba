"""Several GPUs (docs/multi_gpu.md): the device of the process (``device_id``/``QD_DEVICE``), the
errors for a device that does not exist or an array on another device, and DLPack views of
qd.ndarrays and fields.

The CPU tests run the real checks against a stand-in runtime (a device count and pointer
ordinals chosen by the test); the ``cuda`` tests need one GPU, and the cross-device ones two.
References are numpy on random data.
"""

from __future__ import annotations

import gc
import types

import numpy as np
import pytest

import qd_numba as qd
from qd_numba import config, dlpack
from qd_numba.errors import QuadrantsConfigError, QuadrantsTypeError
from qd_numba.targets.cuda import arrays, runtime
from qd_numba.targets.cuda.runtime import CudaRuntime


@qd.kernel
def scale_add(y: qd.types.ndarray(dtype=qd.f32, ndim=2), x: qd.types.ndarray(dtype=qd.f32, ndim=2), a: qd.f32):
    for i, j in qd.ndrange(y.shape[0], y.shape[1]):
        y[i, j] += a * x[i, j]


vals = qd.field(qd.f64, shape=(37,))


@qd.kernel
def square_vals():
    for i in vals:
        vals[i] = vals[i] * vals[i]


# -- device choice: configuration ---------------------------------------------------------------

def test_qd_device_variable_and_option(monkeypatch):
    monkeypatch.setenv("QD_DEVICE", "3")
    assert config.config_from_env().device_id == 3
    assert config.config_from_env(device_id=1).device_id == 1      # the option wins
    monkeypatch.delenv("QD_DEVICE")
    assert config.config_from_env().device_id is None    # the device current in the thread opening the runtime
    assert config.config_from_env(device_id=None).device_id is None


@pytest.mark.parametrize("bad", [-1, True, 1.5, "1"])
def test_bad_device_id_is_a_config_error(bad):
    with pytest.raises(QuadrantsConfigError, match=r"device_id=.*expected a CUDA device number >= 0"):
        config.config_from_env(device_id=bad)


def test_bad_qd_device_variable(monkeypatch):
    monkeypatch.setenv("QD_DEVICE", "gpu1")
    with pytest.raises(QuadrantsConfigError, match="QD_DEVICE='gpu1': expected an integer"):
        config.config_from_env()


# -- device choice: the runtime, with a stand-in device count ---------------------------------------

@pytest.fixture
def two_fake_gpus(monkeypatch):
    """No runtime yet, and a driver that reports two devices (nothing gets further than the
    device-number check)."""
    from numba import cuda

    from qd_numba.targets.cuda import compile as cuda_compile
    from qd_numba.targets.cuda import kernel as cuda_kernel

    monkeypatch.setattr(CudaRuntime, "_instance", None)
    monkeypatch.setattr(cuda_compile, "cuda_available", lambda: True)
    monkeypatch.setattr(cuda_kernel, "cuda_available", lambda: True)
    monkeypatch.setattr(cuda, "gpus", [object(), object()])
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "4,5")


def test_out_of_range_device_id_names_it_and_the_count(two_fake_gpus):
    before = config.current
    with pytest.raises(QuadrantsConfigError, match=r"device_id=2 .*no such CUDA device; this process sees 2 CUDA "
                                                   r"device\(s\) \(CUDA_VISIBLE_DEVICES=4,5\), ids 0 to 1"):
        qd.init(arch=qd.cuda, device_id=2)
    # not a missing GPU: qd.gpu does not fall back to the CPU for it either
    with pytest.raises(QuadrantsConfigError, match="device_id=7"):
        qd.init(arch=qd.gpu, device_id=7)
    assert config.current is before       # nothing was installed
    assert CudaRuntime._instance is None


def test_one_device_per_process(monkeypatch):
    fake = types.SimpleNamespace(device_id=0, device_count=2)
    monkeypatch.setattr(CudaRuntime, "_instance", fake)
    assert CudaRuntime.open(0) is fake and CudaRuntime.open(None) is fake
    with pytest.raises(QuadrantsConfigError, match=r"qd.init\(device_id=1\): this process already runs on CUDA "
                                                   "device 0; qd_numba uses one device per process"):
        CudaRuntime.open(1)
    # an id the process cannot see says so first (found on a 2-GPU machine, where the other test
    # of out-of-range ids ran after a kernel had opened device 0)
    with pytest.raises(QuadrantsConfigError, match=r"device_id=2 .*no such CUDA device; this process sees 2"):
        CudaRuntime.open(2)


def test_device_of_pointer_asks_the_driver_at_every_check(monkeypatch):
    """An address freed on one device is reused by allocations on another (unified addressing):
    the ordinal is the driver's answer now, never a remembered one."""
    asked, owner = [], {1000: 0}

    class Driver:
        class CUpointer_attribute:
            CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL = 9

        @staticmethod
        def cuPointerGetAttribute(attr, ptr):
            asked.append((attr, ptr))
            return 0, owner[ptr]

    monkeypatch.setattr(runtime, "_driver", lambda: Driver)
    rt = object.__new__(CudaRuntime)
    assert rt.device_of_pointer(1000) == 0
    owner[1000] = 1                      # freed on device 0, allocated again on device 1
    assert rt.device_of_pointer(1000) == 1
    assert asked == [(9, 1000), (9, 1000)]


# -- arrays on another device: the argument checks, with a stand-in runtime ---------------------------

class CudaArray:
    """A ``__cuda_array_interface__`` producer at a made-up device address."""

    def __init__(self, ptr, shape=(4,)):
        self.__cuda_array_interface__ = {"shape": shape, "typestr": "<f4", "data": (ptr, False), "version": 3}


class CudaDLPack:
    """A DLPack producer on CUDA device ``device`` that must not be consumed."""

    def __init__(self, device):
        self.device = device

    def __dlpack_device__(self):
        return dlpack.CUDA, self.device

    def __dlpack__(self, **kwargs):
        raise AssertionError("an array on another device was consumed")


def _fake_runtime(monkeypatch, count, ordinals):
    def device_of_pointer(ptr):
        if count == 1:
            raise AssertionError("one device: no pointer query")
        return ordinals[ptr]

    fake = types.SimpleNamespace(device_id=0, device_count=count, device_of_pointer=device_of_pointer)
    monkeypatch.setattr(CudaRuntime, "_instance", fake)


WHERE = "kernel 'scale_add', argument 'x'"


def test_array_on_another_device_names_the_argument_and_both_devices(monkeypatch):
    _fake_runtime(monkeypatch, 2, {0x1000: 0, 0x2000: 1})
    view = arrays.array_view(CudaArray(0x1000, (3, 5)), WHERE)
    assert (view.ptr, view.shape) == (0x1000, (3, 5))
    with pytest.raises(QuadrantsTypeError, match=r"kernel 'scale_add', argument 'x': the array is on CUDA device 1, "
                                                 r"but qd_numba runs on device 0 \(qd.init\(device_id=0\)\)"):
        arrays.array_view(CudaArray(0x2000), WHERE)
    with pytest.raises(QuadrantsTypeError, match="argument 'x': the array is on CUDA device 3, but qd_numba runs on "
                                                 "device 0"):
        arrays.array_view(CudaDLPack(3), WHERE)


def test_one_device_never_queries_pointers(monkeypatch):
    _fake_runtime(monkeypatch, 1, {})
    assert arrays.array_view(CudaArray(0x3000), WHERE).ptr == 0x3000


# -- DLPack views of qd.ndarrays and fields ---------------------------------------------------------

@pytest.fixture
def torch(arch):
    torch = pytest.importorskip("torch")
    if arch == "cuda" and not torch.cuda.is_available():
        pytest.skip("torch without CUDA")
    return torch


def test_torch_views_of_an_ndarray_share_its_memory(torch, rng, arch):
    x0, y0 = rng.uniform(-1, 1, (2, 9, 13)).astype(np.float32)
    x, y = qd.ndarray(qd.f32, (9, 13)), qd.ndarray(qd.f32, (9, 13))
    x.from_numpy(x0)
    y.from_numpy(y0)
    tx, ty = torch.from_dlpack(x), torch.from_dlpack(y)
    assert x.__dlpack_device__() == ((dlpack.CUDA, 0) if arch == "cuda" else (dlpack.CPU, 0))
    assert tuple(ty.shape) == (9, 13) and ty.dtype == torch.float32
    scale_add(y, x, 0.5)                                # the kernel writes; the view sees it
    np.testing.assert_allclose(ty.cpu().numpy(), y0 + np.float32(0.5) * x0, rtol=1e-6)
    tx.mul_(2.0)                                        # torch writes; the kernel reads it
    scale_add(y, x, 1.0)
    np.testing.assert_allclose(y.to_numpy(), y0 + np.float32(0.5) * x0 + np.float32(2.0) * x0, rtol=1e-5, atol=1e-6)


def test_views_of_fields_vectors_and_0d(torch, rng):
    v0 = rng.uniform(-2, 2, 37)
    vals.from_numpy(v0)
    t = torch.from_dlpack(vals)
    square_vals()
    np.testing.assert_allclose(t.cpu().numpy(), v0 * v0)
    vec = qd.ndarray(qd.math.vec3, (11,))
    w0 = rng.uniform(-1, 1, (11, 3)).astype(np.float32)
    torch.from_dlpack(vec).copy_(torch.from_numpy(w0))
    np.testing.assert_array_equal(vec.to_numpy(), w0)
    z = qd.field(qd.i32, shape=())
    z[None] = int(rng.integers(1, 1000))
    tz = torch.from_dlpack(z)
    assert tz.shape == () and int(tz) == z[None]


def test_numpy_consumes_host_views(rng, arch):
    if arch != "cpu":
        pytest.skip("numpy views host memory")
    a = qd.ndarray(qd.i64, (6, 4))
    a0 = rng.integers(-50, 50, (6, 4))
    a.from_numpy(a0)
    view = np.from_dlpack(a)
    view[2, 3] = 999
    a0[2, 3] = 999
    np.testing.assert_array_equal(a.to_numpy(), a0)


def test_quadrants_to_dlpack(torch, rng):
    f = qd.field(qd.f32, shape=(4, 6))
    f0 = rng.uniform(-1, 1, (4, 6)).astype(np.float32)
    f.from_numpy(f0)
    legacy, versioned = f.to_dlpack(), f.to_dlpack(versioned=True)
    assert '"dltensor"' in repr(legacy) and '"dltensor_versioned"' in repr(versioned)
    t = torch.utils.dlpack.from_dlpack(legacy)
    t += 1.0
    np.testing.assert_allclose(torch.from_dlpack(versioned).cpu().numpy(), f0 + np.float32(1.0))
    np.testing.assert_allclose(f.to_numpy(), f0 + np.float32(1.0))


def test_copy_true_exports_a_copy(torch, rng):
    a = qd.ndarray(qd.f32, (5, 3))
    a0 = rng.uniform(-1, 1, (5, 3)).astype(np.float32)
    a.from_numpy(a0)
    c = torch.from_dlpack(a.__dlpack__(copy=True))
    c.zero_()
    np.testing.assert_array_equal(a.to_numpy(), a0)


def test_capsules_keep_the_buffer_until_the_consumer_lets_go(torch, rng):
    gc.collect()
    kept = len(dlpack._exported)
    a = qd.ndarray(qd.f64, (8,))
    a0 = rng.uniform(-1, 1, 8)
    a.from_numpy(a0)
    t = torch.from_dlpack(a)
    del a
    gc.collect()
    np.testing.assert_array_equal(t.cpu().numpy(), a0)   # the buffer outlives the ndarray
    assert len(dlpack._exported) == kept + 1
    del t
    gc.collect()
    assert len(dlpack._exported) == kept
    for version in (None, (1, 0)):                        # never consumed: its destructor lets go
        unused = qd.ndarray(qd.f32, (3,)).__dlpack__(max_version=version)
        assert len(dlpack._exported) == kept + 1
        del unused
        gc.collect()
        assert len(dlpack._exported) == kept


def test_a_field_is_still_not_an_ndarray_argument(rng):
    """Fields export DLPack, but a qd.types.ndarray() parameter still refuses them (as Quadrants)."""
    x = qd.ndarray(qd.f32, (37, 1))
    x.from_numpy(rng.uniform(-1, 1, (37, 1)).astype(np.float32))
    f = qd.field(qd.f32, shape=(37, 1))
    with pytest.raises(QuadrantsTypeError, match="argument 'y': got the field .* fields are global"):
        scale_add(f, x, 1.0)


def test_dlpack_export_errors_name_the_array():
    tree = qd.field(qd.f32, name="tree_x")
    qd.root.dense(qd.i, 8).place(tree)
    with pytest.raises(QuadrantsTypeError, match="field 'tree_x' is stored in an SNode tree"):
        tree.__dlpack__()
    a = qd.ndarray(qd.f32, (3,))
    with pytest.raises(QuadrantsTypeError, match=r"is on DLPack device \(\d+, 0\), not \(7, 0\)"):
        a.__dlpack__(dl_device=(7, 0))
    c = qd.ndarray(qd.f32, (3,))
    c._arr = np.zeros(3, np.complex64)
    with pytest.raises(QuadrantsTypeError, match="dtype complex64 has no DLPack type"):
        dlpack.capsule(c._arr.ctypes.data, (3,), (1,), c._arr.dtype, (dlpack.CPU, 0), c._arr)


# -- on a GPU ---------------------------------------------------------------------------------------

@pytest.fixture
def on_cuda():
    qd.init(arch=qd.cuda)
    yield
    qd.init(arch=qd.cpu)


@pytest.mark.cuda
def test_device_id_zero_runs_kernels(rng, monkeypatch):
    from numba import cuda

    qd.init(arch=qd.cuda, device_id=0)
    try:
        assert CudaRuntime.get().device_id == 0 and CudaRuntime.get().device_count == len(cuda.gpus)
        x0, y0 = rng.uniform(-1, 1, (2, 40, 3)).astype(np.float32)
        y = y0.copy()
        scale_add(y, x0, 3.0)
        np.testing.assert_allclose(y, y0 + np.float32(3.0) * x0, rtol=1e-6, atol=1e-6)
        monkeypatch.setenv("QD_DEVICE", "0")
        qd.init(arch=qd.cuda)
        assert config.current.device_id == 0
        monkeypatch.delenv("QD_DEVICE")
        qd.init(arch=qd.cuda)       # no device named: the runtime's (current) device stays
        assert config.current.device_id is None and CudaRuntime.get().device_id == 0
    finally:
        qd.init(arch=qd.cpu)


@pytest.mark.cuda
def test_device_id_out_of_range_on_the_gpu():
    from numba import cuda

    count = len(cuda.gpus)
    with pytest.raises(QuadrantsConfigError, match=f"device_id={count} .*no such CUDA device; this process sees "
                                                   f"{count} CUDA device"):
        qd.init(arch=qd.cuda, device_id=count)


@pytest.mark.cuda
def test_cuda_dlpack_view_on_a_nonblocking_stream(torch, rng, on_cuda):
    """A consumer on a non-blocking stream waits for the kernel queued before the export."""
    n = 1 << 20
    x0, y0 = rng.uniform(-1, 1, (2, 1, n)).astype(np.float32)
    x, y = qd.ndarray(qd.f32, (1, n)), qd.ndarray(qd.f32, (1, n))
    x.from_numpy(x0)
    y.from_numpy(y0)
    qd.sync()
    side = torch.cuda.Stream()
    for _ in range(20):
        scale_add(y, x, 1.0)            # queued on the legacy default stream
    with torch.cuda.stream(side):
        t = torch.from_dlpack(y)        # ordered behind the launches (an event on `side`)
        total = (t * 1.0).double().sum()
    side.synchronize()
    ref = (y0.astype(np.float64) + 20 * x0.astype(np.float64)).sum()
    assert abs(float(total) - ref) < 1e-3 * max(1.0, abs(ref))
    assert torch.from_dlpack(y).device == torch.device("cuda", 0)


@pytest.mark.cuda
def test_tensor_on_another_gpu_is_our_error(torch, rng, on_cuda):
    if torch.cuda.device_count() < 2:
        pytest.skip("needs two GPUs")
    x = torch.from_numpy(rng.uniform(-1, 1, (4, 4)).astype(np.float32))
    y = torch.zeros(4, 4)
    with pytest.raises(QuadrantsTypeError, match=r"kernel 'scale_add', argument 'x': the array is on CUDA device 1, "
                                                 "but qd_numba runs on device 0"):
        scale_add(y.cuda(0), x.cuda(1), 1.0)
    with pytest.raises(QuadrantsTypeError, match="argument 'y': the array is on CUDA device 1"):
        scale_add(_DLPackOf(y.cuda(1)), x.cuda(0), 1.0)
    with pytest.raises(QuadrantsTypeError, match="argument 'x': the array is on CUDA device 1"):
        scale_add(y.cuda(0), _InterfaceOf(x.cuda(1)), 1.0)     # __cuda_array_interface__: the pointer's device
    out = y.cuda(0)
    scale_add(out, x.cuda(0), 2.0)
    np.testing.assert_allclose(out.cpu().numpy(), 2 * x.numpy(), rtol=1e-6)


class _DLPackOf:
    def __init__(self, t):
        self.t = t

    def __dlpack__(self, **kwargs):
        return self.t.__dlpack__(**kwargs)

    def __dlpack_device__(self):
        return self.t.__dlpack_device__()


class _InterfaceOf:
    def __init__(self, t):
        self.t = t
        self.__cuda_array_interface__ = t.__cuda_array_interface__
