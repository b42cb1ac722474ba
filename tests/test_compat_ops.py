"""Quadrants' operations (issue 14, "Operations"): the atomics beyond add/sub/min/max, C-style
division, bit operations, ``qd.select``/``bit_cast``/``frexp``, ``qd.math.*``, matrix
decompositions, ``qd.types`` predicates, ``qd.zero`` and tuple assignment. Each against numpy on
random data."""

import numpy as np
import pytest

import qd_numba as qd
from qd_numba.errors import QuadrantsTypeError

# -- atomics ----------------------------------------------------------------------------------------

N_THREADS = 4096
SLOTS = 5
prod_f = qd.field(qd.f64, shape=SLOTS)
prod_i = qd.field(qd.i64, shape=SLOTS)
owner = qd.field(qd.i32, shape=SLOTS)
olds = qd.field(qd.i32, shape=N_THREADS)
swapped = qd.Vector.field(2, qd.i32, shape=SLOTS)


@qd.kernel
def hammer(factors: qd.types.ndarray(dtype=qd.f64, ndim=1), ifactors: qd.types.ndarray(dtype=qd.i64, ndim=1),
           counts: qd.types.ndarray(dtype=qd.i32, ndim=1)):
    for i in range(N_THREADS):
        s = i % SLOTS
        qd.atomic_mul(prod_f[s], factors[i])
        qd.atomic_mul(ifactors[s], ifactors[SLOTS + i])
        olds[i] = qd.atomic_cas(owner[s], -1, i)
        qd.atomic_exchange(swapped[s][1], i)
        qd.atomic_add(counts[s], 1)


def test_atomics_many_threads_few_addresses(rng):
    factors = rng.uniform(0.999, 1.001, N_THREADS)
    ifactors = np.concatenate([rng.integers(1, 4, SLOTS), rng.choice([1, 1, 1, -1, 2], N_THREADS)]).astype(np.int64)
    start = ifactors[:SLOTS].copy()
    f0 = rng.uniform(0.5, 2.0, SLOTS)
    prod_f.from_numpy(f0)
    owner.fill(-1)
    swapped.fill(-7)
    counts = np.zeros(SLOTS, np.int32)
    hammer(factors, ifactors, counts)
    slot = np.arange(N_THREADS) % SLOTS
    ref_f = f0 * np.array([np.prod(factors[slot == s]) for s in range(SLOTS)])
    np.testing.assert_allclose(prod_f.to_numpy(), ref_f, rtol=1e-12)
    ref_i = start * np.array([np.prod(ifactors[SLOTS:][slot == s]) for s in range(SLOTS)])
    np.testing.assert_array_equal(ifactors[:SLOTS], ref_i)
    # cas: exactly one thread per slot saw -1 (the winner, now the owner); all others saw the winner
    own, old = owner.to_numpy(), olds.to_numpy()
    for s in range(SLOTS):
        mine = old[slot == s]
        assert (mine == -1).sum() == 1
        winner = np.arange(N_THREADS)[slot == s][mine == -1][0]
        assert own[s] == winner
        assert (mine[mine != -1] == winner).all()
    # exchange: the slot holds one of its threads' values; untouched component stays
    sw = swapped.to_numpy()
    assert all(sw[s, 1] in np.arange(N_THREADS)[slot == s] for s in range(SLOTS))
    np.testing.assert_array_equal(sw[:, 0], -7)
    np.testing.assert_array_equal(counts, np.bincount(slot, minlength=SLOTS))


exch = qd.field(qd.f32, shape=N_THREADS)
chain = qd.field(qd.i32, shape=N_THREADS + 1)


@qd.kernel
def exchange_chain(v: qd.types.ndarray(dtype=qd.f32, ndim=1)):
    for i in range(N_THREADS):
        exch[i] = qd.atomic_exchange(v[i], exch[i])   # swap element i of v and exch (float xchg)
    for _ in range(1):
        for j in range(N_THREADS):  # a serial chain: every exchange hands the previous value on
            chain[j + 1] = qd.atomic_exchange(chain[0], j)


def test_exchange_returns_old(rng):
    v = rng.normal(size=N_THREADS).astype(np.float32)
    e0 = rng.normal(size=N_THREADS).astype(np.float32)
    exch.from_numpy(e0)
    chain.fill(-1)
    v0 = v.copy()
    exchange_chain(v)
    np.testing.assert_array_equal(v, e0)
    np.testing.assert_array_equal(exch.to_numpy(), v0)
    c = chain.to_numpy()
    assert c[0] == N_THREADS - 1
    np.testing.assert_array_equal(c[1:], np.arange(-1, N_THREADS - 1))


@qd.kernel
def local_atomics(x: qd.types.ndarray(dtype=qd.i32, ndim=1), out: qd.types.ndarray(dtype=qd.i32, ndim=2)):
    for i in range(x.shape[0]):
        s = x[i]
        t = qd.atomic_mul(s, 3)
        u = qd.atomic_cas(s, 3 * x[i], 11)
        w = qd.atomic_exchange(s, 7.9)       # cast to the local's type
        v = qd.Vector([x[i], 2])
        o = qd.atomic_mul(v[1], x[i])
        out[i, 0], out[i, 1], out[i, 2], out[i, 3], out[i, 4], out[i, 5] = s, t, u, w, o, v[1]


def test_atomics_on_locals(rng):
    x = rng.integers(-50, 50, 64).astype(np.int32)
    out = np.zeros((64, 6), np.int32)
    local_atomics(x, out)
    ref = np.stack([np.full(64, 7), x, 3 * x, np.full(64, 11), np.full(64, 2), 2 * x], axis=1)
    np.testing.assert_array_equal(out, ref)


cas_f = qd.field(qd.f32, shape=4)


def test_atomic_cas_on_float_is_our_error():
    @qd.kernel
    def bad():
        for i in range(4):
            qd.atomic_cas(cas_f[i], 0.0, 1.0)

    with pytest.raises(QuadrantsTypeError, match=r"(?s)atomic_cas supports integer types only.*qd.atomic_cas"):
        bad()


def test_atomic_arity_is_our_error():
    @qd.kernel
    def bad():
        for i in range(4):
            qd.atomic_cas(owner[i], 0)

    with pytest.raises(QuadrantsTypeError, match=r"atomic_cas\(\) takes 3 arguments"):
        bad()


# -- elementwise operations -------------------------------------------------------------------------

@qd.kernel
def int_ops(a: qd.types.ndarray(dtype=qd.i32, ndim=1), b: qd.types.ndarray(dtype=qd.i32, ndim=1),
            c: qd.types.ndarray(dtype=qd.i64, ndim=1), out: qd.types.ndarray(dtype=qd.i64, ndim=2)):
    for i in range(a.shape[0]):
        out[i, 0] = qd.raw_div(a[i], b[i])
        out[i, 1] = qd.raw_mod(a[i], b[i])
        out[i, 2] = qd.bit_shr(a[i], 7)
        out[i, 3] = qd.math.clz(a[i])
        out[i, 4] = qd.math.popcnt(a[i])
        out[i, 5] = qd.math.ffs(a[i])
        out[i, 6] = qd.math.clz(c[i])
        out[i, 7] = qd.math.popcnt(c[i])
        out[i, 8] = qd.math.ffs(c[i])
        out[i, 9] = qd.bit_shr(c[i], 60)
        out[i, 10] = qd.select(a[i] > b[i], a[i], b[i])
        v = qd.raw_mod(qd.Vector([a[i], a[i] + 1]), b[i])
        out[i, 11] = v[1]
        out[i, 12] = qd.bit_cast(qd.bit_cast(a[i], qd.f32), qd.i32)


def _bit_ref(x, width):
    u = [int(v) & ((1 << width) - 1) for v in x]
    clz = [width - v.bit_length() for v in u]
    pop = [bin(v).count("1") for v in u]
    ffs = [0 if v == 0 else (v & -v).bit_length() for v in u]
    return np.array(clz), np.array(pop), np.array(ffs)


def test_integer_ops(rng):
    n = 200
    a = rng.integers(-2**31, 2**31, n).astype(np.int32)
    a[:3] = [0, -1, 1]
    b = rng.integers(1, 1000, n).astype(np.int32) * rng.choice([-1, 1], n).astype(np.int32)
    c = rng.integers(-2**63, 2**63, n, dtype=np.int64)
    c[:2] = [0, -1]
    out = np.zeros((n, 13), np.int64)
    int_ops(a, b, c, out)
    np.testing.assert_array_equal(out[:, 0], np.trunc(a / b.astype(np.float64)).astype(np.int64))
    np.testing.assert_array_equal(out[:, 1], np.fmod(a, b))
    np.testing.assert_array_equal(out[:, 2], a.view(np.uint32) >> 7)
    for cols, x, width in ((slice(3, 6), a, 32), (slice(6, 9), c, 64)):
        clz, pop, ffs = _bit_ref(x, width)
        np.testing.assert_array_equal(out[:, cols], np.stack([clz, pop, ffs], axis=1))
    np.testing.assert_array_equal(out[:, 9], (c.view(np.uint64) >> np.uint64(60)).astype(np.int64))
    np.testing.assert_array_equal(out[:, 10], np.maximum(a, b))
    np.testing.assert_array_equal(out[:, 11], np.fmod(a.astype(np.int64) + 1, b).astype(np.int32))
    np.testing.assert_array_equal(out[:, 12], a)


@qd.kernel
def float_ops(x: qd.types.ndarray(dtype=qd.f64, ndim=1), y: qd.types.ndarray(dtype=qd.f64, ndim=1),
              out: qd.types.ndarray(dtype=qd.f64, ndim=2), ex: qd.types.ndarray(dtype=qd.i32, ndim=1)):
    for i in range(x.shape[0]):
        out[i, 0] = qd.raw_div(x[i], y[i])
        out[i, 1] = qd.raw_mod(x[i], y[i])
        m, e = qd.frexp(x[i])
        out[i, 2] = m
        ex[i] = e
        out[i, 3] = qd.math.log2(qd.abs(x[i]))
        out[i, 4] = qd.math.fract(x[i])
        out[i, 5] = qd.math.sign(x[i])
        out[i, 6] = qd.math.step(y[i], x[i])
        v = qd.select(qd.Vector([x[i] > 0, x[i] <= 0]), qd.Vector([x[i], y[i]]), -1.0)
        out[i, 7] = v[0] + 10 * v[1]
        out[i, 8] = qd.bit_cast(qd.bit_cast(x[i], qd.u64), qd.f64)
        out[i, 9] = qd.math.isnan(qd.sqrt(x[i])) + 2 * qd.math.isinf(x[i] / (y[i] * 0.0))


def test_float_ops(rng):
    n = 300
    x = rng.normal(scale=30, size=n)
    y = rng.normal(scale=5, size=n)
    x[:4] = [0.0, 5e-310, -3e-320, 1.0]   # zero and subnormals for frexp
    out = np.zeros((n, 10))
    ex = np.zeros(n, np.int32)
    float_ops(x, y, out, ex)
    m, e = np.frexp(x)
    np.testing.assert_allclose(out[:, 0], x / y, rtol=1e-15)
    np.testing.assert_allclose(out[:, 1], np.fmod(x, y), rtol=1e-12, atol=1e-12)
    np.testing.assert_array_equal(out[:, 2], m)
    np.testing.assert_array_equal(ex, e)
    with np.errstate(divide="ignore"):
        np.testing.assert_allclose(out[4:, 3], np.log2(np.abs(x[4:])), rtol=1e-14)
    np.testing.assert_allclose(out[:, 4], x - np.floor(x), atol=1e-13)
    np.testing.assert_array_equal(out[:, 5], np.sign(x))
    np.testing.assert_array_equal(out[:, 6], (x >= y).astype(np.float64))
    np.testing.assert_array_equal(out[:, 7], np.where(x > 0, x, -1.0) + 10 * np.where(x <= 0, y, -1.0))
    np.testing.assert_array_equal(out[:, 8], x)
    np.testing.assert_array_equal(out[:, 9], (x < 0) + 2 * (x != 0))


def test_ops_in_python_scope(rng):
    a, b = int(rng.integers(-100, -1)), int(rng.integers(2, 9))
    assert qd.raw_div(a, b) == int(a / b) and qd.raw_mod(a, b) == int(np.fmod(a, b))
    assert qd.bit_shr(np.int32(a), 28) == (a & 0xFFFFFFFF) >> 28
    assert qd.bit_cast(1.0, qd.u32) == 0x3F800000 and qd.bit_cast(np.uint32(0x3F800000), qd.f32) == 1.0
    x = float(rng.normal())
    m, e = qd.frexp(np.float64(x))
    assert (m, e) == np.frexp(x)
    v = qd.select(qd.Vector([1, 0, 1]), qd.Vector([1.0, 2.0, 3.0]), 0.0)
    np.testing.assert_array_equal(v.to_numpy(), [1.0, 0.0, 3.0])
    assert qd.math.clz(np.int32(1)) == 31 and qd.math.popcnt(np.int64(-1)) == 64 and qd.math.ffs(np.int32(8)) == 4
    np.testing.assert_array_equal(qd.math.sign(qd.Vector([-2.0, 0.0, 3.0])).to_numpy(), [-1.0, 0.0, 1.0])


def test_op_errors_are_ours():
    fx = qd.field(qd.f32, shape=4)

    @qd.kernel
    def shift_float():
        for i in range(4):
            fx[i] = qd.bit_shr(fx[i], 1)

    with pytest.raises(QuadrantsTypeError, match=r"(?s)qd.bit_shr takes integers.*qd.bit_shr\(fx\[i\], 1\)"):
        shift_float()

    @qd.kernel
    def cast_width():
        for i in range(4):
            fx[i] = qd.bit_cast(qd.i64(i), qd.f32)

    with pytest.raises(QuadrantsTypeError, match=r"(?s)same width.*qd.bit_cast"):
        cast_width()
    with pytest.raises(QuadrantsTypeError, match=r"qd.clz takes integers"):
        qd.math.clz(1.5)
