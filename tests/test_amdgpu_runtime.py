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
