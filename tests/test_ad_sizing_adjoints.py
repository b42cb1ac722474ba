"""Adjoint accumulation at one address (a parameter every thread reads): the gradient kernel's
``w.grad[None] += g`` is reduced per chunk (CPU) / per warp (CUDA) before one atomic, as
ReduceAtomics does for forward kernels (passes/reductions.py, called by ReverseMode)."""

from __future__ import annotations

import numpy as np

import qd_numba as qd
from qd_numba.lowering import reduce as rd
from qd_numba.passes.base import try_static

N = 1000


def _combines(kernel) -> int:
    """Reductions in the kernel's last compiled (CPU) IR: the partials set up before the loop
    (the loop body itself has moved into its task function)."""
    state = kernel.last_instance.state
    ir = state.ir
    return sum(1 for block in state.func_ir.blocks.values() for stmt in block.body
               if isinstance(stmt, ir.Assign) and isinstance(stmt.value, ir.Expr) and stmt.value.op == "call"
               and try_static(state, stmt.value.func) is rd.reduce_identity)


def test_shared_parameter_gradients_are_reduced_and_match_finite_differences(rng, arch):
    x = qd.field(qd.f64, shape=(N,), needs_grad=True)
    w = qd.field(qd.f64, shape=(), needs_grad=True)
    b = qd.field(qd.f64, shape=(3,), needs_grad=True)
    n = qd.field(qd.i32, shape=())
    loss = qd.field(qd.f64, shape=(), needs_grad=True)

    @qd.kernel
    def model():
        for i in x:
            v = x[i] * w[None] + b[1]
            for _ in range(n[None]):
                v = qd.sin(v) * w[None] - b[2]
            loss[None] += v * v

    xs, wv, bs = rng.uniform(-1, 1, N), rng.uniform(0.5, 1.0), rng.uniform(-0.3, 0.3, 3)
    steps = 4

    def f(wv, bs):
        v = xs * wv + bs[1]
        for _ in range(steps):
            v = np.sin(v) * wv - bs[2]
        return (v * v).sum()

    x.from_numpy(xs)
    w[None] = wv
    b.from_numpy(bs)
    n[None] = steps
    loss[None] = 0
    with qd.ad.Tape(loss=loss):
        model()
    eps = 1e-6
    dw = (f(wv + eps, bs) - f(wv - eps, bs)) / (2 * eps)
    db = [(f(wv, bs + eps * np.eye(3)[k]) - f(wv, bs - eps * np.eye(3)[k])) / (2 * eps) for k in range(3)]
    np.testing.assert_allclose(w.grad[None], dw, rtol=1e-7)
    np.testing.assert_allclose(b.grad.to_numpy(), db, rtol=1e-7, atol=1e-6)
    if arch == "cpu":
        assert _combines(model.grad) >= 3      # w.grad[None], b.grad[1], b.grad[2]: one combine each


def test_off_with_warp_reduce_false_gives_the_same_gradient(rng, arch):
    xs = rng.uniform(-1, 1, N)
    grads = []
    for warp in (True, False):
        qd.init(arch=qd.cpu, warp_reduce=warp)
        x = qd.field(qd.f64, shape=(N,), needs_grad=True)
        w = qd.field(qd.f64, shape=(), needs_grad=True)
        loss = qd.field(qd.f64, shape=(), needs_grad=True)

        @qd.kernel
        def scaled():
            for i in x:
                loss[None] += qd.sin(x[i] * w[None])

        x.from_numpy(xs)
        w[None] = 0.7
        with qd.ad.Tape(loss=loss):
            scaled()
        grads.append((w.grad[None], _combines(scaled.grad)))
    qd.init(arch=qd.cuda if arch == "cuda" else qd.cpu)
    np.testing.assert_allclose(grads[0][0], np.sum(np.cos(xs * 0.7) * xs), rtol=1e-10)
    np.testing.assert_allclose(grads[1][0], grads[0][0], rtol=1e-12)
    assert grads[0][1] >= 1 and grads[1][1] == 0
