"""The fast paths of gradient kernels (passes/autodiff.py), each against central finite
differences in f64 on random data:

* the adjoint of a read at the iteration's own index (``x[i]`` in ``for i in x``, ``x[i, j]``,
  ``x[j, i]``, ``x[I]`` of ``qd.grouped``) is a plain read-add-store, not an atomic — and stays
  atomic where another iteration may add to the same element (``x[i + 1]``, ``x[idx[i]]``,
  ``x[0]``, an ndarray passed twice);
* the load of ``G[I]`` that ``G[I] += V`` leaves behind gets no adjoint (no atomic add of zero);
* only values some adjoint needs are pushed onto the adstack."""

from __future__ import annotations

import numpy as np
import pytest
from numba.core import ir
from test_autodiff import _central_differences

import qd_numba as qd
from qd_numba.lowering import subscripts

N = 16


def _atomics(kernel, grad_positions=None) -> int:
    """Atomic updates in the task functions of the gradient kernel (its last compiled CPU instance;
    ``grad_positions``: the variant taking the gradients of those ndarray arguments)."""
    grad = kernel.grad if grad_positions is None else kernel.grad._with_grads[grad_positions]
    blocks = [block for tf in grad.last_instance.task_functions for block in tf.typed[0].values()]
    stmts = [stmt for block in blocks for stmt in block.body if isinstance(stmt, ir.Assign)]
    names = {stmt.target.name for stmt in stmts
             if isinstance(stmt.value, ir.Global) and stmt.value.value is subscripts.atomic_update}
    return sum(1 for stmt in stmts if isinstance(stmt.value, ir.Expr) and stmt.value.op == "call"
               and stmt.value.func.name in names)


def _expect_atomics(arch, kernel, count, grad_positions=None):
    """The gradient kernel's IR has ``count`` atomics (the CPU compile's IR; the CUDA tasks are
    made by the same pass)."""
    if arch == "cpu":
        assert _atomics(kernel, grad_positions) == count


def _tape(kernel, *args, loss):
    loss[None] = 0
    with qd.ad.Tape(loss=loss):
        kernel(*args)


def test_read_at_the_own_index_is_a_plain_add(rng, arch):
    x = qd.field(qd.f64, shape=(N,), needs_grad=True)
    loss = qd.field(qd.f64, shape=(), needs_grad=True)

    @qd.kernel
    def energy():
        for i in x:
            a = x[i]
            loss[None] += qd.sin(a) * x[i] + 0.5 * x[i] * x[i] * x[i]

    def reference(xs):
        return (np.sin(xs) * xs + 0.5 * xs ** 3).sum()

    xs = rng.uniform(-2, 2, N)
    x.from_numpy(xs)
    _tape(energy, loss=loss)
    np.testing.assert_allclose(loss[None], reference(xs), rtol=1e-12)
    np.testing.assert_allclose(x.grad.to_numpy(), _central_differences(reference, [xs])[0], rtol=1e-6)
    _expect_atomics(arch, energy, 0)


@pytest.mark.parametrize("size", [40, 16])
def test_reads_other_iterations_may_share_stay_atomic(rng, arch, size):
    """One read of ``x`` at another index makes every adjoint of ``x`` atomic; ``y`` read only
    at ``i`` keeps its plain adds beside it. A field of at most 32 elements is summed per
    thread instead (no atomic per read)."""
    x, y = (qd.field(qd.f64, shape=(size,), needs_grad=True) for _ in range(2))
    idx = qd.field(qd.i32, shape=(size,))
    loss = qd.field(qd.f64, shape=(), needs_grad=True)

    @qd.kernel
    def shifted():
        for i in range(size - 1):
            loss[None] += x[i] * x[i + 1] + y[i] * y[i]

    @qd.kernel
    def indirect():
        for i in x:
            loss[None] += qd.sin(x[idx[i]]) * x[i] + y[i] * x[0]

    def ref_shifted(xs, ys):
        return (xs[:-1] * xs[1:] + ys[:-1] ** 2).sum()

    idxs = rng.integers(0, size, size).astype(np.int32)     # repeats: several iterations add to one element

    def ref_indirect(xs, ys):
        return (np.sin(xs[idxs]) * xs + ys * xs[0]).sum()

    idx.from_numpy(idxs)
    for kernel, reference in ((shifted, ref_shifted), (indirect, ref_indirect)):
        xs, ys = rng.uniform(-2, 2, size), rng.uniform(-2, 2, size)
        x.from_numpy(xs)
        y.from_numpy(ys)
        _tape(kernel, loss=loss)
        np.testing.assert_allclose(loss[None], reference(xs, ys), rtol=1e-12)
        gx, gy = _central_differences(reference, [xs, ys])
        np.testing.assert_allclose(x.grad.to_numpy(), gx, rtol=1e-6, atol=1e-9)
        np.testing.assert_allclose(y.grad.to_numpy(), gy, rtol=1e-6, atol=1e-9)
    # x[i] and x[i + 1]; y[i] is plain / x[idx[i]] and x[i] (x[0]'s adjoints: summed per chunk first)
    _expect_atomics(arch, shifted, 2 if size > 32 else 0)
    _expect_atomics(arch, indirect, 2 if size > 32 else 0)


def test_two_dimensional_transposed_grouped_and_vector_reads(rng, arch):
    m = qd.field(qd.f64, shape=(6, 6), needs_grad=True)
    v = qd.Vector.field(3, qd.f32, shape=(N,), needs_grad=True)
    loss = qd.field(qd.f64, shape=(), needs_grad=True)

    @qd.kernel
    def square():
        for i, j in m:
            loss[None] += m[i, j] * m[j, i] + qd.cos(m[i, j])

    @qd.kernel
    def grouped():
        for ij in qd.grouped(m):
            loss[None] += m[ij] * m[ij] * m[ij]

    @qd.kernel
    def vectors():
        for i in v:
            a = v[i]
            loss[None] += a.dot(a) * a[0]

    ms = rng.uniform(-1, 1, (6, 6))
    m.from_numpy(ms)
    _tape(square, loss=loss)
    np.testing.assert_allclose(m.grad.to_numpy(), 2 * ms.T - np.sin(ms), rtol=1e-12)
    _tape(grouped, loss=loss)
    np.testing.assert_allclose(m.grad.to_numpy(), 3 * ms ** 2, rtol=1e-12)
    # the transposed read m[j, i] adds into other iterations' elements: every adjoint of m stays
    # atomic in square (a plain read-add-store raced with them on the GPU: wrong gradients)
    _expect_atomics(arch, square, 2)
    _expect_atomics(arch, grouped, 0)

    vs = rng.uniform(-1, 1, (N, 3)).astype(np.float32)
    v.from_numpy(vs)
    _tape(vectors, loss=loss)
    expected = 2 * vs * vs[:, :1]
    expected[:, 0] += (vs * vs).sum(axis=1)
    np.testing.assert_allclose(v.grad.to_numpy(), expected, rtol=1e-5)
    _expect_atomics(arch, vectors, 0)


def test_ndarray_own_index_and_the_same_array_passed_twice(rng, arch):
    a = qd.ndarray(qd.f64, (N,), needs_grad=True)
    b = qd.ndarray(qd.f64, (N,), needs_grad=True)
    loss = qd.field(qd.f64, shape=(), needs_grad=True)

    @qd.kernel
    def pair(p: qd.types.ndarray(dtype=qd.f64, ndim=1), q: qd.types.ndarray(dtype=qd.f64, ndim=1)):
        for i in range(N - 1):
            loss[None] += p[i] * qd.exp(0.5 * q[i + 1])

    @qd.kernel
    def own(p: qd.types.ndarray(dtype=qd.f64, ndim=1), q: qd.types.ndarray(dtype=qd.f64, ndim=1)):
        for i in range(N):
            loss[None] += p[i] * qd.exp(0.5 * q[i])

    def ref_pair(ps, qs):
        return (ps[:-1] * np.exp(0.5 * qs[1:])).sum()

    def ref_own(ps, qs):
        return (ps * np.exp(0.5 * qs)).sum()

    for kernel, reference in ((pair, ref_pair), (own, ref_own)):
        ps, qs = rng.uniform(-1, 1, N), rng.uniform(-1, 1, N)
        a.from_numpy(ps)
        b.from_numpy(qs)
        _tape(kernel, a, b, loss=loss)
        gp, gq = _central_differences(reference, [ps, qs])
        np.testing.assert_allclose(a.grad.to_numpy(), gp, rtol=1e-6, atol=1e-9)
        np.testing.assert_allclose(b.grad.to_numpy(), gq, rtol=1e-6, atol=1e-9)
        # the same array as both arguments: p[i] and q[i + 1] add to one element from two iterations
        a.from_numpy(ps)
        _tape(kernel, a, a, loss=loss)
        np.testing.assert_allclose(a.grad.to_numpy(), sum(_central_differences(
            lambda s: reference(s, s), [ps])), rtol=1e-6, atol=1e-9)
    _expect_atomics(arch, pair, 2, (0, 1))
    _expect_atomics(arch, own, 0, (0, 1))


def test_plus_equals_leaves_no_atomic_and_the_adstack_holds_what_adjoints_need(rng, arch):
    """``loss[None] += v``: no atomic on ``loss.grad`` (its old value has no adjoint), and the
    loop pushes ``v`` and ``t`` (read by the adjoint of ``v * t``), not ``qd.cos(v)`` (read only
    by the adjoint of the constant ``1.5``), nor a path record for its header (counted)."""
    x = qd.field(qd.f64, shape=(N,), needs_grad=True)
    n = qd.field(qd.i32, shape=())
    loss = qd.field(qd.f64, shape=(), needs_grad=True)

    @qd.kernel
    def chain():
        for i in x:
            v = x[i]
            t = 0.5
            for _ in range(n[None]):
                t = qd.cos(v) * 1.5 + 0.2
                v = v * t
            loss[None] += v

    def reference(xs):
        v = xs.copy()
        for _ in range(5):
            v = v * (np.cos(v) * 1.5 + 0.2)
        return v.sum()

    n[None] = 5
    xs = rng.uniform(-1, 1, N)
    x.from_numpy(xs)
    _tape(chain, loss=loss)
    np.testing.assert_allclose(loss[None], reference(xs), rtol=1e-12)
    np.testing.assert_allclose(x.grad.to_numpy(), _central_differences(reference, [xs])[0], rtol=1e-6)
    _expect_atomics(arch, chain, 0)
    if arch == "cpu":
        assert chain.grad.adstacks[0].depth == 2 * (5 + 1)


def test_small_field_read_in_inner_loops_is_summed_per_thread(rng, arch):
    """``w[k, c]`` (4x4) and ``coef[c]`` (f32) read in loops over ``c``: the adjoints of an
    iteration are summed per thread and added once per element (then per chunk/warp), no atomic
    per read; the index tuple ``(k, c)`` built in the loop is replayed from the adstack."""
    x = qd.field(qd.f64, shape=(N,), needs_grad=True)
    w = qd.field(qd.f64, shape=(4, 4), needs_grad=True)
    coef = qd.field(qd.f32, shape=(3,), needs_grad=True)
    n = qd.field(qd.i32, shape=())
    loss = qd.field(qd.f64, shape=(), needs_grad=True)

    @qd.kernel
    def matvec():
        for i in x:
            s = x[i]
            for _ in range(n[None]):
                acc = 0.0
                for c in range(4):
                    acc += w[0, c] * s + w[1, c] * s * s - w[2, c] + w[3, c] * qd.tanh(s)
                s = qd.tanh(acc)
            for c in range(3):
                s = s * coef[c] + qd.sin(s)
            loss[None] += s

    def reference(xs, ws, cs):
        s = xs.copy()
        for _ in range(3):
            acc = 0.0
            for c in range(4):
                acc = acc + ws[0, c] * s + ws[1, c] * s * s - ws[2, c] + ws[3, c] * np.tanh(s)
            s = np.tanh(acc)
        for c in range(3):
            s = s * cs[c] + np.sin(s)
        return s.sum()

    n[None] = 3
    xs, ws = rng.uniform(-1, 1, N), rng.uniform(-0.5, 0.5, (4, 4))
    cs = rng.uniform(0.5, 1.5, 3).astype(np.float32)
    x.from_numpy(xs)
    w.from_numpy(ws)
    coef.from_numpy(cs)
    _tape(matvec, loss=loss)
    np.testing.assert_allclose(loss[None], reference(xs, ws, cs.astype(np.float64)), rtol=1e-6)
    gx, gw, gc = _central_differences(reference, [xs, ws, cs.astype(np.float64)])
    np.testing.assert_allclose(x.grad.to_numpy(), gx, rtol=1e-5, atol=1e-8)
    np.testing.assert_allclose(w.grad.to_numpy(), gw, rtol=1e-6, atol=1e-8)
    np.testing.assert_allclose(coef.grad.to_numpy(), gc, rtol=1e-5)
    _expect_atomics(arch, matvec, 0)
