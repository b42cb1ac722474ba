"""Array-like ndarray arguments: torch CPU tensors, ``__array_interface__`` and DLPack objects on
qd.cpu are used in place (writes visible in the caller's object); the errors name the argument;
on qd.cuda, host arrays other than numpy keep a clear error."""

from __future__ import annotations

import numpy as np
import pytest

import qd_numba as qd


class InterfaceOnly:
    """Exposes an array through ``__array_interface__`` alone."""

    def __init__(self, array):
        self._array = array     # keeps the memory alive
        self.__array_interface__ = array.__array_interface__


class DLPackOnly:
    """Exposes an array through the DLPack protocol alone."""

    def __init__(self, array):
        self._array = array

    def __dlpack__(self, **kwargs):
        return self._array.__dlpack__(**kwargs)

    def __dlpack_device__(self):
        return self._array.__dlpack_device__()


class CudaArrayLike:
    __cuda_array_interface__ = {"shape": (4,), "typestr": "<f4", "data": (0, False), "version": 3}


@qd.kernel
def axpy(y: qd.types.ndarray(dtype=qd.f32, ndim=1), x: qd.types.ndarray(dtype=qd.f32, ndim=1), a: qd.f32):
    for i in range(y.shape[0]):
        y[i] += a * x[i]


@qd.kernel
def row_sums(m: qd.types.ndarray(dtype=qd.f64, ndim=2), out: qd.types.ndarray(dtype=qd.f64, ndim=1)):
    for i in range(m.shape[0]):
        s = 0.0
        for j in range(m.shape[1]):
            s += m[i, j]
        out[i] = s


@pytest.fixture
def cpu_only(arch):
    if arch != "cpu":
        pytest.skip("host array-likes are qd.cpu arguments")


@pytest.fixture
def torch(cpu_only):
    return pytest.importorskip("torch")


def _f32(rng, n):
    return rng.uniform(-1, 1, n).astype(np.float32)


def test_torch_cpu_tensor_written_in_place(torch, rng):
    y0, x0 = _f32(rng, 1000), _f32(rng, 1000)
    y, x = torch.from_numpy(y0.copy()), torch.from_numpy(x0)
    axpy(y, x, 0.5)
    np.testing.assert_allclose(y.numpy(), y0 + np.float32(0.5) * x0, rtol=1e-6)
    before = axpy.compile_count
    axpy(y, x, 0.5)                                   # same types: no recompile
    assert axpy.compile_count == before
    np.testing.assert_allclose(y.numpy(), y0 + np.float32(0.5) * x0 * 2, rtol=1e-5, atol=1e-6)


def test_torch_tensors_not_from_numpy(torch, rng):
    """Tensors torch allocated: a strided view, one that requires grad, a 2-d float64 one."""
    m = torch.tensor(rng.uniform(-1, 1, (30, 7)))
    out = torch.zeros(60, dtype=torch.float64)[::2]   # every other element
    row_sums(m, out)
    np.testing.assert_allclose(out.numpy(), m.numpy().sum(axis=1), rtol=1e-12)
    y = torch.zeros(50, requires_grad=True)
    x = torch.from_numpy(_f32(rng, 50))
    axpy(y, x, 2.0)
    np.testing.assert_allclose(y.detach().numpy(), 2 * x.numpy(), rtol=1e-6)


def test_numpy_view_of_torch_shares_memory(torch, rng):
    t = torch.from_numpy(_f32(rng, 64))
    t0 = t.clone()
    axpy(t.numpy(), t0.numpy(), -1.0)
    np.testing.assert_array_equal(t.numpy(), np.zeros(64, np.float32))


def test_torch_vector_elements(torch, rng):
    @qd.kernel
    def norms(v: qd.types.ndarray(dtype=qd.types.vector(3, qd.f32), ndim=1), out: qd.types.ndarray(dtype=qd.f32,
                                                                                                       ndim=1)):
        for i in range(v.shape[0]):
            out[i] = v[i].norm()

    v = torch.from_numpy(_f32(rng, 3 * 40).reshape(40, 3))
    out = torch.zeros(40)
    norms(v, out)
    np.testing.assert_allclose(out.numpy(), np.linalg.norm(v.numpy(), axis=1), rtol=1e-6)


def test_torch_errors_name_the_argument(torch):
    x = torch.zeros(8)
    with pytest.raises(qd.QuadrantsTypeError, match="argument 'y': expected dtype float32, got float64"):
        axpy(torch.zeros(8, dtype=torch.float64), x, 1.0)
    with pytest.raises(qd.QuadrantsTypeError, match="argument 'x': expected ndim=1, got an array with ndim=2"):
        axpy(torch.zeros(8), torch.zeros(2, 4), 1.0)
    with pytest.raises(qd.QuadrantsTypeError, match="argument 'x': this torch tensor has no numpy view"):
        axpy(torch.zeros(8), torch.zeros(8, dtype=torch.bfloat16), 1.0)
    # memory off the CPU (a CUDA tensor behaves the same; 'meta' needs no GPU)
    with pytest.raises(qd.QuadrantsTypeError, match="argument 'y': a torch tensor on 'meta' cannot be passed to a "
                                                    "kernel on qd.cpu"):
        axpy(torch.zeros(8, device="meta"), x, 1.0)


def test_array_interface_object_written_in_place(cpu_only, rng):
    y0, x0 = _f32(rng, 300), _f32(rng, 300)
    y = y0.copy()
    axpy(InterfaceOnly(y), InterfaceOnly(x0), 3.0)
    np.testing.assert_allclose(y, y0 + np.float32(3.0) * x0, rtol=1e-6)


def test_dlpack_object_written_in_place(cpu_only, rng):
    m = rng.uniform(-1, 1, (20, 5))
    out = np.zeros(20)
    row_sums(DLPackOnly(m), DLPackOnly(out))
    np.testing.assert_allclose(out, m.sum(axis=1), rtol=1e-12)


@pytest.mark.parametrize("wrap", [InterfaceOnly, DLPackOnly], ids=["array_interface", "dlpack"])
def test_array_like_errors_name_the_argument(cpu_only, wrap):
    with pytest.raises(qd.QuadrantsTypeError, match="argument 'x': expected dtype float32, got int32"):
        axpy(np.zeros(4, np.float32), wrap(np.zeros(4, np.int32)), 1.0)
    with pytest.raises(qd.QuadrantsTypeError, match="argument 'out': expected ndim=1, got an array with ndim=2"):
        row_sums(np.zeros((4, 2)), wrap(np.zeros((4, 1))))


@pytest.mark.parametrize("wrap", [InterfaceOnly, DLPackOnly], ids=["array_interface", "dlpack"])
def test_read_only_array_likes(cpu_only, rng, wrap):
    """Read-only memory stays read-only: reading it works, writing it is our error."""
    m = rng.uniform(-1, 1, (10, 4))
    m.flags.writeable = False
    out = np.zeros(10)
    row_sums(wrap(m), out)
    np.testing.assert_allclose(out, m.sum(axis=1), rtol=1e-12)
    y = np.zeros(4, np.float32)
    y.flags.writeable = False
    with pytest.raises(qd.QuadrantsTypeError, match="argument 'y' is a read-only array"):
        axpy(wrap(y), np.ones(4, np.float32), 1.0)


def test_other_objects_are_our_error(cpu_only):
    with pytest.raises(qd.QuadrantsTypeError, match=r"argument 'x': expected an ndarray .*got list"):
        axpy(np.zeros(4, np.float32), [1.0, 2.0, 3.0, 4.0], 1.0)
    with pytest.raises(qd.QuadrantsTypeError, match=r"argument 'x': a CUDA array \(CudaArrayLike\) cannot be passed "
                                                    r"to a kernel on qd.cpu"):
        axpy(np.zeros(4, np.float32), CudaArrayLike(), 1.0)


def test_numpy_fast_path_unchanged(cpu_only, rng):
    """numpy arguments still take the generated fast path: the instance is found without the
    slow path's argument checks (a repeated call compiles nothing)."""
    y, x = _f32(rng, 16), _f32(rng, 16)
    axpy(y, x, 1.0)
    before = axpy.compile_count
    calls = []
    backend = axpy.backend()
    original = backend.slow_call
    backend.slow_call = lambda *args: calls.append(args) or original(*args)
    try:
        axpy(y, x, 1.0)
    finally:
        del backend.slow_call
    assert calls == [] and axpy.compile_count == before
    # the patch is seen: a call the fast path cannot serve takes it
    backend.slow_call = lambda *args: calls.append(args) or original(*args)
    try:
        axpy(y[::2], x[::2], 1.0)   # a new layout: the fast path misses, the slow path compiles it
    finally:
        del backend.slow_call
    assert len(calls) == 1


# -- qd.cuda: host array-likes other than numpy keep a clear error ----------------------------------------

@pytest.mark.cuda
def test_cuda_rejects_host_array_likes():
    torch = pytest.importorskip("torch")
    qd.init(arch=qd.cuda)
    try:
        y = np.zeros(4, np.float32)
        with pytest.raises(qd.QuadrantsTypeError, match="argument 'x': a CPU torch tensor cannot be passed to a CUDA"):
            axpy(y, torch.zeros(4), 1.0)
        with pytest.raises(qd.QuadrantsTypeError, match=r"argument 'x': a host array \(InterfaceOnly"):
            axpy(y, InterfaceOnly(np.zeros(4, np.float32)), 1.0)
        with pytest.raises(qd.QuadrantsTypeError, match="argument 'x': a DLPack array on device type 1"):
            axpy(y, DLPackOnly(np.zeros(4, np.float32)), 1.0)
        x = torch.from_numpy(np.arange(4, dtype=np.float32)).cuda()
        axpy(y, x, 2.0)                                   # a CUDA tensor is fine
        np.testing.assert_array_equal(y, 2 * np.arange(4, dtype=np.float32))
    finally:
        qd.init(arch=qd.cpu)
