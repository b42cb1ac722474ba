"""Reverse-mode autodiff (passes/autodiff.py, qd.ad): gradients against central finite
differences in f64 on random data, every op of the adjoint table, if/else, the Tape, custom
gradients, and the error paths."""

from __future__ import annotations

import numpy as np
import pytest
from test_math_ops import _inputs

import qd_numba as qd
from qd_numba import config
from qd_numba import math as qd_math
from qd_numba.ops.math_ops import MATH_OPS

N = 16


def _central_differences(f, xs, eps=1e-6):
    """d f / d xs[k] for every input array k (any shape), element by element."""
    grads = []
    for k, x in enumerate(xs):
        g = np.zeros(x.size)
        for j in range(x.size):
            up = [a.copy() for a in xs]
            down = [a.copy() for a in xs]
            up[k].reshape(-1)[j] += eps
            down[k].reshape(-1)[j] -= eps
            g[j] = (f(*up) - f(*down)) / (2 * eps)
        grads.append(g.reshape(x.shape))
    return grads


def _fields(n, count):
    return [qd.field(qd.f64, shape=(n,), needs_grad=True) for _ in range(count)]


@pytest.mark.parametrize("name", sorted(MATH_OPS))
def test_every_math_op_gradient_matches_finite_differences(name, rng):
    op = MATH_OPS[name]
    fn = getattr(qd_math, name)
    args = _inputs(name, op.arity, rng, N)
    xs = tuple(_fields(N, 3))
    loss = qd.field(qd.f64, shape=(), needs_grad=True)

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
    with qd.ad.Tape(loss=loss):
        compute(fn, op.arity)
    expected = _central_differences(lambda *a: 1.5 * np.sum(op.numpy(*a)), args)
    for k in range(op.arity):
        np.testing.assert_allclose(xs[k].grad.to_numpy(), expected[k], rtol=1e-5, atol=1e-6,
                                   err_msg=f"d {name} / d arg{k}")


def test_operators_casts_and_stop_grad(rng):
    a, b = rng.uniform(0.5, 2.0, N), rng.uniform(0.5, 2.0, N)
    x, y = _fields(N, 2)
    out = qd.field(qd.f64, shape=(N,), needs_grad=True)
    loss = qd.field(qd.f64, shape=(), needs_grad=True)

    @qd.kernel
    def compute(s: qd.f64):
        for i in range(N):
            u = x[i]
            w = y[i]
            t = (u + w) * (u - w) / w + u ** 2 - (-w) ** 3 + s * u
            k = int(u * 4.0)                  # an integer cast stops the gradient
            t += qd.cast(u, qd.f32) * 0.5 + float(w) + k * u + qd.stop_grad(u) * w
            out[i] = t
        for i in range(N):
            loss[None] += out[i] * out[i]

    x.from_numpy(a)
    y.from_numpy(b)

    with qd.ad.Tape(loss=loss):
        compute(0.7)
    # d/du of stop_grad(u) * w is 0, and int(u * 4) is piecewise constant
    k = np.floor(a * 4.0)
    t = (a + b) * (a - b) / b + a ** 2 + b ** 3 + 0.7 * a + 0.5 * a + b + k * a + a * b
    du = 2 * t * ((2 * a) / b + 2 * a + 0.7 + 0.5 + k)
    dw = 2 * t * (((a - b) - (a + b)) / b - (a + b) * (a - b) / b ** 2 + 3 * b ** 2 + 1 + a)
    np.testing.assert_allclose(loss[None], np.sum(t * t), rtol=1e-4)
    np.testing.assert_allclose(x.grad.to_numpy(), du, rtol=1e-5)
    np.testing.assert_allclose(y.grad.to_numpy(), dw, rtol=1e-5)


def test_if_else_and_two_tasks_in_reverse_order(rng):
    a = rng.standard_normal(N)
    x, y = _fields(N, 2)
    loss = qd.field(qd.f64, shape=(), needs_grad=True)

    @qd.kernel
    def compute(scale: qd.f64):
        for i in range(N):
            v = x[i]
            if v > 0:
                v = v * scale
            else:
                v = qd.sin(v) / 3.0
            if v > 0.5:
                v = qd.tanh(v)                # reads and assigns the same variable
            y[i] = v * v
        for i in range(N):
            loss[None] += y[i] * 2.0

    def reference(xs):
        v = np.where(xs > 0, xs * 1.5, np.sin(xs) / 3)
        v = np.where(v > 0.5, np.tanh(v), v)
        return 2 * np.sum(v * v)

    x.from_numpy(a)
    with qd.ad.Tape(loss=loss):
        compute(1.5)
    np.testing.assert_allclose(loss[None], reference(a), rtol=1e-12)
    np.testing.assert_allclose(x.grad.to_numpy(), _central_differences(reference, [a])[0], rtol=1e-5, atol=1e-7)
    assert [t.index for t in compute.grad.tasks(1.5)] == [0, 1]


def test_kernel_grad_accumulates_and_clear_all_gradients(rng):
    a = rng.standard_normal(N)
    x, y = _fields(N, 2)

    @qd.kernel
    def square():
        for i in x:
            y[i] = x[i] * x[i] * 3.0

    x.from_numpy(a)
    square()
    np.testing.assert_allclose(y.to_numpy(), 3 * a * a)
    g = rng.standard_normal(N)
    y.grad.from_numpy(g)
    square.grad()
    np.testing.assert_allclose(x.grad.to_numpy(), 6 * a * g)
    square.grad()
    np.testing.assert_allclose(x.grad.to_numpy(), 12 * a * g)
    qd.ad.clear_all_gradients()
    assert not x.grad.to_numpy().any() and not y.grad.to_numpy().any()


def test_grad_replaced_runs_the_custom_gradient(rng):
    a = rng.standard_normal(N)
    x, = _fields(N, 1)
    loss = qd.field(qd.f64, shape=(), needs_grad=True)

    @qd.kernel
    def total(m: qd.f64):
        for i in x:
            loss[None] += x[i] * m

    @qd.ad.grad_replaced
    def forward(m):
        total(m)
        total(m)

    @qd.ad.grad_for(forward)
    def backward(m):
        total.grad(m * 10.0)

    x.from_numpy(a)
    with qd.ad.Tape(loss=loss):
        forward(2.0)
    np.testing.assert_allclose(loss[None], 4 * a.sum())
    np.testing.assert_allclose(x.grad.to_numpy(), np.full(N, 20.0))


def test_needs_grad_storage_for_every_container(rng):
    v = qd.Vector.field(3, qd.f32, shape=(4,), needs_grad=True)
    m = qd.Matrix.field(2, 2, qd.f64, shape=(2, 3), needs_grad=True)
    arr = qd.ndarray(qd.f32, shape=(5,), needs_grad=True)
    for data in (v, m, arr):
        assert data.grad.shape == data.shape and data.grad.dtype == data.dtype
        assert data.grad.to_numpy().shape == data.to_numpy().shape
        assert not data.grad.to_numpy().any()
    arr.grad.from_numpy(rng.standard_normal(5).astype(np.float32))
    qd.ad.clear_all_gradients()
    assert not arr.grad.to_numpy().any()
    with pytest.raises(qd.QuadrantsTypeError, match="floating-point"):
        qd.ndarray(qd.i32, shape=(5,), needs_grad=True)


def test_errors_name_the_kernel():
    x, = _fields(N, 1)
    plain = qd.field(qd.f64, shape=())
    vector_loss = qd.field(qd.f64, shape=(3,), needs_grad=True)
    loss = qd.field(qd.f64, shape=(), needs_grad=True)

    @qd.kernel
    def returns() -> qd.f64:
        return x[0]

    with pytest.raises(qd.QuadrantsSyntaxError, match="kernel 'returns'.*returns a value"):
        returns.grad()
    with pytest.raises(qd.QuadrantsSyntaxError, match="needs_grad=True"):
        qd.ad.Tape(loss=plain)
    with pytest.raises(qd.QuadrantsSyntaxError, match="0-d"):
        qd.ad.Tape(loss=vector_loss)
    with qd.ad.Tape(loss=loss):
        with pytest.raises(qd.QuadrantsRuntimeError, match="nested"):
            with qd.ad.Tape(loss=loss):
                pass

    @qd.kernel
    def inner_loop():
        for i in x:
            v = x[i]
            for _ in range(int(v * 4)):     # loops inside parallel loops are differentiated (test_adstack.py)
                v = qd.sin(v)               # when the adstack sizer can bound them; this bound is a float
            loss[None] += v

    with pytest.raises(qd.QuadrantsCompilationError, match="inner_loop.grad.*adstack sizer cannot bound"):
        inner_loop.grad()


def test_tape_validation_detects_an_overwrite_of_read_data(rng):
    arch = config.current.arch
    with pytest.raises(qd.QuadrantsSyntaxError, match="needs qd.init\\(debug=True\\)"):
        qd.ad.Tape(validation=True)
    qd.init(arch=arch, debug=True)
    try:
        x = qd.field(qd.f64, shape=(N,), needs_grad=True, name="x")
        y = qd.field(qd.f64, shape=(N,), needs_grad=True, name="y")
        loss = qd.field(qd.f64, shape=(), needs_grad=True)

        @qd.kernel
        def square():
            for i in x:
                y[i] = x[i] * x[i]

        @qd.kernel
        def shift():
            for i in x:
                x[i] = x[i] + 1.0          # overwrites x, which square read

        @qd.kernel
        def total():
            for i in y:
                loss[None] += y[i]

        values = rng.uniform(-1, 1, N)
        x.from_numpy(values)
        with qd.ad.Tape(loss=loss, validation=True):   # a valid tape: checked, and the gradient is right
            square()
            total()
        np.testing.assert_allclose(x.grad.to_numpy(), 2 * values, rtol=1e-12)
        with pytest.raises(qd.QuadrantsRuntimeError,
                           match="kernel 'shift' overwrote the field x, which kernel 'square' read"):
            with qd.ad.Tape(loss=loss, validation=True):
                square()
                shift()
                total()
    finally:
        qd.init(arch=arch)
