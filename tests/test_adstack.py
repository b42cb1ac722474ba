"""Adstacks: gradients of parallel loops whose bodies have loops (passes/autodiff.py,
lowering/adstack.py, adstack.py), against central finite differences in f64 on random data —
the anchor, nested loops, integer indices and branch flags carried across iterations,
break/continue, range(start, stop) with max, a while loop — and the sizer's errors."""

from __future__ import annotations

import numpy as np
import pytest
from test_autodiff import _central_differences

import qd_numba as qd
from qd_numba import config

N = 8


def _check(kernel_call, fields, values, loss, reference, rtol=1e-6):
    """Set ``fields`` to ``values``, run ``kernel_call`` under a Tape, compare every ``.grad``
    with the central differences of ``reference(*values)``."""
    for f, v in zip(fields, values):
        f.from_numpy(v)
    loss[None] = 0
    with qd.ad.Tape(loss=loss):
        kernel_call()
    np.testing.assert_allclose(loss[None], reference(*values), rtol=1e-10)
    expected = _central_differences(reference, [v.copy() for v in values])
    for f, g in zip(fields, expected):
        np.testing.assert_allclose(f.grad.to_numpy(), g, rtol=rtol, atol=1e-7)


def test_anchor_sin_chain_matches_finite_differences(rng, arch):
    x = qd.field(qd.f64, shape=(N,), needs_grad=True)
    n = qd.field(qd.i32, shape=())
    loss = qd.field(qd.f64, shape=(), needs_grad=True)

    @qd.kernel
    def anchor():
        for i in x:
            v = x[i]
            for _ in range(n[None]):
                v = qd.sin(v) * 1.01
            loss[None] += v

    def reference(xs):
        v = xs.copy()
        for _ in range(steps):
            v = np.sin(v) * 1.01
        return v.sum()

    for steps in (0, 1, 7, 32):
        n[None] = steps
        _check(anchor, [x], [rng.uniform(-2, 2, N)], loss, reference)
        if arch == "cpu":   # per iteration: v (sin(v) is read only by the adjoint of the constant 1.01,
            # which nothing needs; the loop header's executions are counted, not recorded)
            assert anchor.grad.last_instance.state.adstacks[0].depth == max(1, steps + 1)


def test_nested_loops_with_shape_bounds_and_loop_carried_index(rng):
    x, w = (qd.field(qd.f64, shape=(N,), needs_grad=True) for _ in range(2))
    loss = qd.field(qd.f64, shape=(), needs_grad=True)

    @qd.kernel
    def nested(a: qd.types.ndarray(dtype=qd.f64, ndim=2), m: qd.i32):
        for i in x:
            v = x[i]
            k = i
            for j in range(m):
                for r in range(a.shape[1]):
                    k = (k + 3) % N                  # an integer index into a global, carried
                    v = v * w[k] + qd.cos(v) * a[j, r]   # a[j, r]: an ndarray argument, no gradient
            loss[None] += v * v

    a = rng.uniform(-0.5, 0.5, (3, 2))

    def reference(xs, ws):
        total = 0.0
        for i in range(N):
            v, k = xs[i], i
            for j in range(3):
                for r in range(2):
                    k = (k + 3) % N
                    v = v * ws[k] + np.cos(v) * a[j, r]
            total += v * v
        return total

    _check(lambda: nested(a, 3), [x, w], [rng.uniform(-1, 1, N), rng.uniform(0.5, 1.0, N)], loss, reference)


def test_branch_flags_break_and_continue(rng):
    x = qd.field(qd.f64, shape=(N,), needs_grad=True)
    loss = qd.field(qd.f64, shape=(), needs_grad=True)

    @qd.kernel
    def branchy(steps: qd.i32, lo: qd.i32):
        for i in x:
            v = x[i]
            for j in range(lo, max(steps, lo + 1)):
                if j % 3 == 1:
                    continue
                if v > 0.5:
                    v = v * v * 0.9
                else:
                    v = qd.exp(v) - 0.3
                if v > 4.0:
                    break
            loss[None] += v

    def reference(xs):
        total = 0.0
        for v in xs:
            for j in range(2, max(11, 3)):
                if j % 3 == 1:
                    continue
                v = v * v * 0.9 if v > 0.5 else np.exp(v) - 0.3
                if v > 4.0:
                    break
            total += v
        return total

    _check(lambda: branchy(11, 2), [x], [rng.uniform(-1.5, 2.5, N)], loss, reference)


def test_while_loop_needs_ad_stack_size_then_matches_finite_differences(rng):
    def make_grow():    # fields and kernel, made again after the qd.init below (which releases fields)
        x = qd.field(qd.f64, shape=(N,), needs_grad=True)
        loss = qd.field(qd.f64, shape=(), needs_grad=True)

        @qd.kernel
        def grow():
            for i in x:
                v = x[i]
                while v < 3.0:                  # a data-dependent trip count
                    v = v * 1.3 + 0.2
                loss[None] += v * v

        return x, loss, grow

    x, loss, grow = make_grow()

    def reference(xs):
        total = 0.0
        for v in xs:
            while v < 3.0:
                v = v * 1.3 + 0.2
            total += v * v
        return total

    values = rng.uniform(0.1, 2.0, N)
    x.from_numpy(values)
    grow()
    with pytest.raises(qd.QuadrantsCompilationError, match="ad_stack_size") as info:
        grow.grad()
    assert "while v < 3.0" in str(info.value)
    assert "kernel 'grow.grad'" in str(info.value)
    qd.init(arch=config.current.arch, ad_stack_size=256)
    x, loss, grow = make_grow()
    try:
        _check(grow, [x], [values], loss, reference)
    finally:
        qd.init(arch=config.current.arch)


def test_overflow_raises_naming_kernel_task_and_cause(rng):
    x = qd.field(qd.f64, shape=(N,), needs_grad=True)
    loss = qd.field(qd.f64, shape=(), needs_grad=True)

    @qd.kernel
    def chain(steps: qd.i32):
        for i in x:
            v = x[i]
            for _ in range(steps):
                v = qd.sin(v) + 0.5
            loss[None] += v

    qd.init(arch=config.current.arch, ad_stack_size=64)     # before the fields' first use (it releases them)
    x.from_numpy(rng.uniform(-1, 1, N))
    try:
        chain(100)                          # 101 words (v per iteration) > 64
        with pytest.raises(qd.QuadrantsRuntimeError, match="adstack overflow") as info:
            chain.grad(100)
            qd.sync()     # on CUDA the overflow surfaces at the next synchronisation (docs/autodiff.md)
        message = str(info.value)
        assert "chain.grad" in message and "test_adstack.py:" in message and "ad_stack_size=64" in message
        x.grad.fill(0)
        loss.grad[None] = 1
        chain.grad(2)                       # the flag was cleared: a call that fits runs
        assert np.all(x.grad.to_numpy() != 0)
    finally:
        qd.init(arch=config.current.arch)


def test_heap_grows_with_the_loop_bound_and_is_reused(rng, arch):
    x = qd.field(qd.f64, shape=(N,), needs_grad=True)
    loss = qd.field(qd.f64, shape=(), needs_grad=True)

    @qd.kernel
    def chain(steps: qd.i32):
        for i in x:
            v = x[i]
            for _ in range(steps):
                v = v * 0.5 + qd.sin(v)
            loss[None] += v

    def reference_for(steps):
        def reference(xs):
            v = xs.copy()
            for _ in range(steps):
                v = v * 0.5 + np.sin(v)
            return v.sum()
        return reference

    values = rng.uniform(-1, 1, N)
    heaps = []
    for steps in (3, 50, 2):
        _check(lambda: chain(steps), [x], [values], loss, reference_for(steps))
        if arch == "cpu":
            stack = chain.grad.last_instance.state.adstacks[0]
            heaps.append((stack.heap, stack.depth))
    if arch == "cpu":
        assert heaps[1][1] > heaps[0][1] > heaps[2][1]          # the depth follows the loop bound
        assert heaps[1][0] is not heaps[0][0] and heaps[2][0] is heaps[1][0]   # grown, then reused


def test_unbounded_inner_loop_is_a_compile_error_naming_the_line():
    x = qd.field(qd.f64, shape=(N,), needs_grad=True)
    loss = qd.field(qd.f64, shape=(), needs_grad=True)

    @qd.kernel
    def by_value():
        for i in x:
            v = x[i]
            for _ in range(int(x[i] * 4)):  # a bound from a float (per-thread bounds are integer elements)
                v = qd.sin(v)
            loss[None] += v

    x.from_numpy(np.linspace(0.5, 2.0, N))
    by_value()
    with pytest.raises(qd.QuadrantsCompilationError, match="adstack sizer cannot bound") as info:
        by_value.grad()
    assert "for _ in range(int(x[i] * 4))" in str(info.value)


@pytest.mark.cuda
def test_cuda_anchor_matches_finite_differences(rng):
    qd.init(arch=qd.cuda)
    try:
        x = qd.field(qd.f64, shape=(4096,), needs_grad=True)
        n = qd.field(qd.i32, shape=())
        loss = qd.field(qd.f64, shape=(), needs_grad=True)

        @qd.kernel
        def anchor():
            for i in x:
                v = x[i]
                for _ in range(n[None]):
                    v = qd.sin(v) * 1.01
                loss[None] += v

        values = rng.uniform(-2, 2, 4096)
        for steps in (32, 5):
            n[None] = steps
            x.from_numpy(values)
            with qd.ad.Tape(loss=loss):
                anchor()
            v, dv = values.copy(), np.ones_like(values)
            for _ in range(steps):
                dv = dv * np.cos(v) * 1.01
                v = np.sin(v) * 1.01
            np.testing.assert_allclose(x.grad.to_numpy(), dv, rtol=1e-10)
        qd.init(arch=qd.cuda, ad_stack_size=4)   # releases the fields above: make them again
        x2 = qd.field(qd.f64, shape=(64,), needs_grad=True)
        n = qd.field(qd.i32, shape=())
        loss = qd.field(qd.f64, shape=(), needs_grad=True)

        @qd.kernel
        def small():
            for i in x2:
                v = x2[i]
                for _ in range(n[None]):
                    v = qd.sin(v)
                loss[None] += v

        n[None] = 30
        small()
        with pytest.raises(qd.QuadrantsRuntimeError, match="adstack overflow"):
            small.grad()
            qd.sync()     # on CUDA the overflow surfaces at the next synchronisation (docs/autodiff.md)
    finally:
        qd.init()


def test_ndarray_argument_is_a_constant_unless_it_has_a_gradient(rng):
    x = qd.field(qd.f64, shape=(N,), needs_grad=True)
    loss = qd.field(qd.f64, shape=(), needs_grad=True)

    @qd.kernel
    def scaled(a: qd.types.ndarray(dtype=qd.f64, ndim=1)):
        for i in x:
            loss[None] += x[i] * a[i]

    plain = rng.uniform(-1, 1, N)
    x.from_numpy(rng.uniform(-1, 1, N))
    with qd.ad.Tape(loss=loss):
        scaled(plain)
    np.testing.assert_allclose(x.grad.to_numpy(), plain, rtol=1e-12)     # d loss / d x = a
    a = qd.ndarray(qd.f64, shape=(N,), needs_grad=True)
    a.from_numpy(plain)
    with qd.ad.Tape(loss=loss):
        scaled(a)
    np.testing.assert_allclose(x.grad.to_numpy(), plain, rtol=1e-12)
    np.testing.assert_allclose(a.grad.to_numpy(), x.to_numpy(), rtol=1e-12)     # d loss / d a = x
