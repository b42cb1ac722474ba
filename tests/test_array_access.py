"""ndarray element access in kernels (passes/array_access.py): direct addressing without
negative-index wraparound where the index selects one element, Numba's indexing otherwise.
Every case runs with debug off (direct access) and on (Numba's bounds-checked indexing)."""

import numpy as np
import pytest

import qd_numba as qd


@pytest.fixture(params=[False, True], ids=["direct", "debug"])
def debug(request):
    qd.init(debug=request.param)
    yield request.param
    qd.init()


def test_offset_ranges_and_2d(debug, rng):
    @qd.kernel
    def shifted(a: qd.types.ndarray(dtype=qd.f32, ndim=1), b: qd.types.ndarray(dtype=qd.f64, ndim=2),
                out: qd.types.ndarray(dtype=qd.f32, ndim=1), c: qd.types.ndarray(dtype=qd.f64, ndim=2)):
        for i in range(-3, a.shape[0] - 3):
            out[i + 3] = a[i + 3] * 2.0 + a[0]
        for i, j in qd.ndrange(b.shape[0], (1, b.shape[1])):
            c[i, j] = b[i, j - 1] - b[i, j]

    a = rng.standard_normal(40).astype(np.float32)
    b = rng.standard_normal((5, 7))
    out = np.zeros_like(a)
    c = rng.standard_normal((5, 7))
    ref_out = a * np.float32(2.0) + a[0]
    ref_c = c.copy()
    ref_c[:, 1:] = b[:, :-1] - b[:, 1:]
    shifted(a, b, out, c)
    np.testing.assert_allclose(out, ref_out, rtol=1e-6)
    np.testing.assert_array_equal(c, ref_c)


def test_strided_and_int_arrays(debug, rng):
    @qd.kernel
    def mix(src: qd.types.ndarray(dtype=qd.f32, ndim=1), dst: qd.types.ndarray(dtype=qd.i32, ndim=1)):
        for i in range(src.shape[0]):
            dst[i] = src[i] * 10.0  # float value into an int array: truncating cast

    base = (rng.standard_normal(80) * 5).astype(np.float32)
    src = base[::2]  # non-contiguous view
    dst = np.zeros(40, np.int32)
    mix(src, dst)
    np.testing.assert_array_equal(dst, (src * np.float32(10.0)).astype(np.int32))


def test_views_and_static_indices(debug, rng):
    @qd.kernel
    def rows(m: qd.types.ndarray(dtype=qd.f32, ndim=2), out: qd.types.ndarray(dtype=qd.f32, ndim=1)):
        for i in range(m.shape[0]):
            row = m[i]              # a view: Numba's indexing
            s = 0.0
            for j in range(row.shape[0]):
                s += row[j]
            out[i] = s + m[0, 0] + m[i, 1:3].sum()

    m = rng.standard_normal((9, 6)).astype(np.float32)
    out = np.zeros(9, np.float32)
    rows(m, out)
    ref = m.sum(axis=1, dtype=np.float64) + m[0, 0] + m[:, 1:3].sum(axis=1, dtype=np.float64)
    np.testing.assert_allclose(out, ref, rtol=1e-5, atol=1e-5)


def test_atomics_and_vectors_unaffected(debug, rng):
    @qd.kernel
    def hist(idx: qd.types.ndarray(dtype=qd.i32, ndim=1), counts: qd.types.ndarray(dtype=qd.i32, ndim=1),
             vecs: qd.types.ndarray(dtype=qd.types.vector(2, qd.f32), ndim=1)):
        for i in range(idx.shape[0]):
            counts[idx[i]] += 1
        for i in range(vecs.shape[0]):
            vecs[i] = vecs[i] * 2.0

    idx = rng.integers(0, 10, 500).astype(np.int32)
    counts = np.zeros(10, np.int32)
    vecs = rng.standard_normal((20, 2)).astype(np.float32)
    ref_v = vecs * 2
    hist(idx, counts, vecs)
    np.testing.assert_array_equal(counts, np.bincount(idx, minlength=10))
    np.testing.assert_allclose(vecs, ref_v, rtol=1e-6)


def test_out_of_bounds_raises_only_in_debug(rng):
    @qd.kernel
    def oob(a: qd.types.ndarray(dtype=qd.f32, ndim=1), k: qd.i32):
        for i in range(1):
            a[k + i] = 1.0

    qd.init(debug=True)
    try:
        a = rng.standard_normal(4).astype(np.float32)
        with pytest.raises(qd.QuadrantsRuntimeError, match="oob"):
            oob(a, 4)
    finally:
        qd.init()
