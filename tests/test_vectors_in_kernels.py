"""Vectors, matrices and dtypes inside kernels, as a user meets them in the first hour:
ndarrays of vectors, the class constructors (``qd.Matrix.identity`` ...), component stores
(``v.x = ...``), calling a vector type (``vec3(a, b, c)``), f16 fields, vector return values and
vector parameters. Every kernel here is also compiled for CUDA by the suite (tests/conftest.py);
the ``cuda``-marked tests run them on a GPU. References are numpy, on random data.
"""

from __future__ import annotations

import numpy as np
import pytest

import qd_numba as qd

vec3 = qd.types.vector(3, qd.f32)
mat2 = qd.types.matrix(2, 2, qd.f64)


@pytest.fixture
def on_cuda():
    qd.init(arch=qd.cuda)
    yield
    qd.init(arch=qd.cpu)


# -- qd.Vector.ndarray / qd.Matrix.ndarray --------------------------------------------------------


def test_vector_and_matrix_ndarrays(rng):
    n = 37
    v = qd.Vector.ndarray(3, qd.f32, (n,))
    m = qd.Matrix.ndarray(2, 2, qd.f64, (n,))
    out = qd.Vector.ndarray(2, qd.f64, n)
    assert isinstance(v, qd.Ndarray) and v.shape == (n,) and v.element_shape == (3,)
    assert m.to_numpy().shape == (n, 2, 2) and m.dtype == qd.f64
    v0 = rng.standard_normal((n, 3)).astype(np.float32)
    m0 = rng.standard_normal((n, 2, 2))
    v.from_numpy(v0)
    m.from_numpy(m0)

    @qd.kernel
    def apply(v: qd.types.ndarray(dtype=vec3, ndim=1), m: qd.types.ndarray(dtype=mat2, ndim=1),
              out: qd.types.ndarray(dtype=qd.types.vector(2, qd.f64), ndim=1)):
        for i in v:
            out[i] = m[i] @ qd.Vector([v[i].x, v[i].z], dt=qd.f64)
            v[i] = v[i] * 2.0

    apply(v, m, out)
    ref = np.einsum("nij,nj->ni", m0, v0[:, [0, 2]].astype(np.float64))
    np.testing.assert_allclose(out.to_numpy(), ref, rtol=1e-12)
    np.testing.assert_array_equal(v.to_numpy(), v0 * 2)


# -- class constructors and methods of captured values --------------------------------------------


def test_class_constructors_in_kernels(rng):
    a = rng.standard_normal((16, 2)).astype(np.float32)
    k = rng.integers(0, 3, 16).astype(np.int32)
    out = np.zeros((16, 4), np.float32)

    @qd.kernel
    def build(a: qd.types.ndarray(dtype=qd.f32, ndim=2), k: qd.types.ndarray(dtype=qd.i32, ndim=1),
              out: qd.types.ndarray(dtype=qd.f32, ndim=2)):
        for i in range(a.shape[0]):
            x = qd.Vector([a[i, 0], a[i, 1]])
            eye = qd.Matrix.identity(qd.f32, 2)
            zero = qd.Matrix.zero(qd.f32, 2, 3)
            out[i, 0] = (eye @ x + qd.Vector.zero(qd.f32, 2)).sum() + zero.sum()
            u = qd.Vector.unit(3, k[i])
            out[i, 1] = u[0] + 2.0 * u[1] + 3.0 * u[2]
            out[i, 2] = (eye * 5.0).trace()
            out[i, 3] = qd.Vector.unit(2, 1, qd.f64)[1]

    build(a, k, out)
    np.testing.assert_allclose(out[:, 0], a.sum(1), rtol=1e-6)
    np.testing.assert_array_equal(out[:, 1], k + 1)
    np.testing.assert_array_equal(out[:, 2:], np.tile([10.0, 1.0], (16, 1)))


def test_methods_of_captured_vectors(rng):
    g = qd.Vector(rng.standard_normal(3).astype(np.float32))
    m = qd.Matrix(rng.standard_normal((2, 3)).astype(np.float32))
    out = np.zeros(5, np.float32)

    @qd.kernel
    def use(out: qd.types.ndarray(dtype=qd.f32, ndim=1)):
        for _ in range(1):
            out[0] = g.norm()
            out[1] = g.x + g.z
            out[2] = m.transpose()[2, 1]
            out[3] = g.n + m.m
            out[4] = g.normalized().dot(g)

    use(out)
    e = g.to_numpy()
    np.testing.assert_allclose(out, [np.linalg.norm(e), e[0] + e[2], m.to_numpy()[1, 2], 6,
                                     np.linalg.norm(e)], rtol=1e-5)
