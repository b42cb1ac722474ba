"""Forward-mode autodiff (passes/forward_mode.py, qd.ad.FwdMode): directional derivatives
against central finite differences in f64 on random data — every op of the rule table, loops
(the anchor, a while loop), branches, stores into fields with duals — and the error paths."""

from __future__ import annotations

import numpy as np
import pytest
from test_math_ops import _inputs

import qd_numba as qd
from qd_numba import math as qd_math
from qd_numba.ops.math_ops import MATH_OPS

N = 16


def _directional(f, x, seed, eps=1e-6):
    return (f(x + eps * seed) - f(x - eps * seed)) / (2 * eps)


@pytest.mark.parametrize("name", sorted(MATH_OPS))
def test_every_math_op_directional_derivative(name, rng):
    op = MATH_OPS[name]
    fn = getattr(qd_math, name)
    args = _inputs(name, op.arity, rng, N)
    xs = tuple(qd.field(qd.f64, shape=(N,), needs_dual=True) for _ in range(3))
    loss = qd.field(qd.f64, shape=(), needs_dual=True)

    @qd.kernel
    def compute(f: qd.template(), arity: qd.template()):
        for i in range(N):
            if qd.static(arity == 1):
                loss[None] += f(xs[0][i]) * 1.5
            elif qd.static(arity == 2):
                loss[None] += f(xs[0][i], xs[1][i]) * 1.5
            else:
                loss[None] += f(xs[0][i], xs[1][i], xs[2][i]) * 1.5

    for x, a in zip(xs, args):
        x.from_numpy(a)
    for k in range(op.arity):
        seed = rng.uniform(-1, 1, N)
        loss[None] = 0
        with qd.ad.FwdMode(loss=loss, param=xs[k], seed=list(seed)):
            compute(fn, op.arity)

        def f(xk, k=k):
            return 1.5 * np.sum(op.numpy(*[xk if j == k else args[j] for j in range(op.arity)]))

        np.testing.assert_allclose(loss.dual[None], _directional(f, args[k], seed), rtol=1e-5, atol=1e-6,
                                   err_msg=f"d {name} / d arg{k}")
        np.testing.assert_allclose(loss[None], f(args[k]), rtol=1e-10)   # the primal runs too
        assert np.all(xs[k].dual.to_numpy() == 0)                        # the seed is cleared on exit


def test_loops_branches_and_stores_into_duals(rng):
    x = qd.field(qd.f64, shape=(N,), needs_dual=True)
    y = qd.field(qd.f64, shape=(N,), needs_dual=True)
    n = qd.field(qd.i32, shape=())
    loss = qd.field(qd.f64, shape=(), needs_dual=True)

    @qd.kernel
    def simulate(scale: qd.f64):
        for i in x:
            v = x[i]
            for _ in range(n[None]):            # the anchor's loop
                v = qd.sin(v) * 1.01
            while v < 2.0:                      # a data-dependent trip count
                v = v * 1.5 + 0.25
            if v > 3.0:
                v = qd.sqrt(v) * scale
            else:
                v = v * v
            y[i] = v + float(int(v))            # an integer cast carries no tangent

    @qd.kernel
    def total():
        for i in y:
            loss[None] += y[i] * y[i]

    def forward(xs):
        ys = []
        for v in xs:
            for _ in range(9):
                v = np.sin(v) * 1.01
            while v < 2.0:
                v = v * 1.5 + 0.25
            v = np.sqrt(v) * 0.7 if v > 3.0 else v * v
            ys.append(v + float(int(v)))
        return np.array(ys)

    xs = rng.uniform(0.2, 1.5, N)
    seed = rng.uniform(-1, 1, N)
    x.from_numpy(xs)
    n[None] = 9
    loss[None] = 0
    with qd.ad.FwdMode(loss=loss, param=x, seed=list(seed)):
        simulate(0.7)
        total()
    np.testing.assert_allclose(y.dual.to_numpy(), _directional(forward, xs, seed, 1e-7), rtol=1e-5, atol=1e-7)
    np.testing.assert_allclose(loss.dual[None], _directional(lambda a: np.sum(forward(a) ** 2), xs, seed, 1e-7),
                               rtol=1e-5)


def test_scalar_param_takes_the_default_seed(rng):
    s = qd.field(qd.f64, shape=(), needs_dual=True)
    loss = qd.field(qd.f64, shape=(), needs_dual=True)
    values = rng.uniform(-1, 1, N)

    @qd.kernel
    def scaled(a: qd.types.ndarray(dtype=qd.f64, ndim=1)):
        for i in range(N):
            loss[None] += qd.exp(s[None] * a[i])

    s[None] = 0.3
    with qd.ad.FwdMode(loss=loss, param=s):
        scaled(values)
    np.testing.assert_allclose(loss.dual[None], np.sum(values * np.exp(0.3 * values)), rtol=1e-12)


def test_errors():
    x = qd.field(qd.f64, shape=(N,), needs_dual=True)
    plain = qd.field(qd.f64, shape=())
    loss = qd.field(qd.f64, shape=(), needs_dual=True)
    with pytest.raises(qd.QuadrantsSyntaxError, match="needs_dual=True"):
        qd.ad.FwdMode(loss=plain, param=x, seed=[1.0] * N)
    with pytest.raises(qd.QuadrantsSyntaxError, match="seed has 2 values, param has 16"):
        qd.ad.FwdMode(loss=loss, param=x, seed=[1.0, 2.0])
    with pytest.raises(qd.QuadrantsSyntaxError, match="give a seed"):
        qd.ad.FwdMode(loss=loss, param=x)
    with pytest.raises(qd.QuadrantsTypeError, match="needs_dual=True requires a floating-point"):
        qd.field(qd.i32, shape=(), needs_dual=True)


def test_vector_and_matrix_constructors(rng):
    """Constructors are linear: ``qd.Vector([...])``, ``qd.Matrix([[...], ...])``,
    ``qd.math.vec3(a, b, c)`` carry the tangents of their elements (constants: zero);
    ``qd.Vector.zero`` is a constant."""
    p = qd.field(qd.f64, shape=(N,), needs_dual=True)
    loss = qd.field(qd.f64, shape=(), needs_dual=True)

    @qd.kernel
    def built():
        for i in p:
            a = p[i]
            v = qd.Vector([a, a * a, qd.sin(a)])
            m = qd.Matrix([[a, 1.0], [2.0, a * a]])
            w = qd.math.vec3(a, 0.5, a * a * a)
            loss[None] += v.dot(w) + (m @ m).trace() + qd.Vector.zero(qd.f64, 3).sum()

    def reference(a):
        return (a * a + 0.5 * a * a + np.sin(a) * a ** 3 + a * a + 4.0 + a ** 4).sum()

    ps, seed = rng.uniform(-1, 1, N), rng.uniform(-1, 1, N)
    p.from_numpy(ps)
    with qd.ad.FwdMode(loss=loss, param=p, seed=list(seed)):
        built()
    # qd.math.vec3 is an f32 vector (the default float): f32 rounding in v.dot(w)
    np.testing.assert_allclose(loss[None], reference(ps), rtol=1e-6)
    np.testing.assert_allclose(loss.dual[None], _directional(reference, ps, seed), rtol=1e-6)
