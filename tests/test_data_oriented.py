"""``@qd.data_oriented`` classes: kernel methods (``self`` a template), ``@qd.func`` methods,
several instances with their own fields, ``qd.static`` over attributes. References are numpy,
on random data; every kernel is also compiled for CUDA by the suite (tests/conftest.py).
"""

from __future__ import annotations

import numpy as np
import pytest

import qd_numba as qd


@qd.data_oriented
class Cloth:
    def __init__(self, n, scale):
        self.n, self.scale = n, scale
        self.x = qd.field(qd.f32, shape=n)
        self.v = qd.Vector.field(2, qd.f32, shape=n)
        self.parts = (qd.field(qd.f32, shape=n), qd.field(qd.f32, shape=n))

    @qd.func
    def energy(self, i):
        return self.scale * self.x[i] * self.x[i]

    @qd.kernel
    def step(self, dt: qd.f32):
        for i in self.x:
            self.v[i] += dt * qd.Vector([self.x[i], 1.0])
            self.x[i] = self.energy(i)
            for p in qd.static(self.parts):
                p[i] += self.x[i]


def test_data_oriented_instances_compile_separately(rng):
    a, b = Cloth(16, 2.0), Cloth(40, 0.5)
    xa, xb = rng.random(16).astype(np.float32), rng.random(40).astype(np.float32)
    a.x.from_numpy(xa)
    b.x.from_numpy(xb)
    a.step(0.1)
    b.step(dt=0.2)
    for obj, x0, dt in ((a, xa, 0.1), (b, xb, 0.2)):
        x1 = obj.scale * x0 * x0
        assert np.allclose(obj.x.to_numpy(), x1, rtol=1e-6)
        assert np.allclose(obj.v.to_numpy(), np.stack([dt * x0, np.full_like(x0, dt)], 1), rtol=1e-6)
        assert all(np.allclose(p.to_numpy(), x1, rtol=1e-6) for p in obj.parts)


@pytest.mark.cuda
def test_data_oriented_on_gpu(rng):
    qd.init(arch=qd.cuda)
    try:
        test_data_oriented_instances_compile_separately(rng)
    finally:
        qd.init(arch=qd.cpu)


def test_data_oriented_content_key():
    """The offline cache names a data-oriented object by its class and attributes (fields by layout)."""
    from qd_numba.frontend.keys import value_key

    a, b, c = Cloth(16, 2.0), Cloth(16, 2.0), Cloth(17, 2.0)
    assert value_key(a) is not None and value_key(a) == value_key(b)
    assert value_key(a) != value_key(c) and value_key(a) != value_key(Cloth(16, 3.0))
    a.extra = object()                      # an attribute without a stable description
    assert value_key(a) is None


@qd.data_oriented
class Quadratic:
    def __init__(self, n):
        self.x = qd.field(qd.f32, shape=n, needs_grad=True)
        self.loss = qd.field(qd.f32, shape=(), needs_grad=True)

    @qd.kernel
    def compute(self, w: qd.f32):
        for i in self.x:
            self.loss[None] += w * self.x[i] ** 2


def test_data_oriented_kernel_gradient(rng):
    q = Quadratic(32)
    x = rng.standard_normal(32).astype(np.float32)
    q.x.from_numpy(x)
    q.compute(1.5)
    q.loss.grad[None] = 1.0
    q.compute.grad(1.5)
    assert np.isclose(q.loss[None], 1.5 * (x ** 2).sum(), rtol=1e-5)
    assert np.allclose(q.x.grad.to_numpy(), 3.0 * x, rtol=1e-5)
