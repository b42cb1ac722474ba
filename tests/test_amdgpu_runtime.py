"""Kernels on an AMD GPU through HIP (qd_numba/targets/amdgpu/runtime.py, kernel.py).

Every test here needs an AMD GPU with ROCm, hip-python and an ld.lld: run on such a machine with
``pytest --arch=amdgpu tests/test_amdgpu_runtime.py`` (elsewhere they are skipped). Each compares
with numpy on random data; the CPU run of the same kernels is tests/test_amdgpu_codegen.py's.
"""

from __future__ import annotations

import numpy as np
import pytest

import qd_numba as qd
from qd_numba import config

pytestmark = pytest.mark.amdgpu


@pytest.fixture(autouse=True)
def _on_amdgpu():
    assert config.current.arch == "amdgpu"


def test_range_for_and_return_value(rng):
    @qd.kernel
    def axpy(x: qd.types.ndarray(dtype=qd.f32, ndim=1), y: qd.types.ndarray(dtype=qd.f32, ndim=1),
             a: qd.f32) -> qd.i32:
        for i in range(x.shape[0]):
            y[i] = a * x[i] + y[i]
        return x.shape[0]

    x, y = rng.random(10_000).astype(np.float32), rng.random(10_000).astype(np.float32)
    want = 1.75 * x + y
    assert axpy(x, y, 1.75) == 10_000
    np.testing.assert_allclose(y, want, rtol=1e-6)


def test_reduction_into_a_field_uses_half_wave_shuffles(rng):
    total = qd.field(qd.f64, shape=())

    @qd.kernel
    def reduce(a: qd.types.ndarray(dtype=qd.f64, ndim=1)):
        for i in range(a.shape[0]):
            total[None] += a[i]

    a = rng.random(100_003)
    total[None] = 0.0
    reduce(a)
    assert total[None] == pytest.approx(float(a.sum()), rel=1e-12)


def test_float_min_max_atomics_and_fields(rng):
    lo = qd.field(qd.f32, shape=())
    hi = qd.field(qd.f32, shape=())
    out = qd.field(qd.f32, shape=1000)

    @qd.kernel
    def extremes(a: qd.types.ndarray(dtype=qd.f32, ndim=1)):
        for i in range(a.shape[0]):
            qd.atomic_min(lo[None], a[i])
            qd.atomic_max(hi[None], a[i])
            out[i] = qd.sin(a[i])

    a = (rng.random(1000) * 10 - 5).astype(np.float32)
    lo[None], hi[None] = 1e30, -1e30
    extremes(a)
    assert lo[None] == a.min() and hi[None] == a.max()
    np.testing.assert_allclose(out.to_numpy(), np.sin(a), rtol=2e-6, atol=1e-6)


def test_qd_ndarray_in_place_and_serial_task(rng):
    v = qd.ndarray(qd.f64, shape=64)
    host = rng.random(64)
    v.from_numpy(host)

    @qd.kernel
    def prefix(v: qd.types.ndarray(dtype=qd.f64, ndim=1)):
        k = 1
        while k < v.shape[0]:
            v[k] += v[k - 1]
            k += 1

    prefix(v)
    np.testing.assert_allclose(v.to_numpy(), np.cumsum(host), rtol=1e-12)


def test_out_of_bounds_in_debug_mode(rng):
    qd.init(arch=qd.amdgpu, debug=True)

    @qd.kernel
    def shift(a: qd.types.ndarray(dtype=qd.f32, ndim=1), b: qd.types.ndarray(dtype=qd.f32, ndim=1)):
        for i in range(a.shape[0]):
            b[i] = a[i + 1]

    with pytest.raises(qd.QuadrantsRuntimeError):
        shift(rng.random(8).astype(np.float32), np.zeros(8, np.float32))
    qd.init(arch=qd.amdgpu)


VEC3 = qd.types.vector(3, qd.f32)
PARTICLE = qd.types.struct(m=qd.f32, v=VEC3, id=qd.i32)


def test_vector_matrix_and_struct_arguments(rng):
    @qd.kernel
    def move(a: qd.types.ndarray(dtype=qd.f32, ndim=1), out: qd.types.ndarray(dtype=qd.f32, ndim=2), v: VEC3,
             m: qd.types.matrix(2, 2, qd.f32), p: PARTICLE):
        for i in range(a.shape[0]):
            for k in range(3):
                out[i, k] = a[i] * v[k] + m[0, 1] * p.v[k] * p.m + p.id

    a = rng.random(500).astype(np.float32)
    v, m, pv = rng.random(3).astype(np.float32), rng.random((2, 2)).astype(np.float32), rng.random(3).astype(np.float32)
    out = np.zeros((500, 3), np.float32)
    move(a, out, v.tolist(), m.tolist(), PARTICLE(m=0.5, v=pv.tolist(), id=7))
    np.testing.assert_allclose(out, np.outer(a, v) + m[0, 1] * pv * 0.5 + 7, rtol=1e-5)


def test_fields_of_snode_trees(rng):
    a, b = qd.field(qd.f32), qd.field(qd.i32)
    qd.root.dense(qd.i, 64).place(a, b)
    c = qd.field(qd.f64)
    qd.root.dense(qd.ij, (8, 4)).place(c)

    @qd.kernel
    def add():
        for i in range(64):
            a[i] += b[i] + c[i // 8, i % 4]

    av, bv, cv = rng.random(64).astype(np.float32), rng.integers(-50, 50, 64).astype(np.int32), rng.random((8, 4))
    a.from_numpy(av)
    b.from_numpy(bv)
    c.from_numpy(cv)
    add()
    want = av + bv + cv[np.arange(64) // 8, np.arange(64) % 4]
    np.testing.assert_allclose(a.to_numpy(), want.astype(np.float32), rtol=1e-6)
    np.testing.assert_array_equal(b.to_numpy(), bv)


F32_1D = qd.types.ndarray(dtype=qd.f32, ndim=1)


@qd.kernel
def _pair(x: F32_1D, y: F32_1D, a: qd.f32):
    with qd.stream_parallel():
        for i in range(x.shape[0]):
            x[i] = x[i] * a + 1.0
    with qd.stream_parallel():
        for i in range(y.shape[0]):
            y[i] = qd.sqrt(y[i]) * a


@qd.kernel
def _follow(x: F32_1D, y: F32_1D, z: F32_1D):
    for i in range(z.shape[0]):
        z[i] = x[i] + 2.0 * y[i]


def test_streams_events_and_stream_parallel(rng):
    n = 1 << 14
    x0, y0 = rng.random(n).astype(np.float32), rng.random(n).astype(np.float32)
    rx, ry = x0 * 1.5 + 1.0, np.sqrt(y0) * 1.5
    x, y, z = qd.ndarray(qd.f32, n), qd.ndarray(qd.f32, n), qd.ndarray(qd.f32, n)
    xh, yh = x0.copy(), y0.copy()
    _pair(xh, yh, 1.5)                      # numpy arguments: copied back after the join
    np.testing.assert_allclose(xh, rx, rtol=1e-6)
    np.testing.assert_allclose(yh, ry, rtol=1e-6)
    x.from_numpy(x0)
    y.from_numpy(y0)
    with qd.create_stream() as s, qd.create_stream() as other:
        _pair(x, y, 1.5, qd_stream=s)
        _follow(x, y, z, qd_stream=s)
        done = qd.create_event()
        done.record(s)
        done.wait(qd_stream=other)
        _follow(x, y, z, qd_stream=other)
        other.synchronize()
        done.destroy()
    np.testing.assert_allclose(z.to_numpy(), rx + 2.0 * ry, rtol=1e-5)


def test_gradient_through_an_adstack(rng):
    x = qd.field(qd.f64, shape=(64,), needs_grad=True)
    n = qd.field(qd.i32, shape=())
    loss = qd.field(qd.f64, shape=(), needs_grad=True)

    @qd.kernel
    def chain():
        for i in x:
            v = x[i]
            for _ in range(n[None]):
                v = qd.sin(v) * 1.01
            loss[None] += v

    xs = rng.uniform(-2, 2, 64)
    for steps in (1, 7):
        n[None] = steps
        x.from_numpy(xs)
        loss[None] = 0.0
        with qd.ad.Tape(loss=loss):
            chain()
        v, grad = xs.copy(), np.ones_like(xs)
        for _ in range(steps):
            grad *= np.cos(v) * 1.01
            v = np.sin(v) * 1.01
        assert loss[None] == pytest.approx(v.sum(), rel=1e-12)
        np.testing.assert_allclose(x.grad.to_numpy(), grad, rtol=1e-10)


def test_kernel_profiler_times_every_task(rng):
    qd.init(arch=qd.amdgpu, kernel_profiler=True)
    try:
        total = qd.field(qd.f64, shape=())

        @qd.kernel
        def sum_squares(a: qd.types.ndarray(dtype=qd.f64, ndim=1), n: qd.i32):
            total[None] = 0.0
            for i in range(n):
                total[None] += a[i] * a[i]

        a = rng.uniform(-1, 1, 100_000)
        for _ in range(3):
            sum_squares(a, a.shape[0])
        assert total[None] == pytest.approx(float(np.sum(a * a)), rel=1e-9)
        sum_squares(a, 0)                                   # the loop does not launch
        serial, loop = sum_squares.tasks(a, 0)
        assert qd.profiler.query_kernel_profiler_info("sum_squares").counter == 4
        assert qd.profiler.query_kernel_profiler_info(serial.name).counter == 4
        assert qd.profiler.query_kernel_profiler_info(loop.name).counter == 3
        records = qd.profiler.kernel_profiler.records()
        calls = [r for r in records if r.kind == "kernel"]
        loops = [r for r in records if r.name == loop.name]
        assert {r.device for r in records} == {"amdgpu"} and len(calls) == 4
        for call, timed in zip(calls, loops):
            assert call.start_ns <= timed.start_ns and timed.duration_ns <= call.duration_ns
    finally:
        qd.init(arch=qd.amdgpu)


def test_dlpack_with_torch_on_rocm(rng):
    torch = pytest.importorskip("torch")
    if torch.version.hip is None or not torch.cuda.is_available():
        pytest.skip("needs torch built for ROCm with a visible GPU")

    @qd.kernel
    def scale_add(y: qd.types.ndarray(dtype=qd.f32, ndim=2), x: qd.types.ndarray(dtype=qd.f32, ndim=2), a: qd.f32):
        for i, j in qd.ndrange(y.shape[0], y.shape[1]):
            y[i, j] += a * x[i, j]

    x0, y0 = rng.uniform(-1, 1, (2, 9, 13)).astype(np.float32)
    x, y = qd.ndarray(qd.f32, (9, 13)), qd.ndarray(qd.f32, (9, 13))
    x.from_numpy(x0)
    y.from_numpy(y0)
    assert x.__dlpack_device__() == (10, 0)
    ty = torch.from_dlpack(y)                               # a view of y's HIP memory
    scale_add(y, x, 0.5)
    np.testing.assert_allclose(ty.cpu().numpy(), y0 + np.float32(0.5) * x0, rtol=1e-6)
    tx = torch.from_dlpack(x.__dlpack__(copy=True))         # a copy: x stays as it is
    tx.mul_(2.0)
    np.testing.assert_array_equal(x.to_numpy(), x0)
    t = torch.from_numpy(y0.T.copy()).cuda().T                # a strided ROCm tensor, through DLPack only
    scale_add(_DLPackOnly(t), x, 1.0)
    np.testing.assert_allclose(t.cpu().numpy(), y0 + x0, rtol=1e-6)


class _DLPackOnly:
    """An array that exposes its memory through DLPack only (no __cuda_array_interface__)."""

    def __init__(self, array):
        self._array = array

    def __dlpack__(self, **kwargs):
        return self._array.__dlpack__(**kwargs)

    def __dlpack_device__(self):
        return self._array.__dlpack_device__()
