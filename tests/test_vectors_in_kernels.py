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
