"""Mistakes that used to pass silently, now our errors naming the kernel, argument or line:
atomics on what cannot be written, assignments to kernel arguments, ints that do not fit their
parameter, complex data into a real field; and qd.Vector.ndarray / qd.Matrix.ndarray."""

import numpy as np
import pytest

import qd_numba as qd


def _raises(exc, kernel, args, *fragments):
    with pytest.raises(exc) as info:
        kernel(*args)
    text = str(info.value)
    for fragment in (f"kernel '{kernel.name}'", *fragments):
        assert fragment in text, text


@qd.kernel
def atomic_on_constant(a: qd.types.ndarray(dtype=qd.f32, ndim=1)):
    for i in a:
        qd.atomic_add(1.0, a[i])


@qd.kernel
def atomic_on_expression(a: qd.types.ndarray(dtype=qd.f32, ndim=1)):
    for i in a:
        qd.atomic_max(a[i] * 2.0, 3.0)


@qd.kernel
def atomic_on_argument(a: qd.types.ndarray(dtype=qd.f32, ndim=1), s: qd.f32):
    for i in a:
        qd.atomic_add(s, a[i])


@qd.kernel
def assigns_argument(n: qd.i32) -> qd.i32:
    n = n * 2
    return n


@qd.kernel
def updates_argument(a: qd.types.ndarray(dtype=qd.f32, ndim=1), k: qd.f32):
    k += 1.0
    for i in a:
        a[i] = k


def test_atomic_destinations():
    a = np.ones(4, np.float32)
    _raises(qd.QuadrantsSyntaxError, atomic_on_constant, (a,), "qd.atomic_add", "is a constant",
            "qd.atomic_add(1.0, a[i])")
    _raises(qd.QuadrantsSyntaxError, atomic_on_expression, (a,), "qd.atomic_max", "is an expression",
            "qd.atomic_max(a[i] * 2.0, 3.0)")
    _raises(qd.QuadrantsSyntaxError, atomic_on_argument, (a, 1.0), "kernel argument 's'",
            "qd.atomic_add(s, a[i])")


def test_assigning_an_argument():
    a = np.ones(4, np.float32)
    _raises(qd.QuadrantsSyntaxError, assigns_argument, (3,), "kernel argument 'n' is immutable", "n = n * 2")
    _raises(qd.QuadrantsSyntaxError, updates_argument, (a, 1.0), "kernel argument 'k' is immutable", "k += 1.0")


@qd.kernel
def local_copy_and_atomics(a: qd.types.ndarray(dtype=qd.f32, ndim=1), k: qd.f32) -> qd.f32:
    m = k
    m += 1.0
    s = 0.0
    for i in a:
        qd.atomic_add(a[i], m)
        s += a[i]
    return s


def test_what_stays_allowed(rng):
    a = rng.uniform(-3, 3, 9).astype(np.float32)
    ref = a + np.float32(2.5)
    s = local_copy_and_atomics(a, 1.5)
    np.testing.assert_allclose(a, ref, rtol=1e-6)
    assert s == pytest.approx(float(ref.sum()), rel=1e-5)


@qd.kernel
def small_ints(x: qd.i16, y: qd.u32) -> qd.i64:
    return x * 2 + y


def test_int_argument_out_of_range(rng):
    x, y = int(rng.integers(-3000, 3000)), int(rng.integers(0, 2**31))
    assert small_ints(x, y) == 2 * x + y
    with pytest.raises(qd.QuadrantsTypeError, match=r"kernel 'small_ints', argument 'x': 40000 does not fit in int16"):
        small_ints(40000, y)
    with pytest.raises(qd.QuadrantsTypeError, match=r"argument 'y': 4294967296 does not fit in uint32"):
        small_ints(x, 2**32)


def test_from_numpy_complex_is_error(rng):
    f = qd.field(qd.f32, shape=(5,))
    nd = qd.ndarray(qd.f64, shape=(5,))
    data = rng.uniform(-1, 1, 5) + 1j * rng.uniform(-1, 1, 5)
    for target in (f, nd):
        with pytest.raises(qd.QuadrantsTypeError, match="complex array"):
            target.from_numpy(data)
    f.from_numpy(data.real.astype(np.float32))
    np.testing.assert_allclose(f.to_numpy(), data.real, rtol=1e-6)


@qd.kernel
def vec_mat(v: qd.types.ndarray(dtype=qd.types.vector(3, qd.f32), ndim=1),
            m: qd.types.ndarray(dtype=qd.types.matrix(2, 2, qd.f32), ndim=1),
            out: qd.types.ndarray(dtype=qd.f32, ndim=1)):
    for i in v:
        out[i] = v[i].dot(v[i]) + m[i][0, 1] * m[i][1, 0]


def test_vector_and_matrix_ndarrays(rng):
    v = qd.Vector.ndarray(3, qd.f32, shape=(6,))
    m = qd.Matrix.ndarray(2, 2, qd.f32, (6,))
    assert v.shape == (6,) and m.shape == (6,)
    vd = rng.uniform(-2, 2, (6, 3)).astype(np.float32)
    md = rng.uniform(-2, 2, (6, 2, 2)).astype(np.float32)
    v.from_numpy(vd)
    m.from_numpy(md)
    out = qd.ndarray(qd.f32, shape=(6,))
    vec_mat(v, m, out)
    np.testing.assert_allclose(out.to_numpy(), (vd * vd).sum(1) + md[:, 0, 1] * md[:, 1, 0], rtol=1e-5)
    filled = qd.Vector.ndarray(2, qd.f32, (3,), fill=1.5)
    np.testing.assert_array_equal(filled.to_numpy(), np.full((3, 2), 1.5, np.float32))
