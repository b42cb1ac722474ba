"""The math-op table (ops/math_ops.py): every adjoint rule against central finite differences,
and every op's numpy implementation against the compiled kernel on random data."""

from __future__ import annotations

import numpy as np
import pytest

import qd_numba as qd
from qd_numba import math as qd_math
from qd_numba.ops.math_ops import MATH_OPS

# inputs inside each op's smooth domain, away from kinks (abs at 0, min/max ties, clamp edges)
_DOMAINS = {"asin": (-0.9, 0.9), "acos": (-0.9, 0.9), "log": (0.2, 3.0), "log2": (0.2, 3.0), "sqrt": (0.2, 3.0),
            "rsqrt": (0.2, 3.0), "pow": (0.3, 2.0), "tan": (-1.2, 1.2)}


def _inputs(name, arity, rng, n=64):
    lo, hi = _DOMAINS.get(name, (-2.0, 2.0))
    args = [rng.uniform(lo, hi, n) for _ in range(arity)]
    if name == "abs":
        args[0] = np.where(np.abs(args[0]) < 0.05, 0.5, args[0])
    if name in ("min", "max"):
        args[1] = np.where(np.abs(args[0] - args[1]) < 0.05, args[1] + 0.5, args[1])
    if name == "clamp":
        args[1], args[2] = rng.uniform(-1.5, -0.5, n), rng.uniform(0.5, 1.5, n)
        for k in (1, 2):
            args[0] = np.where(np.abs(args[0] - args[k]) < 0.05, args[0] + 0.1, args[0])
    if name in ("floor", "ceil", "round"):
        args[0] = np.floor(args[0] * 4) / 4 + 0.1   # away from the jumps
    return args


@pytest.mark.parametrize("name", sorted(MATH_OPS))
def test_adjoint_rule_matches_finite_differences(name, rng):
    op = MATH_OPS[name]
    args = _inputs(name, op.arity, rng)
    out = op.numpy(*args)
    g = rng.uniform(0.5, 1.5, args[0].shape)
    # the rules run on scalars, as in compiled code (qd's Python-scope math takes scalars)
    per_element = [op.adjoint([float(a[i]) for a in args], float(out[i]), float(g[i]), qd_math)
                   for i in range(len(g))]
    assert all(len(gr) == op.arity for gr in per_element)
    grads = [np.array([float(gr[k]) for gr in per_element]) for k in range(op.arity)]
    h = 1e-6
    for k in range(op.arity):
        plus = [a + h if j == k else a for j, a in enumerate(args)]
        minus = [a - h if j == k else a for j, a in enumerate(args)]
        numeric = g * (op.numpy(*plus) - op.numpy(*minus)) / (2 * h)
        np.testing.assert_allclose(grads[k], numeric, rtol=1e-5, atol=1e-6,
                                   err_msg=f"d {name} / d arg{k}")


@pytest.mark.parametrize("dtype", [np.float32, np.float64], ids=["f32", "f64"])
@pytest.mark.parametrize("name", sorted(n for n, op in MATH_OPS.items() if op.arity == 1))
def test_unary_op_in_a_kernel_matches_numpy(name, dtype, rng):
    fn = getattr(qd_math, name)

    @qd.kernel
    def apply(a: qd.types.ndarray(ndim=1), out: qd.types.ndarray(ndim=1)):
        for i in range(a.shape[0]):
            out[i] = fn(a[i])

    (a,) = _inputs(name, 1, rng)
    a = a.astype(dtype)
    out = np.empty_like(a)
    apply(a, out)
    np.testing.assert_allclose(out, MATH_OPS[name].numpy(a), rtol=2e-6 if dtype == np.float32 else 1e-12)
