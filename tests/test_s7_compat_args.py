"""Scalar kernel arguments are cast to the parameter's annotation (issue 14): a float given to an
integer parameter is truncated toward zero (``qd.i32`` given 1.5 is 1; Quadrants 1.4's launcher
rejects it instead, see docs/quadrants_compat.md). The exact types the fast path takes keep
working, and a value that does not fit stays our error naming the kernel and argument."""

import numpy as np
import pytest

import qd_numba as qd


@qd.kernel
def combine(x: qd.i32, y: qd.u8, z: qd.i64, w: qd.f32) -> qd.f64:
    return x * 1e6 + y * 1e3 + z + w


def _ref(x, y, z, w):
    return np.trunc(x) * 1e6 + np.trunc(y) * 1e3 + np.trunc(z) + np.float32(w)


def test_float_for_int_parameter_is_truncated(rng):
    for _ in range(6):
        x, z = rng.uniform(-900, 900, 2)
        y, w = rng.uniform(0, 255), rng.uniform(-1, 1)
        assert combine(float(x), float(y), float(z), float(w)) == pytest.approx(_ref(x, y, z, w), abs=1e-3)
        assert combine(np.float32(x), np.float64(y), np.float16(3.75), w) == \
            pytest.approx(_ref(np.float32(x), y, 3.75, w), abs=1e-3)
    assert combine(1.5, 2.9, -1.5, 0.0) == 1e6 + 2e3 - 1


def test_exact_types_still_pass(rng):
    x, y, z = (int(v) for v in rng.integers(0, 200, 3))
    assert combine(True, np.uint8(y), np.int64(z), np.float32(0.5)) == pytest.approx(1e6 + y * 1e3 + z + 0.5)
    assert combine(np.int64(x), False, np.int32(z), 2) == pytest.approx(x * 1e6 + z + 2)
    assert combine(x, y, z, 0.25) == pytest.approx(x * 1e6 + y * 1e3 + z + 0.25)


def test_converted_value_must_fit():
    where = r"kernel 'combine', argument "
    with pytest.raises(qd.QuadrantsTypeError, match=where + r"'x': 2147483648 does not fit in int32"):
        combine(2.0**31 + 0.5, 0, 0, 0.0)
    with pytest.raises(qd.QuadrantsTypeError, match=where + r"'y': -1 does not fit in uint8"):
        combine(0, -1.5, 0, 0.0)
    with pytest.raises(qd.QuadrantsTypeError, match=where + r"'z': cannot convert nan to int64"):
        combine(0, 0, float("nan"), 0.0)
    with pytest.raises(qd.QuadrantsTypeError, match=where + r"'w': expected a float32 scalar, got str"):
        combine(0, 0, 0, "1.0")


@pytest.mark.cuda
def test_float_for_int_parameter_on_cuda(rng):
    qd.init(arch=qd.cuda)
    try:
        @qd.kernel
        def scaled(x: qd.i32, out: qd.types.ndarray(dtype=qd.i32, ndim=1)):
            for i in out:
                out[i] = x * (i + 1)

        out = np.zeros(5, np.int32)
        x = float(rng.uniform(-50, 50))
        scaled(x, out)
        np.testing.assert_array_equal(out, int(x) * np.arange(1, 6))
        scaled(np.int64(3), out)
        np.testing.assert_array_equal(out, 3 * np.arange(1, 6))
        with pytest.raises(qd.QuadrantsTypeError, match="argument 'x': 4294967296 does not fit in int32"):
            scaled(2.0**32, out)
    finally:
        qd.init()
