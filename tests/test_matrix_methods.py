"""Every row of the matrix-method table (qd_numba/ops/matrix_methods.py) in a kernel and in Python
scope, against numpy on random data: one kernel per (row, call, dtype), generated from the table,
with every element of an ndarray of vectors/matrices as input."""

from __future__ import annotations

import numpy as np
import pytest

import qd_numba as qd
from qd_numba.dtypes import to_numpy
from qd_numba.ops.matrix_methods import MATRIX_METHODS, method_type
from qd_numba.typing.matrix import MatrixType

EPS = 0.25
N = 64


def _float(x):
    return x.astype(np.float64)


# method -> calls: (shape of the matrix, arguments: a shape for a vector/matrix, or EPS, reference
# on the float64 entries, float64 arguments)
CALLS = {
    "dot": [((3,), [(3,)], lambda x, y: np.sum(x * y))],
    "norm": [((4,), [], np.linalg.norm), ((3,), [EPS], lambda x, e: np.sqrt(x @ x + e))],
    "norm_sqr": [((3,), [], lambda x: x @ x)],
    "normalized": [((3,), [], lambda x: x / np.linalg.norm(x)),
                   ((2,), [EPS], lambda x, e: x / np.sqrt(x @ x + e))],
    "cross": [((3,), [(3,)], np.cross), ((2,), [(2,)], lambda x, y: x[0] * y[1] - x[1] * y[0])],
    "outer_product": [((3,), [(2,)], np.outer)],
    "transpose": [((2, 3), [], np.transpose)],
    "sum": [((2, 3), [], np.sum), ((4,), [], np.sum)],
    "max": [((2, 3), [], np.max)],
    "min": [((3,), [], np.min)],
    "trace": [((3, 3), [], np.trace)],
    "determinant": [((n, n), [], np.linalg.det) for n in (2, 3, 4)],
    "inverse": [((n, n), [], np.linalg.inv) for n in (1, 2, 3, 4)],
}
FLOAT_RESULT = {"norm", "normalized", "inverse"}     # integer matrices give f32; every other row keeps the dtype


def test_every_row_has_calls():
    assert set(CALLS) == set(MATRIX_METHODS)


def _type(shape, dtype):
    return qd.types.vector(shape[0], dtype) if len(shape) == 1 else qd.types.matrix(*shape, dtype)


def _random(rng, shape, dtype, name):
    if dtype == qd.i32:
        x = rng.integers(-4, 5, (N, *shape))
    else:
        x = rng.uniform(-2.0, 2.0, (N, *shape))
        x[np.abs(x) < 0.1] = 0.5       # normalized() of a near-zero vector is ill-conditioned
    if name == "inverse":              # well-conditioned: diagonally dominant
        x = x + 10 * np.eye(shape[0], dtype=x.dtype)
    return x.astype(to_numpy(dtype))


def _kernel(name, types, arg_exprs, result_type):
    """``out[i] = a[i].<name>(<args>)`` for every i, with the ndarray parameters ``types``."""
    params = ", ".join(f"a{k}: qd.types.ndarray(dtype=T{k}, ndim=1)" for k in range(len(types)))
    src = (f"def run_{name}({params}, out: qd.types.ndarray(dtype=R, ndim=1)):\n"
           f"    for i in out:\n"
           f"        out[i] = a0[i].{name}({', '.join(arg_exprs)})\n")
    namespace = {"qd": qd, "R": result_type, **{f"T{k}": t for k, t in enumerate(types)}}
    exec(compile(src, f"<matrix method {name}>", "exec"), namespace)
    return qd.kernel(namespace[f"run_{name}"])


CASES = [(name, k, dtype) for name, calls in CALLS.items() for k in range(len(calls))
         for dtype in (qd.f32, qd.f64, qd.i32)]


@pytest.mark.parametrize(("name", "k", "dtype"), CASES, ids=[f"{n}-{k}-{d}" for n, k, d in CASES])
def test_row_in_a_kernel_and_in_python_scope(name, k, dtype, rng):
    shape, args, reference = CALLS[name][k]
    mat_types = [_type(shape, dtype)] + [_type(a, dtype) for a in args if isinstance(a, tuple)]
    inputs = [_random(rng, s, dtype, name) for s in [shape, *args] if isinstance(s, tuple)]
    arg_exprs = [f"a{k}[i]" if isinstance(a, tuple) else repr(a)
                 for k, a in enumerate(args, start=1)]
    rt = method_type(mat_types[0], name, mat_types[1:] + [qd.f64 for a in args if a == EPS])
    expected_dtype = qd.f32 if dtype == qd.i32 and name in FLOAT_RESULT else dtype
    assert (rt.dtype if isinstance(rt, MatrixType) else rt) == expected_dtype
    elem_shape = rt.shape if isinstance(rt, MatrixType) else ()

    arrays = []
    for t, x in zip(mat_types, inputs, strict=True):
        arrays.append(qd.ndarray(t, (N,)))
        arrays[-1].from_numpy(x)
    out = qd.ndarray(rt, (N,))
    _kernel(name, mat_types, arg_exprs, rt)(*arrays, out)

    scalars = [a for a in args if not isinstance(a, tuple)]
    ref = np.array([reference(*[_float(x[i]) for x in inputs], *scalars) for i in range(N)])
    got = out.to_numpy()
    assert got.shape == (N, *elem_shape) and got.dtype == to_numpy(expected_dtype)
    rtol = 1e-4 if expected_dtype == qd.f32 else 1e-12
    if expected_dtype == qd.i32:
        np.testing.assert_array_equal(got, np.round(ref).astype(np.int32))
    else:
        np.testing.assert_allclose(got, ref, rtol=rtol, atol=rtol)

    # Python scope: the same row on the qd.Vector/qd.Matrix of element 0, same result dtype
    wrap = qd.Vector if len(shape) == 1 else qd.Matrix
    operands = [qd.Vector(x[0], dt=dtype) if x.ndim == 2 else qd.Matrix(x[0], dt=dtype) for x in inputs[1:]]
    py = getattr(wrap(inputs[0][0], dt=dtype), name)(*operands, *scalars)
    py = py.to_numpy() if isinstance(py, qd.Matrix) else np.asarray(py)
    assert py.dtype == to_numpy(expected_dtype)
    np.testing.assert_allclose(py, got[0], rtol=rtol, atol=rtol)


def test_python_scope_keywords_and_arity(rng):
    x = rng.standard_normal(3).astype(np.float32)
    v = qd.Vector(x)
    np.testing.assert_allclose(v.norm(eps=EPS), np.sqrt(_float(x) @ _float(x) + EPS), rtol=1e-6)
    np.testing.assert_allclose(v.normalized(eps=EPS).to_numpy(), x / np.sqrt(_float(x) @ _float(x) + EPS), rtol=1e-6)
    with pytest.raises(qd.QuadrantsTypeError, match=r"dot\(\) takes 1\.\.1 positional arguments, got 0"):
        v.dot()
    with pytest.raises(qd.QuadrantsTypeError, match=r"transpose\(\) needs a matrix"):
        v.transpose()
