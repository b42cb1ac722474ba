"""Reverse-mode autodiff of ndarray arguments: a ``qd.ndarray(..., needs_grad=True)`` argument of
a gradient kernel gets the adjoints of its reads accumulated into its ``.grad`` and gives the
adjoints of its writes from it (kernel.py passes ``arg.grad`` as a hidden argument,
passes/autodiff.py accumulates into it) — gradients against central finite differences of a
numpy reference, in f64 on random data."""

from __future__ import annotations

import numpy as np
import pytest
from test_autodiff import _central_differences

import qd_numba as qd

N = 7
vec3 = qd.types.vector(3, qd.f64)
mat2 = qd.types.matrix(2, 2, qd.f64)


def test_one_dimensional_read_only_and_written_arguments(rng):
    x = qd.ndarray(qd.f64, (N,), needs_grad=True)
    y = qd.ndarray(qd.f64, (N,), needs_grad=True)
    loss = qd.field(qd.f64, shape=(), needs_grad=True)

    @qd.kernel
    def forward(x: qd.types.ndarray(dtype=qd.f64, ndim=1), y: qd.types.ndarray(dtype=qd.f64, ndim=1)):
        for i in range(x.shape[0]):
            y[i] = qd.sin(x[i]) * x[i] + qd.exp(0.3 * x[i])

    @qd.kernel
    def total(y: qd.types.ndarray(dtype=qd.f64, ndim=1)):
        for i in range(y.shape[0]):
            loss[None] += y[i] * y[i]

    def reference(xv):
        return ((np.sin(xv) * xv + np.exp(0.3 * xv)) ** 2).sum()

    xv = rng.uniform(-2, 2, N)
    x.from_numpy(xv)
    with qd.ad.Tape(loss=loss):
        forward(x, y)
        total(y)
    np.testing.assert_allclose(loss[None], reference(xv), rtol=1e-12)
    np.testing.assert_allclose(x.grad.to_numpy(), _central_differences(reference, [xv])[0], rtol=1e-6)
    np.testing.assert_allclose(y.grad.to_numpy(), 2 * y.to_numpy(), rtol=1e-12)


def test_argument_read_and_written_by_one_kernel_with_fields(rng):
    """``h`` is written by the first loop and read by the second: its gradient flows through."""
    x = qd.ndarray(qd.f64, (N,), needs_grad=True)
    h = qd.ndarray(qd.f64, (N,), needs_grad=True)
    w = qd.field(qd.f64, shape=(N,), needs_grad=True)
    loss = qd.field(qd.f64, shape=(), needs_grad=True)

    @qd.kernel
    def layer(x: qd.types.ndarray(), h: qd.types.ndarray()):
        for i in range(N):
            h[i] = qd.tanh(w[i] * x[i])
        for i in range(N):
            loss[None] += h[i] * h[(i + 1) % N] + qd.sqrt(1.0 + x[i] * x[i])

    def reference(xv, wv):
        hv = np.tanh(wv * xv)
        return (hv * np.roll(hv, -1) + np.sqrt(1 + xv * xv)).sum()

    xv, wv = rng.uniform(-1, 1, N), rng.uniform(-1, 1, N)
    x.from_numpy(xv)
    w.from_numpy(wv)
    with qd.ad.Tape(loss=loss):
        layer(x, h)
    gx, gw = _central_differences(reference, [xv, wv])
    np.testing.assert_allclose(loss[None], reference(xv, wv), rtol=1e-12)
    np.testing.assert_allclose(x.grad.to_numpy(), gx, rtol=1e-6, atol=1e-9)
    np.testing.assert_allclose(w.grad.to_numpy(), gw, rtol=1e-6, atol=1e-9)


def test_two_dimensional_with_constant_arguments(rng):
    """A numpy array and an ndarray without needs_grad are constants; kernel.grad called directly
    (loss.grad seeded by hand) accumulates onto what the gradient already holds."""
    a = qd.ndarray(qd.f64, (3, 4), needs_grad=True)
    b = qd.ndarray(qd.f64, (3, 4))
    loss = qd.field(qd.f64, shape=(), needs_grad=True)

    @qd.kernel
    def energy(a: qd.types.ndarray(ndim=2), b: qd.types.ndarray(ndim=2), c: qd.types.ndarray(ndim=2)):
        for i, j in qd.ndrange(a.shape[0], a.shape[1]):
            loss[None] += a[i, j] * b[i, j] + qd.exp(a[i, j] * c[i, j]) + a[i, j] * a[(i + 1) % 3, j]

    def reference(av, bv, cv):
        return (av * bv + np.exp(av * cv) + av * np.roll(av, -1, axis=0)).sum()

    av, bv, cv = (rng.uniform(-1, 1, (3, 4)) for _ in range(3))
    a.from_numpy(av)
    b.from_numpy(bv)
    start = rng.uniform(-1, 1, (3, 4))
    a.grad.from_numpy(start)
    energy(a, b, cv)
    loss.grad[None] = 2.0
    energy.grad(a, b, cv)
    np.testing.assert_allclose(loss[None], reference(av, bv, cv), rtol=1e-12)
    expected = start + 2.0 * _central_differences(reference, [av, bv, cv])[0]
    np.testing.assert_allclose(a.grad.to_numpy(), expected, rtol=1e-6, atol=1e-9)
    np.testing.assert_array_equal(b.to_numpy(), bv)     # a constant: no gradient, unchanged
    assert b.grad is None


def test_vector_ndarrays_and_atomic_adds(rng):
    p = qd.Vector.ndarray(3, qd.f64, (N,), needs_grad=True)
    acc = qd.ndarray(qd.f64, (2,), needs_grad=True)
    loss = qd.field(qd.f64, shape=(), needs_grad=True)

    @qd.kernel
    def gather(p: qd.types.ndarray(dtype=vec3, ndim=1), acc: qd.types.ndarray()):
        for i in range(N):
            v = p[i]
            acc[i % 2] += v.norm() * v[0]
            acc[0] += (v * v.dot(v))[2] + p[i].z * 0.5

    @qd.kernel
    def total(acc: qd.types.ndarray()):
        for k in range(2):
            loss[None] += qd.sin(acc[k]) * (k + 1.0)

    def reference(pv):
        a = np.zeros(2)
        for i in range(N):
            v = pv[i]
            a[i % 2] += np.linalg.norm(v) * v[0]
            a[0] += v[2] * (v @ v) + v[2] * 0.5
        return np.sin(a[0]) + 2 * np.sin(a[1])

    pv = rng.uniform(-1, 1, (N, 3))
    p.from_numpy(pv)
    with qd.ad.Tape(loss=loss):
        gather(p, acc)
        total(acc)
    np.testing.assert_allclose(loss[None], reference(pv), rtol=1e-12)
    np.testing.assert_allclose(p.grad.to_numpy(), _central_differences(reference, [pv])[0], rtol=1e-6, atol=1e-9)


def test_only_the_arguments_with_gradients_get_them(rng):
    """One kernel called with and without gradients on its ndarray arguments (keyword arguments
    too): each call accumulates into the gradients it was given."""
    x = qd.ndarray(qd.f64, (N,), needs_grad=True)
    y = qd.ndarray(qd.f64, (N,), needs_grad=True)
    loss = qd.field(qd.f64, shape=(), needs_grad=True)

    @qd.kernel
    def product(x: qd.types.ndarray(), y: qd.types.ndarray()):
        for i in range(N):
            loss[None] += x[i] * y[i] * y[i]

    xv, yv = rng.uniform(-1, 1, N), rng.uniform(-1, 1, N)
    x.from_numpy(xv)
    y.from_numpy(yv)
    loss.grad[None] = 1.0
    product.grad(x, yv)
    np.testing.assert_allclose(x.grad.to_numpy(), yv * yv, rtol=1e-12)
    assert not y.grad.to_numpy().any()
    product.grad(y=y, x=xv)
    np.testing.assert_allclose(y.grad.to_numpy(), 2 * xv * yv, rtol=1e-12)
    np.testing.assert_allclose(x.grad.to_numpy(), yv * yv, rtol=1e-12)
    product.grad(x, y)
    np.testing.assert_allclose(x.grad.to_numpy(), 2 * yv * yv, rtol=1e-12)
    np.testing.assert_allclose(y.grad.to_numpy(), 4 * xv * yv, rtol=1e-12)


def test_tape_clears_ndarray_gradients_and_takes_an_ndarray_loss(rng):
    x = qd.ndarray(qd.f64, (N,), needs_grad=True)
    loss = qd.ndarray(qd.f64, (1,), needs_grad=True)

    @qd.kernel
    def cubes(x: qd.types.ndarray(), loss: qd.types.ndarray()):
        for i in range(N):
            loss[0] += x[i] * x[i] * x[i]

    xv = rng.uniform(-1, 1, N)
    x.from_numpy(xv)
    x.grad.from_numpy(rng.uniform(-1, 1, N))
    with qd.ad.Tape(loss=loss):
        cubes(x, loss)
    np.testing.assert_allclose(loss.to_numpy()[0], (xv ** 3).sum(), rtol=1e-12)
    np.testing.assert_allclose(x.grad.to_numpy(), 3 * xv * xv, rtol=1e-12)
    with pytest.raises(qd.QuadrantsSyntaxError, match="one element"):
        qd.ad.Tape(loss=x)


@pytest.mark.cuda
def test_cuda_ndarray_gradients(rng):
    qd.init(arch=qd.cuda)
    try:
        x = qd.ndarray(qd.f64, (4096,), needs_grad=True)
        v = qd.Vector.ndarray(2, qd.f64, (4096,), needs_grad=True)
        loss = qd.field(qd.f64, shape=(), needs_grad=True)

        @qd.kernel
        def mix(x: qd.types.ndarray(), v: qd.types.ndarray(dtype=qd.types.vector(2, qd.f64), ndim=1)):
            for i in range(x.shape[0]):
                loss[None] += qd.sin(x[i]) * v[i][0] + v[i].y * v[i].y

        xv, vv = rng.uniform(-2, 2, 4096), rng.uniform(-1, 1, (4096, 2))
        x.from_numpy(xv)
        v.from_numpy(vv)
        with qd.ad.Tape(loss=loss):
            mix(x, v)
        np.testing.assert_allclose(x.grad.to_numpy(), np.cos(xv) * vv[:, 0], rtol=1e-12)
        np.testing.assert_allclose(v.grad.to_numpy(), np.stack([np.sin(xv), 2 * vv[:, 1]], axis=1), rtol=1e-12)
    finally:
        qd.init()


def test_loops_inside_the_task_and_matrix_ndarrays(rng):
    """An inner loop (adstack sized from a scalar argument and an ndarray shape) over an ndarray
    with a gradient, and a matrix ndarray with a gradient."""
    x = qd.ndarray(qd.f64, (N,), needs_grad=True)
    m = qd.Matrix.ndarray(2, 2, qd.f64, (N,), needs_grad=True)
    loss = qd.field(qd.f64, shape=(), needs_grad=True)

    @qd.kernel
    def chain(x: qd.types.ndarray(), m: qd.types.ndarray(dtype=mat2, ndim=1), steps: qd.i32):
        for i in range(x.shape[0]):
            v = x[i]
            for _ in range(steps):
                v = qd.sin(v) * 1.1 + 0.1 * x[(i + 1) % N]
            loss[None] += v * (m[i] @ m[i]).trace()

    def reference(xv, mv, steps=5):
        v = xv.copy()
        for _ in range(steps):
            v = np.sin(v) * 1.1 + 0.1 * np.roll(xv, -1)
        return (v * np.einsum("nij,nji->n", mv, mv)).sum()

    xv, mv = rng.uniform(-1, 1, N), rng.uniform(-1, 1, (N, 2, 2))
    x.from_numpy(xv)
    m.from_numpy(mv)
    with qd.ad.Tape(loss=loss):
        chain(x, m, 5)
    gx, gm = _central_differences(reference, [xv, mv])
    np.testing.assert_allclose(loss[None], reference(xv, mv), rtol=1e-12)
    np.testing.assert_allclose(x.grad.to_numpy(), gx, rtol=1e-6, atol=1e-9)
    np.testing.assert_allclose(m.grad.to_numpy(), gm, rtol=1e-6, atol=1e-9)


def test_row_read_of_a_plain_array_is_an_error_at_its_line(rng):
    """``p[i]`` of a 2-d array without an element type is an array row, which has no adjoint:
    the gradient kernel's error names the read (docs/autodiff.md: annotate the element type)."""
    p = qd.Vector.ndarray(3, qd.f64, (4,), needs_grad=True)
    p.from_numpy(rng.uniform(-1, 1, (4, 3)))
    loss = qd.field(qd.f64, shape=(), needs_grad=True)

    @qd.kernel
    def rows(p: qd.types.ndarray()):
        for i in range(4):
            row = p[i]
            loss[None] += row[0] * 2.0

    rows(p)
    np.testing.assert_allclose(loss[None], 2 * p.to_numpy()[:, 0].sum(), rtol=1e-12)
    with pytest.raises(qd.QuadrantsIndexError, match=r"(?s)kernel 'rows.grad'.*row = p\[i\]"):
        rows.grad(p)


def test_torch_tensor_with_requires_grad_gets_its_grad(rng, arch):
    """As Quadrants: a torch tensor argument with ``requires_grad`` gets a zeroed ``.grad`` if it
    has none, and the gradient kernel accumulates into it; one without stays a constant."""
    torch = pytest.importorskip("torch")
    loss = qd.field(qd.f64, shape=(), needs_grad=True)

    @qd.kernel
    def energy(p: qd.types.ndarray(dtype=qd.f64, ndim=1), q: qd.types.ndarray(dtype=qd.f64, ndim=1)):
        for i in range(p.shape[0]):
            loss[None] += qd.sin(p[i]) * q[i] + p[i] * p[(i + 1) % N]

    def reference(pv, qv):
        return (np.sin(pv) * qv + pv * np.roll(pv, -1)).sum()

    pv, qv = rng.uniform(-1, 1, N), rng.uniform(-1, 1, N)
    device = "cuda" if arch == "cuda" else "cpu"     # tensors live where the kernels run
    p = torch.tensor(pv, requires_grad=True, device=device)
    q = torch.tensor(qv, device=device)
    with qd.ad.Tape(loss=loss):
        energy(p, q)
    np.testing.assert_allclose(loss[None], reference(pv, qv), rtol=1e-12)
    gp = _central_differences(reference, [pv, qv])[0]
    np.testing.assert_allclose(p.grad.cpu().numpy(), gp, rtol=1e-6, atol=1e-9)
    assert q.grad is None
    energy.grad(p, q)                   # accumulates, as torch's gradients do
    np.testing.assert_allclose(p.grad.cpu().numpy(), 2 * gp, rtol=1e-6, atol=1e-9)
