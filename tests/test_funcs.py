"""@qd.func inlining, templates, njit calls, recursion, tasks from funcs, math builtins."""

import math

import numba
import numpy as np
import pytest

import qd_numba as qd


@numba.njit
def nj_cube(x):
    return x * x * x


@qd.func
def clamp_add(a, b, lo: qd.template()):
    r = a + b
    if r < lo:
        r = lo
    return r


@qd.func
def uses_njit(v):
    return nj_cube(v) - 1.0


@qd.func
def fill_scaled(dst: qd.template(), src: qd.template(), k):
    for i in src:
        dst[i] = src[i] * k


@qd.kernel
def funcs_kernel(a: qd.types.ndarray(dtype=qd.f64, ndim=1), b: qd.types.ndarray(dtype=qd.f64, ndim=1),
                 out: qd.types.ndarray(dtype=qd.f64, ndim=2)):
    for i in range(a.shape[0]):
        out[i, 0] = clamp_add(a[i], b[i], 0)
        out[i, 1] = uses_njit(a[i])
        out[i, 2] = nj_cube(b[i])
        out[i, 3] = math.sin(a[i]) + abs(b[i]) + min(a[i], b[i]) + max(a[i], b[i])


@qd.kernel
def njit_kernel(a: qd.types.ndarray(dtype=qd.f64, ndim=1), out: qd.types.ndarray(dtype=qd.f64, ndim=1)):
    for i in range(a.shape[0]):
        out[i] = nj_cube(a[i]) + math.sin(a[i]) + abs(a[i]) + min(a[i], 0.25) + max(a[i], -0.25)


def test_njit_from_kernel(rng):
    a = rng.uniform(-2, 2, 15)
    out = rng.uniform(-1, 1, 15)
    njit_kernel(a, out)
    ref = a**3 + np.sin(a) + np.abs(a) + np.minimum(a, 0.25) + np.maximum(a, -0.25)
    np.testing.assert_allclose(out, ref, rtol=1e-12, atol=1e-12)




def test_funcs_and_njit(rng):
    a = rng.uniform(-2, 2, 15)
    b = rng.uniform(-2, 2, 15)
    out = rng.uniform(-1, 1, (15, 4))
    funcs_kernel(a, b, out)
    ref = np.stack([np.maximum(a + b, 0), a**3 - 1, b**3,
                    np.sin(a) + np.abs(b) + np.minimum(a, b) + np.maximum(a, b)], axis=1)
    np.testing.assert_allclose(out, ref, rtol=1e-12, atol=1e-12)


src_f = qd.field(qd.f32, shape=(9,))
dst_f = qd.field(qd.f32, shape=(9,))
dst_g = qd.field(qd.f32, shape=(9,))


@qd.kernel
def tasks_from_func(k: qd.f32):
    fill_scaled(dst_f, src_f, k)
    fill_scaled(dst_g, dst_f, k)


def test_func_loops_become_tasks(rng):
    d = rng.uniform(-3, 3, 9).astype(np.float32)
    src_f.from_numpy(d)
    tasks_from_func(2.0)
    np.testing.assert_allclose(dst_f.to_numpy(), d * 2, rtol=1e-6)
    np.testing.assert_allclose(dst_g.to_numpy(), d * 4, rtol=1e-6)
    kinds = [t.kind for t in tasks_from_func.tasks(2.0)]
    assert kinds == ["range_for", "range_for"]


@qd.func
def rec(n):
    r = 0
    if n > 0:
        r = n + rec(n - 1)
    return r


@qd.kernel
def recursive_kernel(n: qd.i32) -> qd.i32:
    return rec(n)


def test_recursion_is_syntax_error():
    with pytest.raises(qd.QuadrantsSyntaxError):
        recursive_kernel(3)


def test_func_called_from_python_errors():
    with pytest.raises(qd.QuadrantsSyntaxError):
        rec(3)


@qd.kernel
def fused_math(x: qd.types.ndarray(dtype=qd.f32, ndim=1), y: qd.types.ndarray(dtype=qd.f32, ndim=1)):
    for i in x:
        v = x[i]
        y[i] = math.sqrt(abs(v)) * math.cos(v) + max(v, 0.5) - min(v, -0.5) + math.exp(-v * v)


def test_math_builtins_f32(rng):
    x = rng.uniform(-3, 3, 21).astype(np.float32)
    y = np.zeros(21, np.float32) + 5
    fused_math(x, y)
    ref = (np.sqrt(np.abs(x)) * np.cos(x) + np.maximum(x, 0.5) - np.minimum(x, -0.5) + np.exp(-x * x))
    np.testing.assert_allclose(y, ref, rtol=1e-5, atol=1e-5)
