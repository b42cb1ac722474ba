"""Kernel parameter annotations under ``from __future__ import annotations`` (all strings here):
they are evaluated in the kernel function's globals and closure, like typing.get_type_hints."""

from __future__ import annotations

import numpy as np
import pytest

import qd_numba as qd
from qd_numba import f32 as F32_ALIAS

VEC3 = qd.types.vector(3, qd.f32)


@pytest.fixture(autouse=True)
def _reset_config():
    qd.init()
    yield
    qd.init()


@qd.kernel
def saxpy(x: qd.types.ndarray(dtype=qd.f32, ndim=1), y: qd.types.ndarray(dtype=qd.f32, ndim=1), s: qd.f32):
    for i in range(x.shape[0]):
        y[i] = s * x[i] + y[i]


def test_string_annotations_are_evaluated(rng):
    assert all(isinstance(p.annotation, str) for p in
               __import__("inspect").signature(saxpy.fn).parameters.values())
    x = rng.standard_normal(300).astype(np.float32)
    y = rng.standard_normal(300).astype(np.float32)
    ref = 1.5 * x.astype(np.float64) + y
    operands = np.maximum(np.abs(1.5 * x.astype(np.float64)), np.abs(y))
    saxpy(x, y, 1.5)
    # within float32 rounding of the exact result, per element: two roundings on the CPU, one
    # (a fused multiply-add) on a GPU
    assert np.all(np.abs(y - ref) <= 2 * np.finfo(np.float32).eps * operands)
    # the evaluated annotations drive the argument checks
    with pytest.raises(qd.QuadrantsTypeError, match="dtype"):
        saxpy(x.astype(np.float64), y, 1.5)


def test_scalar_kinds_from_strings(rng):
    @qd.kernel
    def scale(a: qd.types.ndarray(dtype=qd.i32, ndim=1), k: qd.i32, f: float, alias: F32_ALIAS):
        for i in range(a.shape[0]):
            a[i] = a[i] * k + qd.i32(f) + qd.i32(alias)

    a = rng.integers(-50, 50, 64).astype(np.int32)
    ref = a * 3 + 2 + 4
    scale(a, 3, 2.0, 4.0)
    np.testing.assert_array_equal(a, ref)
    with pytest.raises(qd.QuadrantsTypeError, match="'k': 1099511627776 does not fit in int32"):
        scale(a, 2**40, 2.0, 4.0)
    scale(a, 2.5, 2.0, 4.0)     # k is an i32: 2.5 is cast to 2
    np.testing.assert_array_equal(a, ref * 2 + 6)


def test_template_and_vector_ndarray_from_strings(rng):
    field = qd.field(qd.f32, shape=(40,))

    @qd.kernel
    def fill(dst: qd.template(), src: qd.types.ndarray(dtype=VEC3, ndim=1)):
        for i in range(src.shape[0]):
            dst[i] = src[i][0] + src[i][1] * src[i][2]

    src = rng.standard_normal((40, 3)).astype(np.float32)
    fill(field, src)
    np.testing.assert_allclose(field.to_numpy(), src[:, 0] + src[:, 1] * src[:, 2], rtol=1e-5)


def test_annotation_from_closure(rng):
    def make(dtype):
        @qd.kernel
        def neg(a: qd.types.ndarray(dtype=dtype, ndim=1)):
            for i in range(a.shape[0]):
                a[i] = dtype(-a[i])  # the body uses ``dtype``: Python keeps it in a closure cell

        return neg

    neg64 = make(qd.f64)
    a = rng.standard_normal(33)
    ref = -a
    neg64(a)
    np.testing.assert_array_equal(a, ref)
    with pytest.raises(qd.QuadrantsTypeError, match="dtype"):
        neg64(a.astype(np.float32))


def test_return_annotation_from_string(rng):
    @qd.kernel
    def total(a: qd.types.ndarray(dtype=qd.f32, ndim=1)) -> qd.f64:
        return a[0] * a[1] + a[2]

    a = rng.standard_normal(8).astype(np.float32)
    out = total(a)
    np.testing.assert_allclose(out, np.float64(a[0]) * np.float64(a[1]) + np.float64(a[2]), rtol=1e-6)


def test_enclosing_name_unused_by_the_body_gets_a_hint():
    def make():
        arr_t = qd.types.ndarray(dtype=qd.f32, ndim=1)

        @qd.kernel
        def hidden_local(a: arr_t):
            for i in range(a.shape[0]):
                a[i] = 0.0

        return hidden_local

    with pytest.raises(qd.QuadrantsSyntaxError, match="hidden_local.*'a'.*arr_t.*enclosing function"):
        make()


def test_unresolvable_annotation_names_kernel_and_parameter():
    with pytest.raises(qd.QuadrantsSyntaxError) as info:
        @qd.kernel
        def broken(a: qd.types.ndarray(dtype=qd.f32, ndim=1), n: no_such_type):  # noqa: F821
            for i in range(n):
                a[i] = 0.0
    msg = str(info.value)
    assert "broken" in msg and "'n'" in msg and "no_such_type" in msg


def test_annotation_that_raises_names_kernel_and_parameter():
    with pytest.raises(qd.QuadrantsSyntaxError) as info:
        @qd.kernel
        def broken2(a: qd.types.ndarray(dtype=qd.f32, ndim=1)[0]):
            for i in range(a.shape[0]):
                a[i] = 0.0
    msg = str(info.value)
    assert "broken2" in msg and "'a'" in msg


def test_string_that_is_not_a_type_is_rejected():
    with pytest.raises(qd.QuadrantsSyntaxError, match="'x'.*needs a type annotation"):
        @qd.kernel
        def not_a_type(x: 3):
            pass


def test_float_annotation_follows_default_fp_set_after_decoration(arch, rng):
    @qd.kernel
    def put(a: qd.types.ndarray(dtype=qd.f64, ndim=1), s: float):
        for i in range(a.shape[0]):
            a[i] = s * 1.0

    value = 1.0 + float(rng.random()) * 1e-9    # not representable in float32
    try:
        qd.init(arch=getattr(qd, arch), default_fp=qd.f64)
        out = np.zeros(4)
        put(out, value)
        np.testing.assert_array_equal(out, np.full(4, value))
        qd.init(arch=getattr(qd, arch), default_fp=qd.f32)
        put(out, value)
        np.testing.assert_array_equal(out, np.full(4, np.float64(np.float32(value))))
    finally:
        qd.init(arch=getattr(qd, arch))
