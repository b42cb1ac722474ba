"""Loop forms, control flow inside tasks, serial code, qd.static, task splitting."""

import numpy as np

import qd_numba as qd

N = 13
f1 = qd.field(qd.i32, shape=(N,))
f2 = qd.field(qd.f64, shape=(5, 6))
g2 = qd.field(qd.f64, shape=(5, 6))


@qd.kernel
def ranges(out: qd.types.ndarray(dtype=qd.i32, ndim=2), a: qd.i32, b: qd.i32, step: qd.i32):
    for i in range(out.shape[1]):
        out[0, i] = i * 3
    for i in range(a, b):
        out[1, i] = i + 100
    for i in range(a, b, step):
        out[2, i] = i - 7


def test_range_forms(rng):
    a, b, step = int(rng.integers(0, 4)), int(rng.integers(10, 20)), int(rng.integers(2, 5))
    init = rng.integers(-1000, 1000, (3, 20)).astype(np.int32)
    out = init.copy()
    ranges(out, a, b, step)
    ref = init.copy()
    ref[0, :] = np.arange(20) * 3
    ref[1, a:b] = np.arange(a, b) + 100
    ref[2, a:b:step] = np.arange(a, b, step) - 7
    np.testing.assert_array_equal(out, ref)


@qd.kernel
def nd_loops(out: qd.types.ndarray(dtype=qd.f64, ndim=2), src: qd.types.ndarray(dtype=qd.f64, ndim=2),
             a: qd.i32, b: qd.i32):
    for i, j in qd.ndrange(out.shape[0], (a, b)):
        out[i, j] = src[i, j] * 2.0 + i * 10 + j
    for idx in qd.grouped(qd.ndrange(2, (1, 3))):
        out[idx[0], idx[1]] = src[idx[0], idx[1]] - 1000.0


@qd.kernel
def grouped_nd_index(out: qd.types.ndarray(dtype=qd.f64, ndim=2)):
    for idx in qd.grouped(out):
        out[idx] = out[idx] * 3.0 + idx[0] - idx[1]


def test_grouped_ndarray_vector_index(rng):
    a = rng.uniform(-1, 1, (4, 5))
    ref = a * 3 + np.arange(4)[:, None] - np.arange(5)[None, :]
    grouped_nd_index(a)
    np.testing.assert_allclose(a, ref, rtol=1e-12)


def test_ndrange_and_grouped(rng):
    src = rng.uniform(-1, 1, (6, 8))
    init = rng.uniform(-1, 1, (6, 8))
    out = init.copy()
    nd_loops(out, src, 2, 7)
    ref = init.copy()
    for i in range(6):
        for j in range(2, 7):
            ref[i, j] = src[i, j] * 2 + i * 10 + j
    ref[0:2, 1:3] = src[0:2, 1:3] - 1000
    np.testing.assert_allclose(out, ref, rtol=1e-12)


@qd.kernel
def struct_fors():
    for i in f1:
        f1[i] = f1[i] * 2 - i
    for i, j in f2:
        g2[i, j] = f2[i, j] + i * j
    for idx in qd.grouped(f2):
        f2[idx] = f2[idx] * f2[idx]


def test_struct_for(rng):
    d1 = rng.integers(-100, 100, N).astype(np.int32)
    d2 = rng.uniform(-2, 2, (5, 6))
    f1.from_numpy(d1)
    f2.from_numpy(d2)
    struct_fors()
    np.testing.assert_array_equal(f1.to_numpy(), d1 * 2 - np.arange(N))
    np.testing.assert_allclose(g2.to_numpy(), d2 + np.outer(np.arange(5), np.arange(6)), rtol=1e-12)
    np.testing.assert_allclose(f2.to_numpy(), d2 * d2, rtol=1e-12)


@qd.kernel
def control_flow(a: qd.types.ndarray(dtype=qd.i32, ndim=2), out: qd.types.ndarray(dtype=qd.i32, ndim=1),
                 thr: qd.i32):
    for i in range(a.shape[0]):
        s = 0
        for j in range(a.shape[1]):
            v = a[i, j]
            if v < 0:
                continue
            if v > thr:
                break
            if v % 3 == 0:
                s += v
            elif v % 3 == 1:
                s += 2 * v
            else:
                s -= 1
        k = 0
        while k * k < i:
            k += 1
        out[i] = s * 100 + k


def test_control_flow(rng):
    a = rng.integers(-20, 60, (17, 12)).astype(np.int32)
    out = rng.integers(-5, 5, 17).astype(np.int32)
    control_flow(a, out, 45)
    ref = np.zeros(17, np.int64)
    for i in range(17):
        s = 0
        for v in a[i]:
            if v < 0:
                continue
            if v > 45:
                break
            if v % 3 == 0:
                s += v
            elif v % 3 == 1:
                s += 2 * v
            else:
                s -= 1
        k = 0
        while k * k < i:
            k += 1
        ref[i] = s * 100 + k
    np.testing.assert_array_equal(out, ref)


@qd.kernel
def serial_between(a: qd.types.ndarray(dtype=qd.f64, ndim=1), out: qd.types.ndarray(dtype=qd.f64, ndim=1),
                   c: qd.f64):
    for i in range(a.shape[0]):
        a[i] = a[i] + c
    m = a[0]
    k = 1
    while k < a.shape[0]:
        if a[k] > m:
            m = a[k]
        k += 1
    scale = m * 2.0 + c
    for i in range(a.shape[0]):
        out[i] = a[i] * scale


def test_serial_code_between_loops(rng):
    assert [t.kind for t in serial_between.tasks(np.zeros(3), np.zeros(3), 1.0)] == \
        ["range_for", "serial", "range_for"]
    a = rng.uniform(-3, 3, 10)
    c = float(rng.uniform(-1, 1))
    out = rng.uniform(-1, 1, 10)
    ref_a = a + c
    ref = ref_a * (ref_a.max() * 2 + c)
    a_in = a.copy()
    serial_between(a_in, out, c)
    np.testing.assert_allclose(a_in, ref_a, rtol=1e-12)
    np.testing.assert_allclose(out, ref, rtol=1e-12)


@qd.kernel
def static_if_only(out: qd.types.ndarray(dtype=qd.f64, ndim=1), c: qd.f64):
    if qd.static(True):
        out[0] = c
    for i in range(out.shape[0]):
        if qd.static(False):
            out[i] = -1.0
        else:
            out[i] = out[i] + c


def test_static_if_in_loop(rng):
    d = rng.uniform(-1, 1, 6)
    c = float(rng.uniform(1, 2))
    ref = d + c
    ref[0] = 2 * c
    static_if_only(d, c)
    np.testing.assert_allclose(d, ref, rtol=1e-12)


@qd.kernel
def statics(x: qd.template(), flag: qd.template(), out: qd.types.ndarray(dtype=qd.f64, ndim=2)):
    for i in range(out.shape[0]):
        for k in qd.static(range(3)):
            out[i, k] = x[i] * (k + 1)
        if qd.static(flag):
            out[i, 3] = -x[i]
        else:
            out[i, 3] = x[i] + 0.5


def test_static_if_and_unroll(rng):
    x = qd.field(qd.f64, shape=(7,))
    d = rng.uniform(-4, 4, 7)
    x.from_numpy(d)
    for flag in (True, False):
        init = rng.uniform(-1, 1, (7, 5))
        out = init.copy()
        statics(x, flag, out)
        ref = init.copy()
        ref[:, :3] = d[:, None] * np.array([1, 2, 3])
        ref[:, 3] = -d if flag else d + 0.5
        np.testing.assert_allclose(out, ref, rtol=1e-12)


fa = qd.field(qd.f32, shape=(6,))
fb = qd.field(qd.f32, shape=(6,))
fc = qd.field(qd.f32, shape=(6,))


@qd.kernel
def static_tuple_loop(k: qd.f32):
    for f in qd.static((fa, fb, fc)):
        for i in f:
            f[i] = f[i] * k + 1.0


def test_static_loop_over_fields(rng):
    ds = [rng.uniform(-2, 2, 6).astype(np.float32) for _ in range(3)]
    for f, d in zip((fa, fb, fc), ds):
        f.from_numpy(d)
    static_tuple_loop(3.0)
    for f, d in zip((fa, fb, fc), ds):
        # atol: f * k + 1 may be one fused multiply-add (GPU), near-cancelling values lose bits
        np.testing.assert_allclose(f.to_numpy(), d.astype(np.float64) * 3 + 1, rtol=1e-6, atol=1e-6)
    assert [t.kind for t in static_tuple_loop.tasks(3.0)] == ["range_for"] * 3


@qd.kernel
def int_div(a: qd.types.ndarray(dtype=qd.i32, ndim=1), b: qd.types.ndarray(dtype=qd.i32, ndim=1),
            q: qd.types.ndarray(dtype=qd.f32, ndim=1), fl: qd.types.ndarray(dtype=qd.i32, ndim=1),
            md: qd.types.ndarray(dtype=qd.i32, ndim=1)):
    for i in range(a.shape[0]):
        q[i] = a[i] / b[i]
        fl[i] = a[i] // b[i]
        md[i] = a[i] % b[i]


def test_int_division(rng):
    a = rng.integers(-50, 50, 40).astype(np.int32)
    b = rng.integers(1, 9, 40).astype(np.int32) * rng.choice([-1, 1], 40).astype(np.int32)
    q = np.zeros(40, np.float32) + 9
    fl = np.zeros(40, np.int32) + 9
    md = np.zeros(40, np.int32) + 9
    int_div(a, b, q, fl, md)
    np.testing.assert_allclose(q, a / b, rtol=1e-6)
    np.testing.assert_array_equal(fl, np.floor_divide(a, b))
    np.testing.assert_array_equal(md, np.mod(a, b))


@qd.kernel
def serial_prefix_sum(a: qd.types.ndarray(dtype=qd.i64, ndim=1)):
    qd.loop_config(serialize=True)
    for i in range(1, a.shape[0]):
        a[i] += a[i - 1]


def test_loop_config_serialize_runs_in_order(rng):
    # each iteration reads the previous one's result: only an in-order run gives the prefix sum
    a = rng.integers(-1000, 1000, 5000).astype(np.int64)
    ref = np.cumsum(a)
    serial_prefix_sum(a)
    np.testing.assert_array_equal(a, ref)
    assert [t.serialize for t in serial_prefix_sum.tasks(a)] == [True]
