"""qd.Vector / qd.Matrix: compiled operators, methods, constructors, indexing and the Python scope,
each against a numpy reference on random data. One njit function per operation is shared by all
parametrizations (Numba compiles it once per argument-type signature)."""

from __future__ import annotations

import operator

import numba
import numpy as np
import pytest
from numba.core.errors import TypingError

from qd_numba import dtypes as qd
from qd_numba.errors import QuadrantsTypeError
from qd_numba.lowering.matrix import (
    make_matrix,
    make_vector,
    matrix_from_tuple,
    matrix_to_tuple,
    matrix_with_item,
)
from qd_numba.matrix import Matrix, Vector, matrix, vector
from qd_numba.typing.matrix import MatrixType

RNG = np.random.default_rng(1234)
DTYPES = [qd.f32, qd.f64, qd.i32]


def tol(dtype):
    return {"float32": dict(rtol=2e-6, atol=1e-6), "float64": dict(rtol=1e-13, atol=1e-13)}.get(
        str(dtype), dict(rtol=0, atol=0))


def rand(shape, dtype, lo=-3.0, hi=3.0, nonzero=False):
    npdt = qd.to_numpy(dtype)
    if npdt.kind == "i":
        x = RNG.integers(int(lo), int(hi) + 1, size=shape)
        if nonzero:
            x[x == 0] = 1
        return x.astype(npdt)
    x = RNG.uniform(lo, hi, size=shape)
    if nonzero:
        x[np.abs(x) < 0.1] = 0.5
    return x.astype(npdt)


def wrap(arr):
    return Vector(arr, dt=qd.to_numba(arr.dtype)) if arr.ndim == 1 else Matrix(arr, dt=qd.to_numba(arr.dtype))


def check(result, expected, dtype):
    assert isinstance(result, Matrix)
    assert result.to_numpy().dtype == np.dtype(qd.to_numpy(dtype)), (result, dtype)
    np.testing.assert_allclose(result.to_numpy(), expected, **tol(dtype))


# --------------------------------------------------------------------------------------------
# binary operators
# --------------------------------------------------------------------------------------------

BINOPS = {
    "+": operator.add, "-": operator.sub, "*": operator.mul, "/": operator.truediv,
    "//": operator.floordiv, "%": operator.mod, "**": operator.pow,
    "<": operator.lt, "<=": operator.le, ">": operator.gt, ">=": operator.ge, "==": operator.eq,
    "!=": operator.ne,
}
JIT_BINOP = {sym: numba.njit(eval(f"lambda a, b: a {sym} b")) for sym in BINOPS}
COMPARE = {"<", "<=", ">", ">=", "==", "!="}


def operands(sym, dtype, shape):
    if sym == "**":
        if qd.to_numpy(dtype).kind == "i":
            return rand(shape, dtype, 0, 4), rand(shape, dtype, 0, 3)
        return rand(shape, dtype, 0.5, 2.0), rand(shape, dtype, -2.0, 2.0)
    nonzero = sym in ("/", "//", "%")
    a, b = rand(shape, dtype, nonzero=nonzero), rand(shape, dtype, nonzero=nonzero)
    if sym in ("==", "!=", "<=", ">="):
        b[::2] = a[::2]  # make some elements equal
    return a, b


def expected_dtype(sym, dtype):
    if sym in COMPARE:
        return qd.i32
    if sym == "/" and qd.to_numpy(dtype).kind == "i":
        return qd.f32
    return dtype


def reference(sym, a, b, dtype):
    rt = qd.to_numpy(expected_dtype(sym, dtype))
    calc = rt if sym == "/" else np.result_type(a, b)
    with np.errstate(all="ignore"):
        return BINOPS[sym](np.asarray(a).astype(calc), np.asarray(b).astype(calc)).astype(rt)


# every dtype on vectors; matrices (same code path, other shape) in f32 only: compile time
@pytest.mark.parametrize(("dtype", "shape"),
                         [(qd.f32, (3,)), (qd.f64, (3,)), (qd.i32, (3,)), (qd.f32, (2, 3))],
                         ids=["vec3-f32", "vec3-f64", "vec3-i32", "mat2x3-f32"])
@pytest.mark.parametrize("sym", list(BINOPS))
def test_binop_matrix_matrix(sym, dtype, shape):
    for _ in range(3):
        a, b = operands(sym, dtype, shape)
        check(JIT_BINOP[sym](wrap(a), wrap(b)), reference(sym, a, b, dtype), expected_dtype(sym, dtype))


@pytest.mark.parametrize("dtype", [qd.f32, qd.i32], ids=str)
@pytest.mark.parametrize("sym", list(BINOPS))
def test_binop_broadcast_scalar(sym, dtype):
    a, b = operands(sym, dtype, (4,))
    s = b[0]  # a numpy scalar of the same dtype
    rt = expected_dtype(sym, dtype)
    check(JIT_BINOP[sym](wrap(a), s), reference(sym, a, np.full_like(a, s), dtype), rt)
    check(JIT_BINOP[sym](s, wrap(a)), reference(sym, np.full_like(a, s), a, dtype), rt)


def test_broadcast_dtype_rules():
    vf = wrap(rand((3,), qd.f32))
    vi = wrap(rand((3,), qd.i32))
    # python constants: f64/i64 in Numba, but the matrix dtype wins
    assert JIT_BINOP["*"](vf, 0.5).dtype == qd.f32
    assert JIT_BINOP["+"](vi, 2).dtype == qd.i32
    assert JIT_BINOP["*"](vi, 0.5).dtype == qd.f64  # int matrix, float scalar: the scalar's float
    np.testing.assert_allclose(JIT_BINOP["*"](vi, 0.5).to_numpy(), vi.to_numpy() * 0.5)
    # matrix + matrix promotes
    vd = wrap(rand((3,), qd.f64))
    assert JIT_BINOP["+"](vf, vd).dtype == qd.f64
    assert JIT_BINOP["+"](vi, vf).dtype == qd.f32


def test_unary_and_len():
    neg = numba.njit(lambda v: (-v, abs(v), +v, len(v)))
    for dtype in DTYPES:
        a = rand((2, 3), dtype)
        n, ab, p, ln = neg(wrap(a))
        check(n, -a, dtype)
        check(ab, np.abs(a), dtype)
        check(p, a, dtype)
        assert ln == 2


def test_inplace_ops():
    @numba.njit
    def f(v, w):
        v += w
        v *= 2.0
        v -= 1
        return v

    a, b = rand((3,), qd.f32), rand((3,), qd.f32)
    check(f(wrap(a), wrap(b)), (a + b) * np.float32(2) - np.float32(1), qd.f32)


# --------------------------------------------------------------------------------------------
# matmul and methods
# --------------------------------------------------------------------------------------------

MATMUL = numba.njit(lambda a, b: a @ b)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_matmul(dtype):
    a, b, v, w = rand((2, 3), dtype), rand((3, 4), dtype), rand((3,), dtype), rand((2,), dtype)
    check(MATMUL(wrap(a), wrap(b)), a @ b, dtype)
    check(MATMUL(wrap(a), wrap(v)), a @ v, dtype)
    check(MATMUL(wrap(w), wrap(a)), w @ a, dtype)
    np.testing.assert_allclose(MATMUL(wrap(v), wrap(v)), v @ v, **tol(dtype))


@numba.njit
def vector_methods(v, w, eps):
    return (v.dot(w), v.norm(), v.norm_sqr(), v.normalized(), v.cross(w), v.outer_product(w), v.sum(),
            v.max(), v.min(), v.x, v.y, v.z, v.n, v.m, v.norm(eps), v.normalized(eps))


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_vector_methods(dtype):
    a, b = rand((3,), dtype), rand((3,), dtype)
    if qd.to_numpy(dtype).kind == "i":
        a[0] = 2  # nonzero norm
    ft = np.float32 if qd.to_numpy(dtype).kind == "i" else qd.to_numpy(dtype)
    res = vector_methods(wrap(a), wrap(b), 0.25)
    dot, norm, norm_sqr, normalized, cross, outer, s, mx, mn, x, y, z, n, m, norm_eps, normalized_eps = res
    t = tol(ft)
    np.testing.assert_allclose(dot, a @ b, **tol(dtype))
    np.testing.assert_allclose(norm, np.linalg.norm(a.astype(ft)), rtol=1e-6)
    np.testing.assert_allclose(norm_sqr, a @ a, **tol(dtype))
    check(normalized, a / np.linalg.norm(a.astype(ft)), qd.to_numba(np.dtype(ft)))
    check(cross, np.cross(a, b), dtype)
    check(outer, np.outer(a, b), dtype)
    np.testing.assert_allclose(s, a.sum(), **tol(dtype))
    assert (mx, mn, x, y, z, n, m) == (a.max(), a.min(), a[0], a[1], a[2], 3, 1)
    np.testing.assert_allclose(norm_eps, np.sqrt(a.astype(ft) @ a.astype(ft) + 0.25), rtol=1e-6)
    np.testing.assert_allclose(normalized_eps.to_numpy(), a / np.sqrt(a.astype(ft) @ a.astype(ft) + 0.25),
                               rtol=max(t["rtol"], 1e-6), atol=1e-7)


def test_cross_2d():
    f = numba.njit(lambda v, w: v.cross(w))
    a, b = rand((2,), qd.f64), rand((2,), qd.f64)
    np.testing.assert_allclose(f(wrap(a), wrap(b)), a[0] * b[1] - a[1] * b[0])


@numba.njit
def matrix_methods(a):
    return a.transpose(), a.trace(), a.determinant(), a.sum(), a.max(), a.min(), a.n, a.m


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("n", [2, 3, 4])
def test_matrix_methods(dtype, n):
    a = rand((n, n), dtype)
    tr, trace, det, s, mx, mn, nn, mm = matrix_methods(wrap(a))
    check(tr, a.T, dtype)
    assert trace == np.trace(a) or np.isclose(trace, np.trace(a), rtol=1e-6)
    np.testing.assert_allclose(det, np.linalg.det(a.astype(np.float64)), rtol=1e-4, atol=1e-4)
    # summed in the element type in some order: within the bound n^2 * eps * sum|a| of any order
    eps = np.finfo(a.dtype).eps if a.dtype.kind == "f" else 0
    np.testing.assert_allclose(s, a.astype(np.float64).sum(), rtol=0, atol=a.size * eps * np.abs(a).sum())
    assert (mx, mn, nn, mm) == (a.max(), a.min(), n, n)


# --------------------------------------------------------------------------------------------
# indexing and the public intrinsics
# --------------------------------------------------------------------------------------------


@numba.njit
def read_all(v, m):
    out_v = np.empty(v.n)
    for i in range(v.n):
        out_v[i] = v[i]
    out_m = np.empty((m.n, m.m))
    rows = np.empty((m.n, m.m))
    for i in range(m.n):
        row = m[i]
        for j in range(m.m):
            out_m[i, j] = m[i, j]
            rows[i, j] = row[j]
    return out_v, out_m, rows, v[-1], m[-1, 0], v[1], m[1, 2]


def test_runtime_indexing():
    v, m = rand((4,), qd.f64), rand((2, 3), qd.f64)
    out_v, out_m, rows, last, neg, c1, c2 = read_all(wrap(v), wrap(m))
    np.testing.assert_array_equal(out_v, v)
    np.testing.assert_array_equal(out_m, m)
    np.testing.assert_array_equal(rows, m)
    assert (last, neg, c1, c2) == (v[-1], m[-1, 0], v[1], m[1, 2])


@numba.njit
def with_items(v, m, i, j, x):
    v2 = matrix_with_item(v, i, x)
    m2 = matrix_with_item(m, (i, j), x)
    m3 = matrix_with_item(m, i, v)  # a whole row (m is n x len(v))
    m4 = matrix_with_item(m, 1, x)  # constant index, fill the row
    return v2, m2, m3, m4, v


def test_matrix_with_item():
    for _ in range(5):
        v, m = rand((3,), qd.f32), rand((2, 3), qd.f32)
        i, j, x = int(RNG.integers(0, 2)), int(RNG.integers(0, 3)), float(RNG.normal())
        v2, m2, m3, m4, v_same = with_items(wrap(v), wrap(m), i, j, x)
        ev, em2, em3, em4 = v.copy(), m.copy(), m.copy(), m.copy()
        ev[i], em2[i, j], em3[i], em4[1] = x, x, v, x
        check(v2, ev, qd.f32)
        check(m2, em2, qd.f32)
        check(m3, em3, qd.f32)
        check(m4, em4, qd.f32)
        check(v_same, v, qd.f32)  # value semantics: the input is unchanged


vec3 = vector(3, qd.f32)
mat2 = matrix(2, 2, qd.f64)


@numba.njit
def tuples(a, b, c):
    v = make_vector((a, b, c))
    m = make_matrix(((a, b), (c, 1)))
    t = matrix_to_tuple(m)
    w = matrix_from_tuple((c, b, a), vec3)
    return v, m, t, w


def test_tuple_intrinsics():
    a, b, c = RNG.normal(size=3)
    v, m, t, w = tuples(np.float32(a), np.float32(b), np.float32(c))
    check(v, np.array([a, b, c], np.float32), qd.f32)
    check(m, np.array([[a, b], [c, 1]], np.float32), qd.f32)
    assert t == tuple(np.array([a, b, c, 1], np.float32).tolist())
    check(w, np.array([c, b, a], np.float32), qd.f32)


# --------------------------------------------------------------------------------------------
# constructors in compiled code
# --------------------------------------------------------------------------------------------


@numba.njit
def constructors(a, b, i):
    return (Vector([a, b, 1.5]), Vector([1, 2, 3]), Vector([a, b], dt=qd.f64), Matrix([[a, b], [1, 2]]),
            vec3(a, b, 1), vec3(2), Vector.zero(qd.i32, 2), Matrix.identity(qd.f32, 3),
            Matrix.zero(qd.f64, 2, 3),
            Vector.unit(3, i), mat2(Vector([a, b]), Vector([b, a])), Matrix([1.5, 2.5]))


def test_constructors():
    a, b = np.float32(RNG.normal()), np.float32(RNG.normal())
    (v, vi, vd, m, t3, fill, z, ident, mz, unit, rows, mv) = constructors(a, b, 1)
    check(v, np.array([a, b, 1.5]), qd.f32)  # float constants count as f32
    check(vi, np.array([1, 2, 3]), qd.i32)
    check(vd, np.array([a, b], np.float64), qd.f64)
    check(m, np.array([[a, b], [1, 2]]), qd.f32)
    check(t3, np.array([a, b, 1]), qd.f32)
    check(fill, np.array([2, 2, 2]), qd.f32)
    check(z, np.zeros(2), qd.i32)
    check(ident, np.eye(3), qd.f32)
    check(mz, np.zeros((2, 3)), qd.f64)
    check(unit, np.array([0, 1, 0]), qd.f32)
    check(rows, np.array([[a, b], [b, a]]), qd.f64)
    check(mv, np.array([1.5, 2.5]), qd.f32)
    assert isinstance(v, Vector) and isinstance(m, Matrix) and not isinstance(m, Vector)


def test_constructor_f64_elements_widen():
    f = numba.njit(lambda x: Vector([x, 1.5]))
    check(f(0.25), np.array([0.25, 1.5]), qd.f64)  # a f64 value is involved
    check(f(np.float32(0.25)), np.array([0.25, 1.5]), qd.f32)


def test_branch_unifies_dtypes():
    @numba.njit
    def f(flag, a):
        v = Vector([a, a], dt=qd.f32)
        if flag:
            v = Vector([a, 2 * a], dt=qd.f64)
        return v

    check(f(True, 0.1), np.array([0.1, 0.2]), qd.f64)
    check(f(False, 0.1), np.array([np.float32(0.1)] * 2), qd.f64)


# --------------------------------------------------------------------------------------------
# Python scope, constants, boxing
# --------------------------------------------------------------------------------------------


def test_python_scope():
    v = Vector([1, 2, 3])
    assert v.dtype == qd.i32 and v.n == 3 and len(v) == 3
    f = Vector([1.0, 2.0])
    assert f.dtype == qd.f32
    m = Matrix([[1.0, 2.0], [3.0, 4.0]])
    assert m.n == 2 and m.m == 2 and isinstance(m[0], Vector)
    a, b = rand((3,), qd.f32), rand((3,), qd.f32)
    va, vb = wrap(a), wrap(b)
    check(va + vb, a + b, qd.f32)
    check(va * 2, a * 2, qd.f32)
    check(2.0 - va, 2 - a, qd.f32)
    check(va < vb, (a < b).astype(np.int32), qd.i32)
    check(Vector([1, 2]) / 2, np.array([0.5, 1.0]), qd.f32)
    assert np.isclose(va.dot(vb), a @ b)
    check(va.cross(vb), np.cross(a, b), qd.f32)
    check(m @ Vector([1.0, 1.0]), np.array([3.0, 7.0]), qd.f32)
    assert m.determinant() == pytest.approx(-2.0)
    check(m.transpose(), np.array([[1.0, 3.0], [2.0, 4.0]]), qd.f32)
    v[1] = 7
    assert v[1] == 7 and v.y == 7
    np.testing.assert_array_equal(v.to_numpy(), [1, 7, 3])
    check(vec3(1, 2, 3), np.array([1, 2, 3]), qd.f32)
    check(vec3(5), np.array([5, 5, 5]), qd.f32)
    check(Vector.zero(qd.f64, 2), np.zeros(2), qd.f64)
    check(Matrix.identity(qd.i32, 2), np.eye(2), qd.i32)
    assert vec3 is vector(3, qd.f32) and hash(vec3) == hash(vector(3, qd.f32))
    assert isinstance(vec3, MatrixType) and vec3.n == 3 and vec3.ndim == 1
    assert str(matrix(2, 3, qd.f64)) == "matrix(2, 3, float64)"
    assert numba.typeof(va) == vec3


def test_python_and_compiled_agree():
    a, b = wrap(rand((2, 2), qd.i32)), wrap(rand((2, 2), qd.f32, nonzero=True))
    for sym in ("+", "/", "//", "<"):
        py, jit = BINOPS[sym](a, b), JIT_BINOP[sym](a, b)
        assert py.dtype == jit.dtype
        np.testing.assert_allclose(py.to_numpy(), jit.to_numpy(), rtol=1e-6)


GLOBAL_V = Vector([1.5, 2.5, 3.5])
GLOBAL_M = Matrix([[1, 2], [3, 4]])


def test_constant_capture():
    f = numba.njit(lambda x: (GLOBAL_V * x, GLOBAL_M @ GLOBAL_M, GLOBAL_V[2]))
    v, mm, last = f(2.0)
    check(v, np.array([3.0, 5.0, 7.0]), qd.f32)
    check(mm, np.array([[7, 10], [15, 22]]), qd.i32)
    assert last == 3.5


# --------------------------------------------------------------------------------------------
# errors
# --------------------------------------------------------------------------------------------


def test_shape_mismatch_errors():
    with pytest.raises(TypingError, match=r"shape mismatch in '\+'.*\(3,\).*\(2,\)"):
        JIT_BINOP["+"](wrap(rand((3,), qd.f32)), wrap(rand((2,), qd.f32)))
    with pytest.raises(QuadrantsTypeError, match=r"shape mismatch.*\(3,\).*\(2,\)"):
        Vector([1.0, 2.0, 3.0]) + Vector([1.0, 2.0])
    with pytest.raises(TypingError, match=r"inner sizes"):
        MATMUL(wrap(rand((2, 3), qd.f32)), wrap(rand((2, 3), qd.f32)))
    with pytest.raises(TypingError, match="immutable"):
        numba.njit(lambda v: v.__setitem__(0, 1.0))(Vector([1.0, 2.0]))
    with pytest.raises(TypingError, match="takes 3 values"):
        numba.njit(lambda a: vec3(a, a))(1.0)
