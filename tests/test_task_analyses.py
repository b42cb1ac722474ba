"""Each Task carries its analyses: the iteration space as size expressions (passes/bounds.py) and
its reads and writes of global data with address fingerprints (passes/accesses.py)."""

from __future__ import annotations

import numpy as np

import qd_numba as qd

field16 = qd.field(qd.f32, shape=(16,), name="field16")


@qd.kernel
def spaces(a: qd.types.ndarray(dtype=qd.f32, ndim=1), b: qd.types.ndarray(dtype=qd.f32, ndim=2), n: qd.i32):
    for i in range(n):
        a[i] += 1.0
    for i in range(2, n, 3):
        a[i] += 10.0
    for i, j in qd.ndrange(b.shape[0], (1, 4)):
        b[i, j] += 1.0
    for i in field16:
        field16[i] += a[i]
    for idx in qd.grouped(b):
        b[idx] *= 2.0
    for i in range(n - 1):
        a[i + 1] += a[0] * 0.0


def test_bounds_are_structured_and_readable(rng):
    a = rng.random(20).astype(np.float32)
    b = rng.random((3, 5)).astype(np.float32)
    f0 = rng.random(16).astype(np.float32)
    field16.from_numpy(f0)
    a0, b0 = a.copy(), b.copy()
    spaces(a, b, 16)
    ref_a = a0.copy()
    ref_a[:16] += 1
    ref_a[2:16:3] += 10
    ref_b = b0.copy()
    ref_b[:, 1:4] += 1
    ref_b *= 2
    np.testing.assert_allclose(a, ref_a, rtol=1e-6)
    np.testing.assert_allclose(b, ref_b, rtol=1e-6)
    np.testing.assert_allclose(field16.to_numpy(), f0 + ref_a[:16], rtol=1e-6)

    tasks = [t for t in spaces.tasks(a, b, 16) if t.kind == "range_for"]
    texts = [str(t.bounds) for t in tasks]
    assert texts == ["range(n)", "range(2, n, 3)", "ndrange(b.shape[0], (1, 4))", "range(16)",
                     "grouped(ndrange(b.shape[0], b.shape[1]))", "range((n - 1))"]
    one, zero = ("const", 1), ("const", 0)
    n_arg = ("arg", 2)
    assert tasks[0].bounds.dims == ((zero, n_arg, one),)
    assert tasks[1].bounds.dims == ((("const", 2), n_arg, ("const", 3)),)
    assert tasks[3].bounds.dims == ((zero, ("const", 16), one),)
    assert tasks[2].bounds.dims[0][1] == ("shape", ("arg", 1), 0)
    assert "over range(n) at" in tasks[0].describe()


def test_tasks_carry_read_and_write_sets(rng):
    total = qd.field(qd.f32, shape=(), name="total")

    @qd.kernel
    def rw(a: qd.types.ndarray(dtype=qd.f32, ndim=1), b: qd.types.ndarray(dtype=qd.f32, ndim=1)):
        total[None] = 0.0
        for i in range(a.shape[0]):
            b[i] = a[i] * 2.0
        for i in range(a.shape[0]):
            total[None] += b[i]

    a = rng.random(32).astype(np.float32)
    b = np.zeros_like(a)
    rw(a, b)
    np.testing.assert_allclose(b, a * 2, rtol=1e-6)
    np.testing.assert_allclose(total[None], np.sum(a * 2), rtol=1e-5)
    serial, first, second = rw.tasks(a, b)
    assert serial.kind == "serial" and serial.writes == {"total"} and not serial.reads
    assert first.reads == {"a"} and first.writes == {"b"}
    assert second.reads == {"b", "total"} and second.writes == {"total"}   # += reads, then updates atomically
    store = next(acc for acc in first.accesses if acc.kind == "write")
    assert store.where.covers == frozenset({0})        # b[i]: injective in the loop index
    atomic = next(acc for acc in second.accesses if acc.kind == "write")
    assert atomic.where.covers is None                  # total[None]: every thread, one address
