"""qd math functions on scalars, vectors and matrices, compiled and in Python scope, against numpy
on random data. One njit function per math function, shared by all parametrizations."""

from __future__ import annotations

import numba
import numpy as np
import pytest
from numba.core.errors import TypingError

import qd_numba.math as qm
from qd_numba import dtypes as qd
from qd_numba.errors import QuadrantsTypeError
from qd_numba.matrix import Matrix, Vector

RNG = np.random.default_rng(4321)

UNARY = {  # name -> (numpy reference, input range)
    "sin": (np.sin, (-3, 3)), "cos": (np.cos, (-3, 3)), "tan": (np.tan, (-1.2, 1.2)),
    "asin": (np.arcsin, (-0.99, 0.99)), "acos": (np.arccos, (-0.99, 0.99)), "atan": (np.arctan, (-5, 5)),
    "exp": (np.exp, (-3, 3)), "log": (np.log, (0.1, 5)), "sqrt": (np.sqrt, (0.0, 9)),
    "rsqrt": (lambda x: 1 / np.sqrt(x), (0.1, 9)), "tanh": (np.tanh, (-3, 3)), "abs": (np.abs, (-3, 3)),
    "floor": (np.floor, (-3, 3)), "ceil": (np.ceil, (-3, 3)),
    "round": (lambda x: np.sign(x) * np.floor(np.abs(x) + 0.5), (-3, 3)),
}
BINARY = {
    "atan2": (np.arctan2, (-3, 3)), "pow": (np.power, (0.2, 3)), "min": (np.minimum, (-3, 3)),
    "max": (np.maximum, (-3, 3)),
}
JIT = {name: numba.njit(eval(f"lambda *a: qm.{name}(*a)")) for name in [*UNARY, *BINARY, "clamp"]}
FLOAT_FUNCS = {"sin", "cos", "tan", "asin", "acos", "atan", "exp", "log", "sqrt", "rsqrt", "tanh", "atan2"}


def tol(npdt):
    return dict(rtol=2e-6, atol=2e-6) if npdt == np.float32 else dict(rtol=1e-12, atol=1e-12)


def as_obj(arr):
    return Vector(arr, dt=qd.to_numba(arr.dtype)) if arr.ndim == 1 else Matrix(arr, dt=qd.to_numba(arr.dtype))


@pytest.mark.parametrize("npdt", [np.float32, np.float64], ids=["f32", "f64"])
@pytest.mark.parametrize("name", list(UNARY))
def test_unary_float(name, npdt):
    ref, (lo, hi) = UNARY[name]
    x = RNG.uniform(lo, hi, size=(2, 3)).astype(npdt) if npdt == np.float32 else RNG.uniform(lo, hi, 3)
    for scope in (JIT[name], getattr(qm, name)):
        out = scope(as_obj(x))
        assert out.to_numpy().dtype == npdt
        np.testing.assert_allclose(out.to_numpy(), ref(x.astype(np.float64)).astype(npdt), **tol(npdt))
    s = npdt(x.flat[0])
    for scope in (JIT[name], getattr(qm, name)):
        np.testing.assert_allclose(scope(s), ref(np.float64(s)), **tol(npdt))


@pytest.mark.parametrize("name", ["sqrt", "exp", "abs", "floor", "round"])
def test_unary_int(name):
    x = RNG.integers(0, 5, size=3).astype(np.int32)
    ref = UNARY[name][0]
    expect_dt = np.float32 if name in FLOAT_FUNCS else np.int32
    for scope in (JIT[name], getattr(qm, name)):
        out = scope(as_obj(x)).to_numpy()
        assert out.dtype == expect_dt
        np.testing.assert_allclose(out, ref(x.astype(np.float64)).astype(expect_dt), rtol=2e-6)


@pytest.mark.parametrize("npdt", [np.float32, np.float64], ids=["f32", "f64"])
@pytest.mark.parametrize("name", list(BINARY))
def test_binary_broadcast(name, npdt):
    ref, (lo, hi) = BINARY[name]
    x, y = (RNG.uniform(lo, hi, size=4).astype(npdt) for _ in range(2))
    s = npdt(RNG.uniform(lo, hi))
    cases = [((as_obj(x), as_obj(y)), (x, y)), ((as_obj(x), s), (x, s)), ((s, as_obj(y)), (s, y))]
    for scope in (JIT[name], getattr(qm, name)):
        for args, ref_args in cases:
            out = scope(*args).to_numpy()
            assert out.dtype == npdt
            np.testing.assert_allclose(out, ref(*[np.float64(a) if np.isscalar(a) else a.astype(np.float64)
                                                  for a in ref_args]).astype(npdt), **tol(npdt))
        np.testing.assert_allclose(scope(s, npdt(0.5)), ref(np.float64(s), 0.5), **tol(npdt))


def test_min_max_int_and_clamp():
    x = RNG.integers(-5, 6, size=(2, 2)).astype(np.int32)
    for scope in (JIT, {n: getattr(qm, n) for n in ("min", "max", "clamp")}):
        out = scope["max"](as_obj(x), 0).to_numpy()
        assert out.dtype == np.int32
        np.testing.assert_array_equal(out, np.maximum(x, 0))
        np.testing.assert_array_equal(scope["min"](as_obj(x), 1).to_numpy(), np.minimum(x, 1))
        np.testing.assert_array_equal(scope["clamp"](as_obj(x), -2, 3).to_numpy(), np.clip(x, -2, 3))
    f = RNG.uniform(-2, 2, size=3).astype(np.float32)
    out = JIT["clamp"](as_obj(f), 0.0, 1.0)
    assert out.dtype == qd.f32
    np.testing.assert_allclose(out.to_numpy(), np.clip(f, 0, 1))
    assert JIT["clamp"](1.5, 0.0, 1.0) == 1.0 and qm.clamp(-1, 0, 3) == 0


@numba.njit
def casts(v, x):
    return qm.cast(v, qd.i32), qm.cast(v, qd.f64), qm.cast(x, qd.f32), qm.cast(x, qd.i32)


def test_cast():
    v = RNG.uniform(-5, 5, size=3).astype(np.float32)
    x = RNG.uniform(-5, 5)
    python_scope = (qm.cast(as_obj(v), qd.i32), qm.cast(as_obj(v), qd.f64), qm.cast(x, qd.f32),
                    qm.cast(x, qd.i32))
    for a, b, c, d in (casts(as_obj(v), x), python_scope):
        assert a.dtype == qd.i32 and b.dtype == qd.f64
        np.testing.assert_array_equal(a.to_numpy(), v.astype(np.int32))
        np.testing.assert_array_equal(b.to_numpy(), v.astype(np.float64))
        assert c == np.float32(x) and d == int(x)


def test_aliases():
    assert str(qm.vec3) == "vector(3, float32)" and str(qm.ivec2) == "vector(2, int32)"
    assert str(qm.mat3) == "matrix(3, 3, float32)"
    f = numba.njit(lambda a: qm.mat2(a, 0, 0, a) @ qm.vec2(1, 2))
    np.testing.assert_allclose(f(2.0).to_numpy(), [2.0, 4.0])


def test_errors():
    with pytest.raises(TypingError, match=r"shape mismatch in qd.max"):
        JIT["max"](Vector([1.0, 2.0]), Vector([1.0, 2.0, 3.0]))
    with pytest.raises(QuadrantsTypeError, match=r"shape mismatch in qd.max"):
        qm.max(Vector([1.0, 2.0]), Vector([1.0, 2.0, 3.0]))
