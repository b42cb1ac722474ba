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
