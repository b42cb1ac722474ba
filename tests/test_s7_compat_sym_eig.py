"""``qd.sym_eig`` and ``qd.make_spd`` for every size Quadrants 1.4 supports (2x2 to 6x6, cyclic
Jacobi), f32 and f64, in kernels and in Python scope, against ``numpy.linalg.eigh``."""

import numpy as np
import pytest

import qd_numba as qd
from qd_numba.errors import QuadrantsTypeError

BATCH = 16


@pytest.mark.parametrize("n", [2, 3, 4, 5, 6])
@pytest.mark.parametrize("dt", [qd.f32, qd.f64], ids=["f32", "f64"])
def test_sym_eig_and_make_spd_every_size(n, dt, rng):
    tol = 1e-5 if dt == qd.f32 else 1e-12
    A = qd.Matrix.field(n, n, dt, shape=BATCH)
    W = qd.Vector.field(n, dt, shape=BATCH)
    Q, S = qd.Matrix.field(n, n, dt, shape=BATCH), qd.Matrix.field(n, n, dt, shape=BATCH)

    @qd.kernel
    def decompose():
        for i in A:
            W[i], Q[i] = qd.sym_eig(A[i])
            S[i] = qd.make_spd(A[i])

    a = rng.normal(size=(BATCH, n, n))
    a = a + a.transpose(0, 2, 1)
    A.from_numpy(a)
    decompose()
    a = A.to_numpy().astype(np.float64)      # the matrices as stored (f32 rounding)
    w, q, s = (f.to_numpy().astype(np.float64) for f in (W, Q, S))
    ref_w, ref_q = np.linalg.eigh(a)
    assert np.all(np.diff(w, axis=1) >= 0)                                          # ascending
    np.testing.assert_allclose(w, ref_w, rtol=10 * tol, atol=10 * tol)
    np.testing.assert_allclose(a @ q, q * w[:, None, :], atol=20 * tol)             # A Q = Q diag(w)
    np.testing.assert_allclose(q.transpose(0, 2, 1) @ q, np.broadcast_to(np.eye(n), a.shape), atol=10 * tol)
    spd = ref_q @ (np.maximum(ref_w, 0)[:, :, None] * ref_q.transpose(0, 2, 1))
    np.testing.assert_allclose(s, spd, atol=20 * tol)


@pytest.mark.parametrize("n", [4, 6])
def test_sym_eig_in_python_scope(n, rng):
    a = rng.normal(size=(n, n))
    a = a + a.T
    w, Q = qd.sym_eig(qd.Matrix(a, dt=qd.f64))
    w, Q = w.to_numpy(), Q.to_numpy()
    np.testing.assert_allclose(w, np.linalg.eigvalsh(a), atol=1e-12)
    np.testing.assert_allclose(a @ Q, Q * w, atol=1e-12)
    ref_w, ref_q = np.linalg.eigh(a)
    np.testing.assert_allclose(qd.make_spd(qd.Matrix(a, dt=qd.f64)).to_numpy(),
                               ref_q @ np.diag(np.maximum(ref_w, 0)) @ ref_q.T, atol=1e-12)


def test_sym_eig_of_repeated_eigenvalues(rng):
    """A matrix with a double eigenvalue: the eigenvectors still form an orthonormal basis."""
    q, _ = np.linalg.qr(rng.normal(size=(5, 5)))
    lam = np.array([-1.0, 2.0, 2.0, 3.5, 0.25])
    a = q @ np.diag(lam) @ q.T
    a = (a + a.T) / 2
    w, Q = qd.sym_eig(qd.Matrix(a, dt=qd.f64))
    np.testing.assert_allclose(w.to_numpy(), np.sort(lam), atol=1e-12)
    np.testing.assert_allclose(Q.to_numpy().T @ Q.to_numpy(), np.eye(5), atol=1e-12)


def test_sym_eig_larger_than_6_is_our_error_naming_the_size():
    big = qd.Matrix.field(7, 7, qd.f32, shape=2)

    @qd.kernel
    def too_big():
        for i in big:
            w, q = qd.sym_eig(big[i])

    with pytest.raises(QuadrantsTypeError,
                       match=r"(?s)kernel 'too_big'.*qd.sym_eig takes a 2x2 to 6x6 matrix, got matrix\(7, 7.*line 72.*"
                             r"qd.sym_eig\(big\[i\]\)"):
        too_big()
    with pytest.raises(QuadrantsTypeError, match=r"qd.make_spd takes a 2x2 to 6x6 matrix, got a 7x7 matrix"):
        qd.make_spd(qd.Matrix(np.eye(7)))
