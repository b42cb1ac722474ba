"""Float literals in kernels are ``default_fp`` constants, as in Quadrants (typing/literals.py,
passes/float_literals.py): f32 arithmetic with literals stays f32 (bit for bit numpy's float32),
an f64 operand meets the exact f64 literal (bit for bit numpy's float64), an integer with a
literal computes in ``default_fp``."""

from __future__ import annotations

import numpy as np
import pytest

import qd_numba as qd

N = 64
f32 = np.float32
SCALE = 0.3      # a global Python float: a literal too


def _arr(dtype, ndim=1):
    return qd.types.ndarray(dtype=dtype, ndim=ndim)


@pytest.fixture
def reinit(arch):
    yield lambda **options: qd.init(arch=getattr(qd, arch), **options)
    qd.init(arch=getattr(qd, arch))


def test_f32_arithmetic_with_literals_is_float32(rng):
    @qd.kernel
    def compute(x: _arr(qd.f32), out: _arr(qd.f64)):
        for i in range(x.shape[0]):
            v = x[i]
            v = v * 0.1 + 0.7
            v -= 0.3
            v = v / 3.0 - SCALE
            v *= 1.1
            out[i] = v

    x = rng.uniform(-2, 2, N).astype(f32)
    out = np.zeros(N)
    compute(x, out)
    v = x * f32(0.1) + f32(0.7)
    v = v - f32(0.3)
    v = (v / f32(3.0) - f32(SCALE)) * f32(1.1)
    np.testing.assert_array_equal(out, v.astype(np.float64))
    f64_result = ((x.astype(np.float64) * 0.1 + 0.7 - 0.3) / 3.0 - SCALE) * 1.1
    assert not np.array_equal(out, f64_result)     # the f64 computation would differ


def test_f64_arithmetic_with_literals_is_exact(rng):
    @qd.kernel
    def compute(x: _arr(qd.f64), out: _arr(qd.f64)):
        for i in range(x.shape[0]):
            v = x[i] * 0.1 + 0.7
            v -= 0.3
            out[i] = v / 3.0 + SCALE * x[i]

    x = rng.uniform(-2, 2, N)
    out = np.zeros(N)
    compute(x, out)
    np.testing.assert_array_equal(out, (x * 0.1 + 0.7 - 0.3) / 3.0 + SCALE * x)


def test_integer_with_literal_computes_in_default_fp(rng):
    @qd.kernel
    def compute(k: _arr(qd.i32), out: _arr(qd.f64), out_div: _arr(qd.f64)):
        for i in range(k.shape[0]):
            out[i] = i * 0.1 + k[i] * 0.7
            out_div[i] = k[i] / 3.0

    k = rng.integers(-1000, 1000, N).astype(np.int32)
    out, out_div = np.zeros(N), np.zeros(N)
    compute(k, out, out_div)
    idx = np.arange(N).astype(f32)
    np.testing.assert_array_equal(out, (idx * f32(0.1) + k.astype(f32) * f32(0.7)).astype(np.float64))
    np.testing.assert_array_equal(out_div, (k.astype(f32) / f32(3.0)).astype(np.float64))


def test_default_fp_f64_makes_literals_f64(reinit, rng):
    @qd.kernel
    def compute(x: _arr(qd.f32), k: _arr(qd.i32), out: _arr(qd.f64)):
        for i in range(x.shape[0]):
            out[i] = x[i] * 0.1 + k[i] * 0.7

    x = rng.uniform(-2, 2, N).astype(f32)
    k = rng.integers(-1000, 1000, N).astype(np.int32)
    out = np.zeros(N)
    reinit(default_fp=qd.f64)
    compute(x, k, out)
    np.testing.assert_array_equal(out, x.astype(np.float64) * 0.1 + k * 0.7)
    reinit(default_fp=qd.f16)      # f16 values compute in f32: so do literals
    compute(x, k, out)
    np.testing.assert_array_equal(out, (x * f32(0.1) + k.astype(f32) * f32(0.7)).astype(np.float64))
    reinit(default_fp=qd.f32)
    compute(x, k, out)
    np.testing.assert_array_equal(out, (x * f32(0.1) + k.astype(f32) * f32(0.7)).astype(np.float64))


@qd.func
def _affine(a):
    return a * 0.5 + 0.25


def test_literals_in_funcs_static_loops_and_math(rng):
    @qd.kernel
    def compute(x: _arr(qd.f32), out: _arr(qd.f64), out2: _arr(qd.f64)):
        for i in range(x.shape[0]):
            v = x[i]
            for _ in range(3):
                v = qd.sin(v) * 0.9 + 0.1
            out[i] = v
            u = _affine(x[i])
            for j in qd.static(range(3)):
                u += 0.125 * j
            out2[i] = qd.sqrt(u + 2.0) - qd.max(u, 0.5)

    x = rng.uniform(-2, 2, N).astype(f32)
    out, out2 = np.zeros(N), np.zeros(N)
    compute(x, out, out2)
    v = x.copy()
    for _ in range(3):
        v = np.sin(v) * f32(0.9) + f32(0.1)
    assert v.dtype == f32
    np.testing.assert_allclose(out, v, rtol=2e-6, atol=1e-6)    # f32 sin: libm and numpy may differ by an ulp
    u = x * f32(0.5) + f32(0.25)
    for j in range(3):
        u = u + f32(0.125 * j)
    np.testing.assert_array_equal(out2, (np.sqrt(u + f32(2.0)) - np.maximum(u, f32(0.5))).astype(np.float64))


def test_literals_in_comparisons_ternaries_and_vectors(rng):
    @qd.kernel
    def compute(x: _arr(qd.f32), y: _arr(qd.f64), out: _arr(qd.f64), out64: _arr(qd.f64), flags: _arr(qd.i32)):
        for i in range(x.shape[0]):
            c = 1.5 if x[i] > 0.1 else x[i] * 0.3
            w = qd.Vector([0.5, 1.0]) * x[i] + qd.Vector([x[i], 0.2])
            out[i] = c + w[0] - w[1] / 3.0
            d = qd.Vector([y[i], y[i] * 2.0]) * 0.1
            out64[i] = d[0] + d[1] + qd.Vector([y[i], 1.0], dt=qd.f64).norm(1e-2)
            flags[i] = 1 if x[i] * 0.5 <= 0.25 else 0

    x = rng.uniform(-1, 1, N).astype(f32)
    y = rng.uniform(-1, 1, N)
    out, out64, flags = np.zeros(N), np.zeros(N), np.zeros(N, np.int32)
    compute(x, y, out, out64, flags)
    c = np.where(x > f32(0.1), f32(1.5), x * f32(0.3))
    w0, w1 = f32(0.5) * x + x, f32(1.0) * x + f32(0.2)
    np.testing.assert_array_equal(out, (c + w0 - w1 / f32(3.0)).astype(np.float64))
    np.testing.assert_array_equal(out64, y * 0.1 + (y * 2.0) * 0.1 + np.sqrt(y * y + 1.0 + 1e-2))
    np.testing.assert_array_equal(flags, (x * f32(0.5) <= f32(0.25)).astype(np.int32))


def test_vector_of_literals_takes_default_fp(reinit, rng):
    @qd.kernel
    def compute(out: _arr(qd.f64), exact: _arr(qd.f64)):
        for i in range(out.shape[0]):
            w = qd.Vector([0.1, 0.7]) * 3.0
            out[i] = w[0] + w[1]
            u = qd.Matrix([[0.1, 0.7], [0.3, 1.0]], dt=qd.f64) @ qd.Vector([exact[i], exact[i]], dt=qd.f64)
            exact[i] = u[0] + u[1]

    out = np.zeros(4)
    y = rng.uniform(-1, 1, 4)
    exact = y.copy()
    compute(out, exact)
    np.testing.assert_array_equal(out, np.full(4, np.float64(f32(0.1) * f32(3.0) + f32(0.7) * f32(3.0))))
    np.testing.assert_array_equal(exact, (0.1 * y + 0.7 * y) + (0.3 * y + 1.0 * y))   # dt=qd.f64: exact
    exact = y.copy()
    reinit(default_fp=qd.f64)
    compute(out, exact)
    np.testing.assert_array_equal(out, np.full(4, 0.1 * 3.0 + 0.7 * 3.0))


def test_reassigned_variable_follows_numba_unification(rng):
    """``v = 0.5`` then ``v = v * x_f64``: v is f64 (Numba unifies; Quadrants would keep f32)."""
    @qd.kernel
    def compute(x: _arr(qd.f64), out: _arr(qd.f64)):
        for i in range(x.shape[0]):
            v = 0.1
            for _ in range(2):
                v = v * x[i]
            out[i] = v

    x = rng.uniform(-2, 2, N)
    out = np.zeros(N)
    compute(x, out)
    np.testing.assert_array_equal(out, 0.1 * x * x)


def test_gradient_of_kernel_with_literals_matches_finite_differences(rng):
    x = qd.field(qd.f64, shape=(N,), needs_grad=True)
    loss = qd.field(qd.f64, shape=(), needs_grad=True)

    @qd.kernel
    def compute():
        for i in range(N):
            v = qd.sin(x[i]) * 0.9 + 0.1
            loss[None] += v * v * 0.5 + x[i] / 3.0

    a = rng.uniform(-2, 2, N)
    x.from_numpy(a)
    with qd.ad.Tape(loss=loss):
        compute()

    def f(a):
        v = np.sin(a) * 0.9 + 0.1
        return np.sum(v * v * 0.5 + a / 3.0)

    eps = 1e-6
    fd = np.array([(f(a + eps * e) - f(a - eps * e)) / (2 * eps) for e in np.eye(N)])
    np.testing.assert_allclose(loss[None], f(a), rtol=1e-12)
    np.testing.assert_allclose(x.grad.to_numpy(), fd, rtol=1e-6, atol=1e-8)


def test_gradient_of_f32_kernel_with_literals(rng):
    x = qd.field(qd.f32, shape=(N,), needs_grad=True)
    loss = qd.field(qd.f32, shape=(), needs_grad=True)

    @qd.kernel
    def compute():
        for i in range(N):
            loss[None] += x[i] * x[i] * 0.25 + 0.5 * x[i]

    a = rng.uniform(-2, 2, N).astype(f32)
    x.from_numpy(a)
    with qd.ad.Tape(loss=loss):
        compute()
    np.testing.assert_allclose(x.grad.to_numpy(), a * f32(0.5) + f32(0.5), rtol=1e-6)
