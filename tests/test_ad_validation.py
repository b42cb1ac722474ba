"""``qd.ad.Tape(validation=True)`` with ``qd.init(debug=True)`` (ad.py): a kernel that reads a
field with a gradient and then overwrites it — in a later loop of the same kernel, or in its
serial code — makes the gradient wrong and raises naming the field and the kernel; a valid tape
with serial code and vector fields passes and its gradient is right."""

from __future__ import annotations

import numpy as np
import pytest

import qd_numba as qd
from qd_numba import config

N = 5


@pytest.fixture
def debug_init():
    arch = config.current.arch
    qd.init(arch=arch, debug=True)
    yield
    qd.init(arch=arch)


def test_an_overwrite_inside_one_kernel_is_reported(rng, debug_init):
    x = qd.Vector.field(2, qd.f64, shape=(N,), needs_grad=True, name="x")
    s = qd.field(qd.f64, shape=(), needs_grad=True, name="s")
    loss = qd.field(qd.f64, shape=(), needs_grad=True)

    @qd.kernel
    def valid():
        s[None] = 0.5
        for i in x:
            loss[None] += x[i].norm_sqr() * s[None]

    @qd.kernel
    def rescale():
        for i in x:
            loss[None] += x[i].sum()
        for i in x:
            x[i] = x[i] * 2.0           # overwrites what the first loop read

    @qd.kernel
    def serial_overwrite():
        for i in x:
            loss[None] += x[i][0] * s[None]
        s[None] = s[None] + 1.0         # serial code overwriting what the loop read

    values = rng.uniform(-1, 1, (N, 2))
    x.from_numpy(values)
    with qd.ad.Tape(loss=loss, validation=True):
        valid()
    np.testing.assert_allclose(x.grad.to_numpy(), values, rtol=1e-12)
    for kernel, field in ((rescale, "x"), (serial_overwrite, "s")):
        with pytest.raises(qd.QuadrantsRuntimeError,
                           match=f"kernel '{kernel.name}' overwrote the field {field}, which kernel '{kernel.name}'"):
            with qd.ad.Tape(loss=loss, validation=True):
                kernel()


def test_the_check_is_per_element(rng, debug_init):
    """A kernel that writes elements no recorded kernel read (a time axis) passes, and its
    gradient is right; overwriting one element that was read is reported naming that element."""
    T = 4
    x = qd.field(qd.f64, shape=(T + 1, N), needs_grad=True, name="x")
    c = qd.field(qd.f64, shape=(N,), needs_grad=True, name="c")
    loss = qd.field(qd.f64, shape=(), needs_grad=True)

    @qd.kernel
    def step(t: qd.i32):
        for i in range(N):
            x[t + 1, i] = qd.sin(x[t, i]) * c[i]

    @qd.kernel
    def total():
        for i in range(N):
            loss[None] += x[T, i] * x[T, i]

    @qd.kernel
    def poke(t: qd.i32, k: qd.i32):
        c[k] = c[k] + 1.0               # c[k]: read by every step
        x[t, k] = 0.0

    def reference(x0, cs):
        v = x0
        for _ in range(T):
            v = np.sin(v) * cs
        return (v * v).sum()

    x0, cs = rng.uniform(-1, 1, N), rng.uniform(0.5, 1.5, N)
    x.from_numpy(np.vstack([x0, np.zeros((T, N))]))
    c.from_numpy(cs)
    with qd.ad.Tape(loss=loss, validation=True):
        for t in range(T):
            step(t)
        total()
    np.testing.assert_allclose(loss[None], reference(x0, cs), rtol=1e-12)
    eps = 1e-6
    for k in range(N):
        d = np.zeros(N)
        d[k] = eps
        gx = (reference(x0 + d, cs) - reference(x0 - d, cs)) / (2 * eps)
        gc = (reference(x0, cs + d) - reference(x0, cs - d)) / (2 * eps)
        np.testing.assert_allclose(x.grad.to_numpy()[0, k], gx, rtol=1e-6, atol=1e-9)
        np.testing.assert_allclose(c.grad.to_numpy()[k], gc, rtol=1e-6, atol=1e-9)

    with pytest.raises(qd.QuadrantsRuntimeError,
                       match=r"kernel 'poke' overwrote the field c, which kernel 'step' read earlier in this tape "
                             r"\(element \[3\], 1 in all\)"):
        with qd.ad.Tape(loss=loss, validation=True):
            step(0)
            poke(1, 3)                  # x[1, 3] was never read: only c[3] is reported
    x.from_numpy(np.vstack([x0, np.zeros((T, N))]))
    with pytest.raises(qd.QuadrantsRuntimeError, match=r"overwrote the field x, .*\(element \[2, 1\], 1 in all\)"):
        with qd.ad.Tape(loss=loss, validation=True):
            step(2)                     # reads x[2, :]
            x[2, 1] = 5.0               # host writes are not checked: the next recorded call reports it
            total()
