"""Reverse-mode autodiff of vector and matrix code (passes/autodiff.py with the adjoint rules of
ops/matrix_methods.py, ops/math_ops.py and lowering/autodiff.py): construction, arithmetic,
``@``, every method with a rule, and vector/matrix fields read, written and atomically added —
gradients against central finite differences of a numpy reference, in f64 on random data."""

from __future__ import annotations

import numpy as np
import pytest
from test_autodiff import _central_differences

import qd_numba as qd
from qd_numba.ops.matrix_methods import MATRIX_METHODS

N = 6


def _check(kernel, fields, values, loss, reference, rtol=1e-6):
    for f, v in zip(fields, values):
        f.from_numpy(v)
    with qd.ad.Tape(loss=loss):
        kernel()
    np.testing.assert_allclose(loss[None], reference(*values), rtol=1e-8)
    for f, g in zip(fields, _central_differences(reference, [v.copy() for v in values])):
        np.testing.assert_allclose(f.grad.to_numpy(), g, rtol=rtol, atol=1e-8)


def test_every_matrix_method_has_an_adjoint_rule():
    assert all(row.adjoint is not None for row in MATRIX_METHODS.values())


def test_vector_methods_and_arithmetic(rng):
    a = qd.Vector.field(3, qd.f64, shape=(N,), needs_grad=True)
    b = qd.Vector.field(3, qd.f64, shape=(N,), needs_grad=True)
    s = qd.field(qd.f64, shape=(N,), needs_grad=True)
    loss = qd.field(qd.f64, shape=(), needs_grad=True)

    @qd.kernel
    def vectors():
        for i in a:
            u, v = a[i], b[i]
            w = u * s[i] + v / (1.5 + s[i] * s[i]) - 0.5 * u
            c = u.cross(v)
            d = w.normalized()
            loss[None] += u.dot(v) * s[i] + w.norm() + c.norm_sqr() + d.dot(v) + (u * v).sum() \
                + w.max() * 0.3 - c.min() + u.outer_product(v).trace() * w[1] + v.norm(1e-3)

    def reference(av, bv, sv):
        total = 0.0
        for u, v, t in zip(av, bv, sv):
            w = u * t + v / (1.5 + t * t) - 0.5 * u
            c = np.cross(u, v)
            d = w / np.linalg.norm(w)
            total += u @ v * t + np.linalg.norm(w) + c @ c + d @ v + (u * v).sum() + w.max() * 0.3 - c.min() \
                + np.trace(np.outer(u, v)) * w[1] + np.sqrt(v @ v + 1e-3)
        return total

    _check(vectors, [a, b, s], [rng.uniform(-1, 1, (N, 3)), rng.uniform(-1, 1, (N, 3)), rng.uniform(-1, 1, N)],
           loss, reference)


def test_matrix_construction_matmul_and_methods(rng):
    m = qd.Matrix.field(3, 3, qd.f64, shape=(N,), needs_grad=True)
    v = qd.Vector.field(3, qd.f64, shape=(N,), needs_grad=True)
    s = qd.field(qd.f64, shape=(N,), needs_grad=True)
    loss = qd.field(qd.f64, shape=(), needs_grad=True)

    @qd.kernel
    def matrices():
        for i in m:
            a = m[i]
            t = s[i]
            r = qd.Matrix([[qd.cos(t), -qd.sin(t)], [qd.sin(t), qd.cos(t)]])
            p = qd.Vector([v[i][0], v[i][1] * t])
            q = r @ p
            k = a @ a.transpose() + qd.Matrix.identity(qd.f64, 3) * 2.0
            y = k.inverse() @ v[i]
            z = qd.math.vec3(t, q[0], q[1])
            loss[None] += q.dot(p) + y.sum() + k.determinant() * 0.1 + (z @ a).sum() + (p @ r).norm() \
                + a.trace() * t

    def reference(mv, vv, sv):
        total = 0.0
        for a, w, t in zip(mv, vv, sv):
            r = np.array([[np.cos(t), -np.sin(t)], [np.sin(t), np.cos(t)]])
            p = np.array([w[0], w[1] * t])
            q = r @ p
            k = a @ a.T + 2.0 * np.eye(3)
            y = np.linalg.inv(k) @ w
            z = np.array([t, q[0], q[1]])
            total += q @ p + y.sum() + np.linalg.det(k) * 0.1 + (z @ a).sum() + np.linalg.norm(p @ r) + np.trace(a) * t
        return total

    _check(matrices, [m, v, s], [rng.uniform(-1, 1, (N, 3, 3)), rng.uniform(-1, 1, (N, 3)), rng.uniform(-1, 1, N)],
           loss, reference)


def test_vector_fields_written_and_atomically_added(rng):
    x = qd.Vector.field(2, qd.f64, shape=(N,), needs_grad=True)
    y = qd.Vector.field(2, qd.f64, shape=(N,), needs_grad=True)
    acc = qd.Matrix.field(2, 2, qd.f64, shape=(2,), needs_grad=True)
    loss = qd.field(qd.f64, shape=(), needs_grad=True)

    @qd.kernel
    def step():
        for i in x:
            u = x[i]
            y[i] = qd.Vector([u[0] * u[1], qd.exp(u[0])])
            acc[i % 2] += u.outer_product(u) * 0.5

    @qd.kernel
    def total():
        for i in y:
            loss[None] += y[i].norm_sqr() + (acc[i % 2] @ y[i]).sum()

    def reference(xv):
        yv = np.stack([xv[:, 0] * xv[:, 1], np.exp(xv[:, 0])], axis=1)
        accv = np.zeros((2, 2, 2))
        for i in range(N):
            accv[i % 2] += 0.5 * np.outer(xv[i], xv[i])
        return sum(yv[i] @ yv[i] + (accv[i % 2] @ yv[i]).sum() for i in range(N))

    def both():
        step()
        total()

    for f in (y, acc):
        f.fill(0)
    _check(both, [x], [rng.uniform(-1, 1, (N, 2))], loss, reference)


@pytest.mark.parametrize("n", [2, 3])
def test_cross_products_of_2d_and_3d_vectors(n, rng):
    a = qd.Vector.field(n, qd.f64, shape=(N,), needs_grad=True)
    b = qd.Vector.field(n, qd.f64, shape=(N,), needs_grad=True)
    loss = qd.field(qd.f64, shape=(), needs_grad=True)

    @qd.kernel
    def cross():
        for i in a:
            c = a[i].cross(b[i]) * 2.0
            if qd.static(n == 3):
                loss[None] += qd.sin(c).sum()
            else:
                loss[None] += qd.sin(c)

    def reference(av, bv):
        c = np.cross(av, bv) if n == 3 else av[:, 0] * bv[:, 1] - av[:, 1] * bv[:, 0]
        return np.sin(2.0 * c).sum()

    _check(cross, [a, b], [rng.uniform(-1, 1, (N, n)), rng.uniform(-1, 1, (N, n))], loss, reference)


def test_forward_mode_matmul(rng):
    m = qd.Matrix.field(2, 2, qd.f64, shape=(N,), needs_dual=True)
    p = qd.field(qd.f64, shape=(), needs_dual=True)
    loss = qd.field(qd.f64, shape=(), needs_dual=True)

    @qd.kernel
    def products():
        for i in m:
            a = m[i] * p[None]
            loss[None] += (a @ a)[0, 1] + (m[i] @ a.transpose() @ m[i])[1, 1]

    mv = rng.uniform(-1, 1, (N, 2, 2))
    m.from_numpy(mv)
    p[None] = 0.7
    with qd.ad.FwdMode(loss=loss, param=p):
        products()

    def reference(t):
        return sum(((a * t) @ (a * t))[0, 1] + (a @ (a * t).T @ a)[1, 1] for a in mv)

    np.testing.assert_allclose(loss.dual[None], (reference(0.7 + 1e-6) - reference(0.7 - 1e-6)) / 2e-6, rtol=1e-7)


def test_vectors_and_matrices_inside_inner_loops(rng, arch):
    x = qd.Vector.field(2, qd.f64, shape=(N,), needs_grad=True)
    k = qd.field(qd.f64, shape=(), needs_grad=True)
    loss = qd.field(qd.f64, shape=(), needs_grad=True)

    @qd.kernel
    def forces(n: qd.i32):
        for i in x:
            f = qd.Vector([0.0, 0.0], dt=qd.f64)
            for j in range(n):
                d = x[j] - x[i]
                r = d.norm(1e-2)
                f += d * (k[None] / (r * r * r))
                m = d.outer_product(d)
                f = f + m @ f * 0.01
            loss[None] += f.norm_sqr()

    def reference(xv, kv):
        total = 0.0
        for i in range(N):
            f = np.zeros(2)
            for j in range(N):
                d = xv[j] - xv[i]
                r = np.sqrt(d @ d + 1e-2)
                f = f + d * (kv / r ** 3)
                f = f + np.outer(d, d) @ f * 0.01
            total += f @ f
        return total

    _check(lambda: forces(N), [x, k], [rng.uniform(-1, 1, (N, 2)), np.array(0.7)], loss, reference, rtol=1e-5)
    # per inner iteration: the body's 15 words (its path record, then what the adjoints read: d (2
    # words), r, r*r, r*r*r, f (2), m (4), ...; no value only the adjoint of a constant reads, such
    # as m @ f for 0.01), collected by the sizer (the loop header's executions are counted)
    if arch == "cpu":   # the CPU instance's compile state (the size is the same on CUDA)
        assert forces.grad.last_instance.state.adstacks[0].size_text == "(15 * (max(0, n) + 1))"


def test_a_vector_of_unknown_shape_inside_an_inner_loop_is_an_error():
    x = qd.field(qd.f64, shape=(N,), needs_grad=True)
    loss = qd.field(qd.f64, shape=(), needs_grad=True)

    @qd.kernel
    def unknown(a: qd.types.ndarray(dtype=qd.math.vec2, ndim=1)):
        for i in x:
            v = a[0] * x[i]
            for j in range(2):
                v = a[j] * v.sum()
            loss[None] += v.sum()

    a = qd.Vector.ndarray(2, qd.f32, shape=(2,))
    with pytest.raises(qd.QuadrantsTypeError, match="unknown.grad.*shape the adstack sizer cannot tell"):
        unknown.grad(a)
