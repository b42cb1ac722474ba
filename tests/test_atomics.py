"""Atomic augmented assignment, qd.atomic_* return values, qd.random."""

import numpy as np

import qd_numba as qd

NB = 7
hist = qd.field(qd.i32, shape=(NB,))
hist_f = qd.field(qd.f64, shape=(NB,))
bits = qd.field(qd.i64, shape=(3,))
counter = qd.field(qd.i32, shape=())


@qd.kernel
def histogram(v: qd.types.ndarray(dtype=qd.i32, ndim=1), w: qd.types.ndarray(dtype=qd.f64, ndim=1),
              nd: qd.types.ndarray(dtype=qd.i64, ndim=1)):
    for i in range(v.shape[0]):
        b = v[i] % NB
        hist[b] += 1
        hist[(b + 1) % NB] -= 2
        hist_f[b] += w[i]
        nd[b] += v[i]
        bits[0] |= qd.i64(1) << (v[i] % 60)
        bits[1] &= ~(qd.i64(1) << (v[i] % 60))
        bits[2] ^= v[i]


def test_augassign_atomic(rng):
    n = 20000
    v = rng.integers(0, 1000, n).astype(np.int32)
    w = rng.uniform(-1, 1, n)
    h0 = rng.integers(-50, 50, NB).astype(np.int32)
    hist.from_numpy(h0)
    hist_f.fill(0.0)
    b0 = rng.integers(0, 2**62, 3).astype(np.int64)
    bits.from_numpy(b0)
    nd = rng.integers(-10, 10, NB).astype(np.int64)
    nd0 = nd.copy()
    histogram(v, w, nd)
    cnt = np.bincount(v % NB, minlength=NB)
    np.testing.assert_array_equal(hist.to_numpy(), h0 + cnt - 2 * np.roll(cnt, 1))
    ref_f = np.bincount(v % NB, weights=w, minlength=NB)
    np.testing.assert_allclose(hist_f.to_numpy(), ref_f, rtol=1e-9, atol=1e-9)
    np.testing.assert_array_equal(nd, nd0 + np.bincount(v % NB, weights=v, minlength=NB).astype(np.int64))
    mask = np.bitwise_or.reduce(np.int64(1) << (v % 60).astype(np.int64))
    ref = [b0[0] | mask, b0[1] & ~mask, b0[2] ^ np.bitwise_xor.reduce(v.astype(np.int64))]
    np.testing.assert_array_equal(bits.to_numpy(), np.array(ref, np.int64))


@qd.kernel
def compact(v: qd.types.ndarray(dtype=qd.f32, ndim=1), out: qd.types.ndarray(dtype=qd.f32, ndim=1),
            thr: qd.f32) -> qd.i32:
    counter[None] = 0
    for i in range(v.shape[0]):
        if v[i] > thr:
            k = qd.atomic_add(counter[None], 1)
            out[k] = v[i]
    return counter[None]


def test_compaction_atomic_add_returns_old(rng):
    v = rng.uniform(-1, 1, 5000).astype(np.float32)
    out = np.full(5000, 99.0, np.float32)
    k = compact(v, out, 0.3)
    sel = v[v > 0.3]
    assert k == len(sel)
    np.testing.assert_array_equal(np.sort(out[:k]), np.sort(sel))
    assert np.all(out[k:] == 99.0)


@qd.func
def append_value(out: qd.template(), value):
    k = qd.atomic_add(counter[None], 1)
    out[k] = value


@qd.kernel
def compact_pairs(v: qd.types.ndarray(dtype=qd.f32, ndim=2), out: qd.types.ndarray(dtype=qd.f32, ndim=1),
                  thr: qd.f32) -> qd.i32:
    counter[None] = 0
    for i in range(v.shape[0]):
        for c in qd.static(range(2)):
            if v[i, c] > thr:
                append_value(out, v[i, c])
    return counter[None]


def test_atomic_in_func_called_in_static_loop_stays_atomic(rng):
    """The func's temporaries are renamed in each unrolled copy; x[i] must stay its target."""
    v = rng.uniform(-1, 1, (3000, 2)).astype(np.float32)
    out = np.full(6000, 99.0, np.float32)
    k = compact_pairs(v, out, 0.3)
    sel = v[v > 0.3]
    assert k == len(sel)
    np.testing.assert_array_equal(np.sort(out[:k]), np.sort(sel))


acc = qd.field(qd.i32, shape=(7,))


@qd.kernel
def atomic_ops(v: qd.types.ndarray(dtype=qd.i32, ndim=1), old: qd.types.ndarray(dtype=qd.i32, ndim=2)):
    for i in range(v.shape[0]):
        old[i, 0] = qd.atomic_add(acc[0], v[i])
        old[i, 1] = qd.atomic_sub(acc[1], v[i])
        old[i, 2] = qd.atomic_min(acc[2], v[i])
        old[i, 3] = qd.atomic_max(acc[3], v[i])
        old[i, 4] = qd.atomic_and(acc[4], v[i])
        old[i, 5] = qd.atomic_or(acc[5], v[i])
        old[i, 6] = qd.atomic_xor(acc[6], v[i])


def test_atomic_functions(rng):
    n = 3000
    v = rng.integers(1, 1 << 20, n).astype(np.int32)
    a0 = rng.integers(1, 1 << 20, 7).astype(np.int32)
    acc.from_numpy(a0)
    old = np.zeros((n, 7), np.int32)
    atomic_ops(v, old)
    v64 = v.astype(np.int64)
    final = np.array([a0[0] + v64.sum(), a0[1] - v64.sum(), min(a0[2], v.min()), max(a0[3], v.max()),
                      a0[4] & np.bitwise_and.reduce(v), a0[5] | np.bitwise_or.reduce(v),
                      a0[6] ^ np.bitwise_xor.reduce(v)], np.int64)
    np.testing.assert_array_equal(acc.to_numpy(), final.astype(np.int32))
    # add: the old values, sorted, are the prefix sums of the values in launch order
    olds = np.sort(old[:, 0].astype(np.int64))
    assert olds[0] == a0[0]
    assert set((olds[1:] - olds[:-1]).tolist()) <= set(v.tolist())
    # each old value of add/sub is distinct (one per update); min/max olds are bounded
    assert len(np.unique(old[:, 0])) == n and len(np.unique(old[:, 1])) == n
    assert np.all(old[:, 2] <= a0[2]) and np.all(old[:, 3] >= a0[3])
    assert np.all(old[:, 2] >= final[2]) and np.all(old[:, 3] <= final[3])
    # sum over "new = old op v" reconstructs the same final value for add
    assert olds[-1] + v64[np.argsort(old[:, 0])[-1]] == final[0]


@qd.kernel
def local_atomic(v: qd.types.ndarray(dtype=qd.i32, ndim=1), out: qd.types.ndarray(dtype=qd.i32, ndim=2)):
    for i in range(v.shape[0]):
        s = v[i]
        o = qd.atomic_add(s, 5)
        out[i, 0] = o
        out[i, 1] = s


def test_atomic_on_local(rng):
    v = rng.integers(-100, 100, 10).astype(np.int32)
    out = np.zeros((10, 2), np.int32)
    local_atomic(v, out)
    np.testing.assert_array_equal(out[:, 0], v)
    np.testing.assert_array_equal(out[:, 1], v + 5)


@qd.kernel
def randoms(out: qd.types.ndarray(dtype=qd.f32, ndim=1)):
    for i in range(out.shape[0]):
        out[i] = qd.random()


def test_random_uniform(rng):
    out = np.full(100000, -1.0, np.float32)
    randoms(out)
    assert out.min() >= 0.0 and out.max() < 1.0
    assert abs(out.mean() - 0.5) < 0.01
    assert abs(out.var() - 1 / 12) < 0.01
    assert len(np.unique(out)) > 50000
