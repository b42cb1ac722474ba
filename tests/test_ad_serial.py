"""Serial code with side effects between the loops of a differentiated kernel
(passes/autodiff.py ``_serial_as_loop``): stores and atomics in serial code, serial values that
feed later loops, branches — the reverse runs the tasks, serial ones included,
in reverse order; gradients against central finite differences in f64 on random data."""

from __future__ import annotations

import numpy as np
from test_ad_matrix import _check

import qd_numba as qd

N = 7


def test_serial_stores_and_values_between_loops(rng):
    x = qd.field(qd.f64, shape=(N,), needs_grad=True)
    w = qd.field(qd.f64, shape=(2,), needs_grad=True)
    s = qd.field(qd.f64, shape=(), needs_grad=True)
    t = qd.field(qd.f64, shape=(), needs_grad=True)
    loss = qd.field(qd.f64, shape=(), needs_grad=True)

    @qd.kernel
    def chain():
        s[None] = 0.0
        for i in x:
            s[None] += x[i] * x[i]
        m = s[None] * w[0]
        if m > 0.5:
            t[None] = qd.sin(m) + w[1]
        else:
            t[None] = m * m * w[1]
        t[None] += qd.cos(m * 0.5) * w[0]
        for i in x:
            loss[None] += t[None] * x[i]
        loss[None] += w[1] * s[None]

    def reference(xs, ws):
        sv = xs @ xs
        m = sv * ws[0]
        tv = np.sin(m) + ws[1] if m > 0.5 else m * m * ws[1]
        tv += np.cos(m * 0.5) * ws[0]
        return tv * xs.sum() + ws[1] * sv

    for scale in (0.3, 1.2):     # both branches
        for f in (s, t, loss):
            f.fill(0)
        _check(chain, [x, w], [rng.uniform(-1, 1, N) * scale, rng.uniform(0.2, 1.0, 2)], loss,
               reference)


def test_serial_code_first_and_last(rng):
    x = qd.field(qd.f64, shape=(N,), needs_grad=True)
    y = qd.field(qd.f64, shape=(N,), needs_grad=True)
    a = qd.field(qd.f64, shape=(), needs_grad=True)
    loss = qd.field(qd.f64, shape=(), needs_grad=True)

    @qd.kernel
    def around():
        a[None] = qd.exp(x[0]) * 0.5        # serial code before the first loop
        for i in x:
            y[i] = x[i] * a[None]
        loss[None] = y[1] * y[2] + qd.sin(y[3])     # after the last loop

    def reference(xs):
        av = np.exp(xs[0]) * 0.5
        yv = xs * av
        return yv[1] * yv[2] + np.sin(yv[3])

    _check(around, [x], [rng.uniform(-1, 1, N)], loss, reference)
    # the gradient's tasks: the serial code's recomputation, then last to first the adjoints of
    # the serial code after the loop, of the loop, of the serial code before it
    lines = [int(t.loc.rsplit(":", 1)[1]) for t in around.grad.tasks() if t.kind == "range_for"]
    assert len(lines) == 3 and lines == sorted(lines, reverse=True)
