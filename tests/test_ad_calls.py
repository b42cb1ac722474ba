"""Calls inside differentiated kernels (passes/inline_funcs.py): ``@numba.njit`` functions (with
loops, calling each other, using numpy's ufuncs) and qd.math's compositions are inlined, so
their gradients match central finite differences; a call that cannot be inlined is an error
naming it and its line."""

from __future__ import annotations

import math

import numba
import numpy as np
import pytest
from test_ad_matrix import _check

import qd_numba as qd

N = 6


@numba.njit
def _wave(v, k):
    t = 0.0
    for j in range(k):
        t = t + math.sin(v * (j + 1.0)) / (j + 1.0)
    return t


@numba.njit
def _energy(a, b):
    return _wave(a, 3) * math.exp(-b * b) + max(a, b) ** 2


@numba.njit
def _np_energy(a, b):
    return np.sin(a) * np.exp(-b * b) + np.maximum(a, b) ** 2 + np.arctan2(a, 1.5)


def test_njit_callees_are_inlined_and_differentiated(rng):
    x = qd.field(qd.f64, shape=(N,), needs_grad=True)
    y = qd.field(qd.f64, shape=(N,), needs_grad=True)
    loss = qd.field(qd.f64, shape=(), needs_grad=True)

    @qd.kernel
    def total():
        for i in x:
            loss[None] += _energy(x[i], y[i]) + _wave(y[i] * x[i], 2)

    def wave(v, k):
        return sum(np.sin(v * (j + 1.0)) / (j + 1.0) for j in range(k))

    def reference(xs, ys):
        return sum(wave(a, 3) * np.exp(-b * b) + max(a, b) ** 2 + wave(b * a, 2) for a, b in zip(xs, ys))

    _check(total, [x, y], [rng.uniform(-1, 1, N), rng.uniform(-1, 1, N)], loss, reference)
    total()                      # the forward kernel still calls the compiled functions
    np.testing.assert_allclose(loss[None], 2 * reference(x.to_numpy(), y.to_numpy()), rtol=1e-10)


@pytest.mark.no_cuda_compile_check    # the forward kernel: numba-cuda has no numpy ufuncs in device calls
def test_numpy_math_in_njit_callees(rng):
    x = qd.field(qd.f64, shape=(N,), needs_grad=True)
    y = qd.field(qd.f64, shape=(N,), needs_grad=True)
    loss = qd.field(qd.f64, shape=(), needs_grad=True)

    @qd.kernel
    def total():
        for i in x:
            loss[None] += _np_energy(x[i], y[i])

    def reference(xs, ys):
        return np.sum(np.sin(xs) * np.exp(-ys * ys) + np.maximum(xs, ys) ** 2 + np.arctan2(xs, 1.5))

    _check(total, [x, y], [rng.uniform(-1, 1, N), rng.uniform(-1, 1, N)], loss, reference)


def test_qd_math_compositions_are_differentiated(rng):
    a = qd.Vector.field(3, qd.f64, shape=(N,), needs_grad=True)
    b = qd.Vector.field(3, qd.f64, shape=(N,), needs_grad=True)
    loss = qd.field(qd.f64, shape=(), needs_grad=True)

    @qd.kernel
    def total():
        for i in a:
            u = qd.math.normalize(a[i])
            r = qd.math.reflect(b[i], u)
            loss[None] += qd.math.dot(r, a[i]) + qd.math.length(qd.math.cross(u, b[i])) \
                + qd.math.distance(a[i], b[i])

    def reference(av, bv):
        total = 0.0
        for p, q in zip(av, bv):
            u = p / np.linalg.norm(p)
            r = q - 2.0 * (q @ u) * u
            total += r @ p + np.linalg.norm(np.cross(u, q)) + np.linalg.norm(p - q)
        return total

    _check(total, [a, b], [rng.uniform(-1, 1, (N, 3)), rng.uniform(-1, 1, (N, 3))], loss, reference)


def test_a_call_that_cannot_be_inlined_names_the_call():
    x = qd.field(qd.f64, shape=(N,), needs_grad=True)
    loss = qd.field(qd.f64, shape=(), needs_grad=True)

    @qd.kernel
    def keywords():
        for i in x:
            loss[None] += _wave(x[i], k=2)

    with pytest.raises(qd.QuadrantsSyntaxError, match="keywords.grad.*call of '_wave' cannot be differentiated"):
        keywords.grad()


def test_forward_mode_inlines_njit_callees(rng):
    x = qd.field(qd.f64, shape=(N,), needs_dual=True)
    loss = qd.field(qd.f64, shape=(), needs_dual=True)

    @qd.kernel
    def total():
        for i in x:
            loss[None] += _wave(x[i], 3) * x[i]

    xs = rng.uniform(-1, 1, N)
    seed = rng.uniform(-1, 1, N)
    x.from_numpy(xs)
    with qd.ad.FwdMode(loss=loss, param=x, seed=list(seed)):
        total()

    def reference(v):
        return sum(sum(math.sin(a * (j + 1.0)) / (j + 1.0) for j in range(3)) * a for a in v)

    expected = (reference(xs + 1e-6 * seed) - reference(xs - 1e-6 * seed)) / 2e-6
    np.testing.assert_allclose(loss.dual[None], expected, rtol=1e-7)
