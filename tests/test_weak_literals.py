"""Float literals take the float type of the value they meet (passes/weak_literals.py): f32
arithmetic stays f32, as numpy 2 computes ``f32_array * 0.1`` and Quadrants types literals as
``default_fp``; an f64 operand keeps the exact literal; ``default_fp=f64`` keeps every literal f64."""

from __future__ import annotations

import numpy as np
import pytest
from numba.core import types

import qd_numba as qd
from qd_numba import config

F32_1D = qd.types.ndarray(dtype=qd.f32, ndim=1)


def _float_types(kernel, *args) -> set:
    """The float types of the values a kernel's tasks compute (not the loads of its data)."""
    found = set()
    for task in kernel.tasks(*args):
        for name, ty in (task.types or {}).items():
            if isinstance(ty, types.Float) and name.startswith(("$binop", "$weak_const", "$const")):
                found.add(ty)
    return found


def test_f32_arithmetic_and_comparisons_stay_f32_and_match_numpy(rng):
    n = 4096
    x, y = qd.field(qd.f32, shape=n), qd.field(qd.f32, shape=n)
    flags = qd.field(qd.i32, shape=n)

    @qd.kernel
    def blend(a: F32_1D, s: qd.f32):
        for i in x:
            y[i] = -x[i] * 2.0 + 1.0 + a[i] / 3.0 + s * 0.1 - (x[i] + 0.7) ** 2.0
            flags[i] = 0
            if x[i] > 0.1:           # an f32 comparison: x = f32(0.1) is not above it
                flags[i] = 1

    data = rng.uniform(-1, 1, n).astype(np.float32)
    data[:8] = np.float32(0.1)
    a = rng.uniform(-1, 1, n).astype(np.float32)
    x.from_numpy(data)
    blend(a, 1.5)
    f32 = np.float32
    # numpy 2 promotes Python scalars weakly: every step below is f32 arithmetic
    expected = -data * f32(2.0) + f32(1.0) + a / f32(3.0) + f32(1.5) * f32(0.1) - (data + f32(0.7)) ** f32(2.0)
    np.testing.assert_allclose(y.to_numpy(), expected, rtol=2e-6, atol=2e-6)
    np.testing.assert_array_equal(flags.to_numpy(), (data > f32(0.1)).astype(np.int32))
    assert flags.to_numpy()[:8].sum() == 0
    assert _float_types(blend, a, 1.5) == {types.float32}


def test_literals_in_math_functions_follow_their_f32_arguments(rng):
    x, y = qd.field(qd.f32, shape=2048), qd.field(qd.f32, shape=2048)

    @qd.kernel
    def shade():
        for i in x:
            v = qd.max(x[i], 0.0) + qd.clamp(x[i] * 2.0, -0.5, 0.5) + min(x[i], 0.25)
            y[i] = v + qd.sin(x[i]) * 0.5 + qd.pow(qd.abs(x[i]), 1.5) - qd.sqrt(qd.abs(x[i]) + 1.0)

    data = rng.uniform(-1, 1, 2048).astype(np.float32)
    x.from_numpy(data)
    shade()
    f32 = np.float32
    expected = (np.maximum(data, f32(0)) + np.clip(data * f32(2), f32(-0.5), f32(0.5)) + np.minimum(data, f32(0.25))
                + np.sin(data) * f32(0.5) + np.abs(data) ** f32(1.5) - np.sqrt(np.abs(data) + f32(1)))
    assert expected.dtype == np.float32
    np.testing.assert_allclose(y.to_numpy(), expected, rtol=1e-5, atol=1e-6)
    assert _float_types(shade) == {types.float32}


def test_literals_next_to_vector_components_follow_the_field(rng):
    v = qd.Vector.field(3, qd.f32, shape=512)
    out = qd.field(qd.f32, shape=512)

    @qd.kernel
    def mix():
        for i in out:
            p = v[i]
            out[i] = p.x * 0.5 + v[i][1] * 0.25 - p[2] * 0.1 + (p * 2.0).y

    data = rng.uniform(-1, 1, (512, 3)).astype(np.float32)
    v.from_numpy(data)
    mix()
    f32 = np.float32
    expected = data[:, 0] * f32(0.5) + data[:, 1] * f32(0.25) - data[:, 2] * f32(0.1) + data[:, 1] * f32(2)
    # a few f32 ulps of values up to ~3: on a GPU, NVVM contracts a * b + c into one rounding
    np.testing.assert_allclose(out.to_numpy(), expected, rtol=1e-6, atol=1e-6)
    assert _float_types(mix) == {types.float32}


def test_f64_data_keeps_the_exact_literal(rng):
    d = qd.field(qd.f64, shape=512)

    @qd.kernel
    def scale():
        for i in d:
            d[i] = d[i] * 0.1

    data = rng.random(512)
    d.from_numpy(data)
    scale()
    # one correctly rounded f64 product (with 0.1 rounded to f32 first, nearly every element differs)
    np.testing.assert_array_equal(d.to_numpy(), data * 0.1)
    assert np.count_nonzero(data * float(np.float32(0.1)) != data * 0.1) > 400
    assert _float_types(scale) == {types.float64}


def test_integers_and_unknown_operands_keep_python_floats(rng):
    out, sums = qd.field(qd.f64, shape=64), qd.field(qd.f64, shape=64)

    @qd.kernel
    def tenths(k: qd.i32):
        for i in out:
            t = 0.0
            for _ in range(k):       # t has two definitions: its type is not known before typing
                t = t + 0.1
            out[i] = i * 0.1         # an integer operand: the literal stays f64
            sums[i] = t

    tenths(3)
    t = 0.0
    for _ in range(3):
        t = t + 0.1
    np.testing.assert_array_equal(out.to_numpy(), np.arange(64) * 0.1)
    np.testing.assert_array_equal(sums.to_numpy(), np.full(64, t))


def test_default_fp_f64_keeps_every_literal_f64(rng):
    arch = config.current.arch
    qd.init(arch=arch, default_fp=qd.f64)
    try:
        x = qd.field(qd.f32, shape=256)
        y = qd.field(qd.f64, shape=256)

        @qd.kernel
        def widen():
            for i in x:
                y[i] = x[i] * 0.1

        data = rng.random(256).astype(np.float32)
        x.from_numpy(data)
        widen()
        np.testing.assert_array_equal(y.to_numpy(), data.astype(np.float64) * 0.1)
        assert types.float64 in _float_types(widen)
    finally:
        qd.init(arch=arch)


def test_f32_kernel_has_no_double_precision_instructions_on_cuda():
    """The CUDA code of an f32 kernel with literals (compiled to PTX without a GPU)."""
    pytest.importorskip("numba.cuda")
    from qd_numba.targets.cuda.plan import compile_check

    x = qd.field(qd.f32, shape=1024)

    @qd.kernel
    def affine(s: qd.f32):
        for i in x:
            x[i] = x[i] * 2.0 + 1.0 + s * 0.5

    ((_unit, _ir, task),) = compile_check(affine, {"s": types.float32}, {})
    assert "fma.rn.f32" in task.ptx and ".f64" not in task.ptx
