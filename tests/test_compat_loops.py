"""Quadrants' loop rules (issue 14, "Loops" and "Kernel-scope locals"): break in serialised
loops, ndrange forms, grouped indices spread into subscripts, 0-d struct-fors, compile-time-only
loops over Python sequences and ``in``, and kernel-scope reductions written as ``qd.max``."""

from __future__ import annotations

import numpy as np
import pytest

import qd_numba as qd

# -- break in a serialised top-level loop --------------------------------------------------------


@qd.kernel
def first_negative(a: qd.types.ndarray(dtype=qd.f64, ndim=1)) -> qd.i32:
    k = -1
    qd.loop_config(serialize=True)
    for i in range(a.shape[0]):
        if a[i] < 0:
            k = i
            break
    return k


@qd.kernel
def sum_until(a: qd.types.ndarray(dtype=qd.i32, ndim=1), stop: qd.i32) -> qd.i32:
    total = 0
    qd.loop_config(parallelize=1)          # Quadrants' other spelling of serialize=True
    for i in range(a.shape[0]):
        total += a[i]
        if i == stop:
            break
    return total


@qd.kernel
def last_above(a: qd.types.ndarray(dtype=qd.f64, ndim=1), t: qd.f64) -> qd.i32:
    k = -1
    qd.loop_config(serialize=True)
    for i in range(a.shape[0]):
        if a[i] > t:
            k = i                               # read after the loop: the last one, in order
    return k


def test_break_in_serialised_loop(rng):
    a = rng.standard_normal(200) + 1.0
    assert first_negative(a) == int(np.argmax(a < 0))
    assert first_negative(np.abs(a)) == -1
    v = rng.integers(-50, 50, 100).astype(np.int32)
    stop = int(rng.integers(0, 100))
    assert sum_until(v, stop) == v[:stop + 1].sum()
    # Quadrants' own example: returns 55
    assert sum_until(np.arange(100, dtype=np.int32), 10) == 55
    t = float(rng.uniform(0.5, 1.5))
    assert last_above(a, t) == np.nonzero(a > t)[0][-1]
    assert [task.kind for task in last_above.tasks(a, t)] == ["serial"]


@qd.kernel
def break_in_parallel(a: qd.types.ndarray(dtype=qd.f64, ndim=1)):
    for i in range(a.shape[0]):
        if a[i] < 0:
            break


def test_break_in_parallel_loop_is_an_error():
    with pytest.raises(qd.QuadrantsSyntaxError, match="'break' out of a parallel") as e:
        break_in_parallel(np.ones(4))
    assert "test_compat_loops.py" in str(e.value) and "if a[i] < 0:" in str(e.value)   # the exit's line


# -- qd.ndrange --------------------------------------------------------------------------------------


@qd.kernel
def ndrange_mixed(a: qd.types.ndarray(dtype=qd.f64, ndim=4), out: qd.types.ndarray(dtype=qd.f64, ndim=4),
                  lo: qd.i32, hi: qd.i32):
    for i, j, k, m in qd.ndrange(2, (1, 4), (lo, hi), (3, 5)):
        out[i, j, k, m] = a[i, j, k, m] * 2.0 + i - m


def test_ndrange_with_four_arguments_and_empty_ranges(rng):
    a = rng.standard_normal((3, 5, 6, 6))
    for lo, hi in ((2, 5), (4, 2), (3, 3)):      # start > end and start == end: no iterations
        init = rng.standard_normal(a.shape)
        out = init.copy()
        ndrange_mixed(a, out, lo, hi)
        ref = init.copy()
        if hi > lo:
            i = np.arange(2)[:, None, None, None]
            m = np.arange(3, 5)[None, None, None, :]
            ref[:2, 1:4, lo:hi, 3:5] = a[:2, 1:4, lo:hi, 3:5] * 2.0 + i - m
        np.testing.assert_array_equal(out, ref)


# -- grouped indices in subscripts --------------------------------------------------------------------

vf = qd.field(qd.f64, shape=(3, 4, 2))


@qd.func
def weigh(w, i, j):
    return w * (i * 10 + j)


@qd.kernel
def grouped_spread(a: qd.types.ndarray(dtype=qd.f64, ndim=3), out: qd.types.ndarray(dtype=qd.f64, ndim=3)):
    for g in qd.grouped(qd.ndrange((1, 3), 4)):
        out[g, 0] = a[g, 1] + g[0]          # vector first, then an int
        out[0, g] = a[0, g] * 3.0           # an int first
        vf[g, 1] = a[(*g, 0)] - 1.0         # ``*`` spreads g (``a[*g, 0]`` on Python 3.11+)
        vf[g, 0] += a[g, 1] + weigh(0.5, *g)   # ``*`` spreads g into a func's parameters


def test_grouped_index_spread_into_subscripts(rng):
    a = rng.standard_normal((4, 4, 4))
    init = rng.standard_normal((4, 4, 4))
    vinit = rng.standard_normal((3, 4, 2))
    vf.from_numpy(vinit)
    out = init.copy()
    grouped_spread(a, out)
    ref = init.copy()
    ref[1:3, :, 0] = a[1:3, :, 1] + np.arange(1, 3)[:, None]
    ref[0, 1:3, :] = a[0, 1:3, :] * 3.0
    np.testing.assert_allclose(out, ref, rtol=1e-12)
    vref = vinit.copy()
    vref[1:3, :, 1] = a[1:3, :4, 0] - 1.0
    vref[1:3, :, 0] += a[1:3, :4, 1] + 0.5 * (np.arange(1, 3)[:, None] * 10 + np.arange(4)[None, :])
    np.testing.assert_allclose(vf.to_numpy(), vref, rtol=1e-12)


@qd.kernel
def spread_too_many(out: qd.types.ndarray(dtype=qd.f64, ndim=3)):
    for g in qd.grouped(out):
        out[g] = weigh(1.0, *g)


def test_spread_length_must_match():
    with pytest.raises(qd.QuadrantsTypeError, match="passes 4 values to 3 positional parameters") as e:
        spread_too_many(np.zeros((2, 2, 2)))
    assert "out[g] = weigh(1.0, *g)" in str(e.value)


# -- 0-d struct-for -------------------------------------------------------------------------------------

scalar = qd.field(qd.f64, shape=())


@qd.kernel
def zero_d_grouped(k: qd.f64):
    for g in qd.grouped(scalar):
        scalar[g] = scalar[g] * k + 1.0


@qd.kernel
def zero_d_one_target():
    for _ in scalar:
        scalar[None] += 1.0


def test_zero_d_struct_for(rng):
    start, k = float(rng.standard_normal()), float(rng.standard_normal())
    scalar[None] = start
    zero_d_grouped(k)                          # one iteration, g is the empty index
    assert np.isclose(scalar[None], start * k + 1.0)
    assert [t.ndim for t in zero_d_grouped.tasks(k)] == [0]
    with pytest.raises(qd.QuadrantsIndexError, match="a loop over 0 dimensions needs 0 targets") as e:
        zero_d_one_target()
    assert "for _ in scalar:" in str(e.value)


# -- Python lists and tuples, ``in`` -----------------------------------------------------------------

SIZES = [1, 3, 4]


@qd.kernel
def over_global_list(out: qd.types.ndarray(dtype=qd.f64, ndim=1)):
    for v in SIZES:
        out[v] = 1.0


@qd.kernel
def over_literal_tuple(out: qd.types.ndarray(dtype=qd.f64, ndim=1)):
    for i in range(out.shape[0]):
        for v in (1, 2):
            out[i] += v


@qd.kernel
def membership(out: qd.types.ndarray(dtype=qd.f64, ndim=1)):
    for i in range(out.shape[0]):
        if i in (1, 2):
            out[i] = 1.0


@qd.kernel
def not_membership(out: qd.types.ndarray(dtype=qd.f64, ndim=1)):
    for i in range(out.shape[0]):
        if i not in (1, 2):
            out[i] = 1.0


@pytest.mark.parametrize("kernel, cls, message, line", [
    (over_global_list, qd.QuadrantsTypeError, "cannot loop over a list at run time", "for v in SIZES:"),
    (over_literal_tuple, qd.QuadrantsTypeError, "cannot loop over a tuple at run time", "for v in (1, 2):"),
    (membership, qd.QuadrantsSyntaxError, "'in' is only supported inside qd.static", "if i in (1, 2):"),
    (not_membership, qd.QuadrantsSyntaxError, "'not in' is only supported inside qd.static",
     "if i not in (1, 2):"),
], ids=["list", "tuple", "in", "not_in"])
def test_runtime_sequences_and_membership_are_errors(kernel, cls, message, line):
    with pytest.raises(cls, match=message) as e:
        kernel(np.zeros(5))
    assert line in str(e.value)


@qd.kernel
def static_sequences(a: qd.types.ndarray(dtype=qd.f64, ndim=1), out: qd.types.ndarray(dtype=qd.f64, ndim=1)):
    for i in range(a.shape[0]):
        for s in qd.static(range(5)):
            if qd.static(s in SIZES):              # ``in`` inside qd.static, on a static loop's target
                out[i] += s * a[i]
            if qd.static(s not in (0, 1, 2)):
                out[i] += 1000.0
        for v in qd.static(SIZES):
            out[i] += v


def test_static_sequences_and_membership(rng):
    a = rng.standard_normal(9)
    init = rng.standard_normal(9)
    out = init.copy()
    static_sequences(a, out)
    np.testing.assert_allclose(out, init + (1 + 3 + 4) * a + 8 + 2000.0, rtol=1e-12)


# -- kernel-scope locals ----------------------------------------------------------------------------------


@qd.kernel
def extrema(a: qd.types.ndarray(dtype=qd.f64, ndim=1), out: qd.types.ndarray(dtype=qd.f64, ndim=1)) -> qd.f64:
    hi = -1e300
    lo = 1e300
    s = 0.0
    for i in a:
        hi = qd.max(hi, a[i])
        lo = min(a[i], lo)                   # builtin, operand first
        s += a[i]
    for i in a:
        out[i] = (a[i] - lo) / (hi - lo)     # a later task reads the reduced values
    return s + 10.0 * hi - 100.0 * lo


@qd.kernel
def int_extrema(v: qd.types.ndarray(dtype=qd.i32, ndim=2)) -> qd.i32:
    m = -(2 ** 31)
    for i, j in v:
        qd.atomic_max(m, v[i, j])
    return m


def test_kernel_scope_extrema(rng):
    for n in (1, 37, 4000):
        a = rng.standard_normal(n) * 5
        out = np.zeros(n)
        got = extrema(a, out)
        assert np.isclose(got, a.sum() + 10 * a.max() - 100 * a.min(), rtol=1e-12)
        if n > 1:
            np.testing.assert_allclose(out, (a - a.min()) / (a.max() - a.min()), rtol=1e-12)
    v = rng.integers(-1000, 1000, (13, 17)).astype(np.int32)
    assert int_extrema(v) == v.max()


@qd.kernel
def vector_locals(x: qd.types.ndarray(dtype=qd.f64, ndim=1), out: qd.types.ndarray(dtype=qd.f64, ndim=1)) \
        -> qd.types.vector(3, qd.f64):
    s = qd.Vector([0.5, 0.0, 0.0], dt=qd.f64)
    m = qd.Vector([-1e300, -1e300], dt=qd.f64)
    c = qd.Matrix([[0, 0], [0, 0]], dt=qd.i32)
    for i in x:
        s += qd.Vector([x[i], 1.0, x[i] * x[i]], dt=qd.f64)
        qd.atomic_max(m, qd.Vector([x[i], -x[i]], dt=qd.f64))
        c += qd.Matrix([[1, i], [0, 2]], dt=qd.i32)
    for i in x:
        out[i] = x[i] - s[0]                 # a later task reads the reduced vector
    return s + qd.Vector([m[0], m[1], c[0, 1] + 1000 * c[1, 1]], dt=qd.f64)


def test_vector_and_matrix_kernel_scope_locals(rng):
    for n in (1, 45, 3000):
        x = rng.standard_normal(n)
        out = np.zeros(n)
        got = vector_locals(x, out).to_numpy()
        want = [0.5 + x.sum() + x.max(), n - x.min(), (x * x).sum() + n * (n - 1) // 2 + 2000 * n]
        np.testing.assert_allclose(got, want, rtol=1e-12)
        np.testing.assert_allclose(out, x - 0.5 - x.sum(), rtol=1e-12, atol=1e-12)


@pytest.fixture
def on_cuda():
    def fresh_fields():   # a qd.init releases the module's fields; the kernels read their globals again
        global vf, scalar
        vf, scalar = qd.field(qd.f64, shape=(3, 4, 2)), qd.field(qd.f64, shape=())

    qd.init(arch=qd.cuda)
    fresh_fields()
    yield
    qd.init(arch=qd.cpu)
    fresh_fields()


@pytest.mark.cuda
def test_gpu_loops_and_kernel_scope_locals(rng, on_cuda):
    test_break_in_serialised_loop(rng)
    test_ndrange_with_four_arguments_and_empty_ranges(rng)
    test_grouped_index_spread_into_subscripts(rng)
    test_zero_d_struct_for(rng)
    test_kernel_scope_extrema(rng)
    test_vector_and_matrix_kernel_scope_locals(rng)


@qd.kernel
def racy_assignment(a: qd.types.ndarray(dtype=qd.f64, ndim=1)) -> qd.f64:
    m = 0.0
    for i in a:
        m = qd.max(m, a[i]) + 1.0
    return m


def test_other_assignments_stay_errors():
    with pytest.raises(qd.QuadrantsSyntaxError, match="local variable 'm' is assigned inside a parallel") as e:
        racy_assignment(np.ones(4))
    assert "m = qd.max(m, a[i]) + 1.0" in str(e.value)
