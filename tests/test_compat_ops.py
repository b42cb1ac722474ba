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


# -- qd.math ----------------------------------------------------------------------------------------

@qd.kernel
def glsl(x: qd.types.ndarray(dtype=qd.f64, ndim=2), out: qd.types.ndarray(dtype=qd.f64, ndim=2)):
    for i in range(x.shape[0]):
        v = qd.Vector([x[i, 0], x[i, 1], x[i, 2]], dt=qd.f64)
        n = qd.math.normalize(qd.Vector([x[i, 3], x[i, 4], x[i, 5]], dt=qd.f64))
        r = qd.math.reflect(v, n)
        f = qd.math.refract(qd.math.normalize(v), n, 0.8)
        m = qd.math.mix(v, n, x[i, 6])
        out[i, 0], out[i, 1], out[i, 2] = r[0], r[1], r[2]
        out[i, 3], out[i, 4], out[i, 5] = f[0], f[1], f[2]
        out[i, 6], out[i, 7], out[i, 8] = m[0], m[1], m[2]
        out[i, 9] = qd.math.smoothstep(-1.0, 1.0, x[i, 0])
        out[i, 10] = qd.math.mod(x[i, 0], x[i, 1])
        out[i, 11] = qd.math.distance(v, n) + 10 * qd.math.length(v)
        out[i, 12] = qd.math.dot(v, n)
        c = qd.math.cross(v, n)
        out[i, 13] = c[2]
        out[i, 14] = qd.math.degrees(x[i, 0]) + qd.math.radians(x[i, 1])
        M = qd.Matrix([[x[i, 0], x[i, 1], 0.5], [x[i, 2], 2.0, x[i, 3]], [0.1, x[i, 4], 3.0]], dt=qd.f64)
        out[i, 15] = qd.math.determinant(M)
        out[i, 16] = qd.math.inverse(M)[1, 2]


def _np_refract(x, n, eta):
    d = x @ n
    k = 1 - eta * eta * (1 - d * d)
    return np.where(k >= 0, eta * x - (eta * d + np.sqrt(np.maximum(k, 0))) * n, 0 * x)


def test_glsl_functions(rng):
    x = rng.normal(size=(100, 7))
    out = np.zeros((100, 17))
    glsl(x, out)
    v, n, a = x[:, :3], x[:, 3:6], x[:, 6:7]
    n = n / np.linalg.norm(n, axis=1, keepdims=True)
    d = np.sum(v * n, axis=1, keepdims=True)
    np.testing.assert_allclose(out[:, 0:3], v - 2 * d * n, rtol=1e-12, atol=1e-12)
    vn = v / np.linalg.norm(v, axis=1, keepdims=True)
    np.testing.assert_allclose(out[:, 3:6], np.stack([_np_refract(vn[i], n[i], 0.8) for i in range(100)]),
                               rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(out[:, 6:9], v * (1 - a) + n * a, rtol=1e-12, atol=1e-12)
    t = np.clip((x[:, 0] + 1) / 2, 0, 1)
    np.testing.assert_allclose(out[:, 9], t * t * (3 - 2 * t), rtol=1e-12, atol=1e-15)
    np.testing.assert_allclose(out[:, 10], x[:, 0] - x[:, 1] * np.floor(x[:, 0] / x[:, 1]), rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(out[:, 11], np.linalg.norm(v - n, axis=1) + 10 * np.linalg.norm(v, axis=1), rtol=1e-12)
    np.testing.assert_allclose(out[:, 12], d[:, 0], rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(out[:, 13], np.cross(v, n)[:, 2], rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(out[:, 14], np.degrees(x[:, 0]) + np.radians(x[:, 1]), rtol=1e-12)
    M = np.stack([np.array([[r[0], r[1], 0.5], [r[2], 2.0, r[3]], [0.1, r[4], 3.0]]) for r in x])
    np.testing.assert_allclose(out[:, 15], np.linalg.det(M), rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(out[:, 16], np.linalg.inv(M)[:, 1, 2], rtol=1e-8, atol=1e-10)


transforms = qd.Matrix.field(4, 4, qd.f32, shape=16)
small = qd.Matrix.field(2, 2, qd.f32, shape=16)


@qd.kernel
def build_transforms(p: qd.types.ndarray(dtype=qd.f32, ndim=2)):
    for i in range(16):
        axis = qd.Vector([p[i, 0], p[i, 1], p[i, 2]])
        transforms[i] = (qd.math.translate(p[i, 3], p[i, 4], p[i, 5]) @ qd.math.scale(p[i, 0], p[i, 1], p[i, 2])
                         @ qd.math.rot_by_axis(axis, p[i, 3]) @ qd.math.rotation3d(p[i, 3], p[i, 4], p[i, 5]))
        small[i] = qd.math.rotation2d(p[i, 0]) + qd.math.eye(2) * qd.math.vdir(p[i, 1])[1]


def _np_rot_axis(axis, ang):
    a = axis / np.linalg.norm(axis)
    K = np.array([[0, -a[2], a[1]], [a[2], 0, -a[0]], [-a[1], a[0], 0]])
    R = np.eye(4)
    R[:3, :3] = np.eye(3) + np.sin(ang) * K + (1 - np.cos(ang)) * K @ K
    return R


def _np_ypr(yaw, pitch, roll):
    def rot(axis, t):
        c, s = np.cos(t), np.sin(t)
        R = np.eye(4)
        i, j = [(1, 2), (2, 0), (0, 1)][axis]
        R[i, i], R[i, j], R[j, i], R[j, j] = c, -s, s, c
        return R
    return rot(1, yaw) @ rot(0, pitch) @ rot(2, roll)   # yaw about Y, pitch about X, roll about Z


def test_transforms(rng):
    p = rng.uniform(-1.5, 1.5, (16, 6)).astype(np.float32)
    build_transforms(p)
    for i in range(16):
        a, t = p[i].astype(np.float64), np.eye(4)
        t[:3, 3] = a[3:6]
        ref = t @ np.diag([*a[:3], 1.0]) @ _np_rot_axis(a[:3], a[3]).T @ _np_ypr(a[5], a[3], a[4]).T
        np.testing.assert_allclose(transforms.to_numpy()[i], ref, rtol=2e-5, atol=2e-5)
        c, s = np.cos(a[0]), np.sin(a[0])
        np.testing.assert_allclose(small.to_numpy()[i], [[c, -s], [s, c]] + np.eye(2) * np.sin(a[1]), atol=2e-6)


def test_math_namespace_matches_quadrants():
    names = ["acos", "asin", "atan2", "ceil", "clamp", "clz", "cos", "cross", "degrees", "determinant", "distance",
             "dot", "e", "exp", "eye", "ffs", "floor", "fns", "fract", "inf", "inverse", "isinf", "isnan", "ivec2",
             "ivec3", "ivec4", "length", "log", "log2", "mat2", "mat3", "mat4", "max", "min", "mix", "mod",
             "translate", "scale", "nan", "normalize", "pi", "pow", "popcnt", "radians", "reflect", "refract",
             "rot_by_axis", "rot_yaw_pitch_roll", "rotation2d", "rotation3d", "round", "sign", "sin",
             "smoothstep", "sqrt", "step", "tan", "tanh", "uvec2", "uvec3", "uvec4", "vdir", "vec2", "vec3", "vec4"]
    missing = [n for n in names if not hasattr(qd.math, n)]
    assert missing == []   # every name of Quadrants' qd.math.__all__ (docs/quadrants_compat.md)
    assert qd.math.pi == np.pi and qd.math.isinf(qd.math.inf) == 1 and qd.math.isnan(qd.math.nan) == 1
    assert qd.math.uvec3 == qd.types.vector(3, qd.u32)


def test_math_functions_in_python_scope(rng):
    v = qd.Vector(rng.normal(size=3).tolist(), dt=qd.f64)
    n = qd.math.normalize(qd.Vector(rng.normal(size=3).tolist(), dt=qd.f64))
    d = float(v.to_numpy() @ n.to_numpy())
    np.testing.assert_allclose(qd.math.reflect(v, n).to_numpy(), v.to_numpy() - 2 * d * n.to_numpy(), rtol=1e-12)
    np.testing.assert_allclose(qd.math.mix(v, n, 0.25).to_numpy(), 0.75 * v.to_numpy() + 0.25 * n.to_numpy())
    np.testing.assert_allclose(qd.math.mod(-0.5, 1.0), 0.5)
    np.testing.assert_allclose(qd.math.fract(qd.Vector([-1.25, 0.5, 1.75])).to_numpy(), [0.75, 0.5, 0.75])
    np.testing.assert_array_equal(qd.math.eye(3).to_numpy(), np.eye(3))


# -- svd, polar_decompose, sym_eig ----------------------------------------------------------------------

def _decomposition_kernel(n, dt):
    A = qd.Matrix.field(n, n, dt, shape=32)
    U, S, V, R, P, Q = (qd.Matrix.field(n, n, dt, shape=32) for _ in range(6))
    W = qd.Vector.field(n, dt, shape=32)

    @qd.kernel
    def decompose():
        for i in range(32):
            U[i], S[i], V[i] = qd.svd(A[i])
            R[i], P[i] = qd.polar_decompose(A[i])
            w, q = qd.sym_eig(A[i] + A[i].transpose())
            W[i], Q[i] = w, q

    return A, (U, S, V, R, P, W, Q), decompose


@pytest.mark.parametrize("n", [2, 3])
@pytest.mark.parametrize("dt", [qd.f32, qd.f64], ids=["f32", "f64"])
def test_decompositions_reconstruct(n, dt, rng):
    tol = 2e-5 if dt == qd.f32 else 1e-12
    A, outs, decompose = _decomposition_kernel(n, dt)
    a = rng.normal(size=(32, n, n))
    A.from_numpy(a)
    decompose()
    U, S, V, R, P, W, Q = (f.to_numpy().astype(np.float64) for f in outs)
    eye = np.broadcast_to(np.eye(n), (32, n, n))
    T = np.transpose
    np.testing.assert_allclose(U @ S @ T(V, (0, 2, 1)), a, atol=10 * tol)
    for M in (U, V, R, Q):
        np.testing.assert_allclose(M @ T(M, (0, 2, 1)), eye, atol=10 * tol)
    for M in (U, V, R):   # rotations
        np.testing.assert_allclose(np.linalg.det(M), 1.0, atol=10 * tol)
    s = np.diagonal(S, axis1=1, axis2=2)
    np.testing.assert_allclose(S, np.einsum("ij,ki->kij", np.eye(n), s), atol=10 * tol)   # diagonal
    np.testing.assert_allclose(np.abs(s), np.linalg.svd(a)[1], rtol=10 * tol, atol=10 * tol)
    np.testing.assert_array_equal(np.sign(np.prod(s, axis=1)), np.sign(np.linalg.det(a)))
    np.testing.assert_allclose(R @ P, a, atol=10 * tol)
    np.testing.assert_allclose(P, T(P, (0, 2, 1)), atol=10 * tol)
    b = a + T(a, (0, 2, 1))
    np.testing.assert_allclose(W, np.linalg.eigvalsh(b), rtol=10 * tol, atol=10 * tol)
    np.testing.assert_allclose(Q @ (W[:, :, None] * T(Q, (0, 2, 1))), b, atol=20 * tol)


def test_decompositions_in_python_scope(rng):
    a = rng.normal(size=(3, 3))
    U, S, V = qd.svd(qd.Matrix(a, dt=qd.f64))
    np.testing.assert_allclose(U.to_numpy() @ S.to_numpy() @ V.to_numpy().T, a, atol=1e-12)
    w, Q = qd.sym_eig(qd.Matrix(a + a.T, dt=qd.f64))
    np.testing.assert_allclose(w.to_numpy(), np.linalg.eigvalsh(a + a.T), atol=1e-12)
    R, P = qd.polar_decompose(qd.Matrix(a[:2, :2], dt=qd.f64))
    np.testing.assert_allclose(R.to_numpy() @ P.to_numpy(), a[:2, :2], atol=1e-12)
    with pytest.raises(QuadrantsTypeError, match=r"qd.svd takes a 2x2 or 3x3 matrix"):
        qd.svd(qd.Matrix(np.eye(4)))


def test_decomposition_of_a_vector_is_our_error():
    @qd.kernel
    def bad():
        for _ in range(2):
            qd.sym_eig(qd.Vector([1.0, 2.0]))

    with pytest.raises(QuadrantsTypeError, match=r"(?s)qd.sym_eig takes a 2x2 to 6x6 matrix.*qd.sym_eig"):
        bad()


# -- qd.types, qd.zero, tuple assignment ---------------------------------------------------------------

def test_type_predicates():
    for dt, integral, real, signed in ((qd.i8, True, False, True), (qd.i64, True, False, True),
                                       (qd.u16, True, False, False), (qd.u1, True, False, False),
                                       (qd.f16, False, True, None), (qd.f64, False, True, None)):
        assert qd.types.is_integral(dt) is integral and qd.types.is_real(dt) is real
        if signed is None:
            with pytest.raises(QuadrantsTypeError, match="takes an integer type"):
                qd.types.is_signed(dt)
        else:
            assert qd.types.is_signed(dt) is signed and qd.types.is_unsigned(dt) is (not signed)
    assert qd.types.is_tensor(qd.types.vector(3, qd.f32)) and not qd.types.is_tensor(qd.f32)
    assert qd.types.is_real(np.float32) and qd.types.is_integral(int)


@qd.kernel
def zeros_and_swaps(x: qd.types.ndarray(dtype=qd.f32, ndim=1), out: qd.types.ndarray(dtype=qd.f32, ndim=2)):
    for i in range(x.shape[0] - 1):
        a, b = x[i], x[i + 1]
        a, b = b, a                        # swap
        v = qd.Vector([a, b])
        w = qd.Vector([b * 2, a * 2])
        v, w = w, v
        p = q = r = a - b                  # chained
        z = qd.zero(v)
        o = qd.one(a)
        out[i, 0], out[i, 1], out[i, 2], out[i, 3] = a, b, v[0], w[1]
        out[i, 4] = p + q + r
        out[i, 5] = z[0] + z[1] + o
        out[i, 6] = qd.zero(x[i])


def test_tuple_assignment_and_zero(rng):
    x = rng.normal(size=33).astype(np.float32)
    out = np.full((32, 7), np.nan, np.float32)
    zeros_and_swaps(x, out)
    a, b = x[1:], x[:-1]
    np.testing.assert_array_equal(out[:, 0], a)
    np.testing.assert_array_equal(out[:, 1], b)
    np.testing.assert_array_equal(out[:, 2], 2 * b)
    np.testing.assert_array_equal(out[:, 3], b)
    np.testing.assert_allclose(out[:, 4], 3 * (a - b), rtol=1e-6)
    np.testing.assert_array_equal(out[:, 5:], np.tile([1.0, 0.0], (32, 1)))


swap_field = qd.field(qd.i32, shape=64)
chain_a = qd.field(qd.i32, shape=64)
chain_b = qd.field(qd.i32, shape=64)


@qd.kernel
def swap_pairs():
    for i in range(32):
        swap_field[2 * i], swap_field[2 * i + 1] = swap_field[2 * i + 1], swap_field[2 * i]
        chain_a[2 * i] = chain_b[2 * i + 1] = swap_field[2 * i] * 3


def test_tuple_assignment_on_fields(rng):
    v = rng.integers(-1000, 1000, 64).astype(np.int32)
    swap_field.from_numpy(v)
    chain_a.fill(0)
    chain_b.fill(0)
    swap_pairs()
    ref = v.reshape(32, 2)[:, ::-1].reshape(64)
    np.testing.assert_array_equal(swap_field.to_numpy(), ref)
    np.testing.assert_array_equal(chain_a.to_numpy()[::2], 3 * ref[::2])
    np.testing.assert_array_equal(chain_b.to_numpy()[1::2], 3 * ref[::2])
    np.testing.assert_array_equal(chain_a.to_numpy()[1::2], 0)


def _np_fns(mask, base, offset):
    bits = [i for i in range(32) if (mask >> i) & 1]
    if offset == 0:
        return base if base < 32 and base in bits else 0xFFFFFFFF
    picked = [i for i in bits if i >= base] if offset > 0 else [i for i in reversed(bits) if i <= base]
    return picked[abs(offset) - 1] if len(picked) >= abs(offset) else 0xFFFFFFFF


@qd.kernel
def find_nth(mask: qd.types.ndarray(dtype=qd.u32, ndim=1), base: qd.types.ndarray(dtype=qd.u32, ndim=1),
             offset: qd.types.ndarray(dtype=qd.i32, ndim=1), out: qd.types.ndarray(dtype=qd.u32, ndim=1)):
    for i in range(mask.shape[0]):
        out[i] = qd.math.fns(mask[i], base[i], offset[i])


def test_fns(rng):
    n = 300
    mask = rng.integers(0, 2**32, n, dtype=np.uint64).astype(np.uint32)
    mask[:3] = [0, 0xFFFFFFFF, 1]
    base = rng.integers(0, 32, n).astype(np.uint32)
    offset = rng.integers(-6, 7, n).astype(np.int32)
    out = np.zeros(n, np.uint32)
    find_nth(mask, base, offset, out)
    ref = [_np_fns(int(m), int(b), int(o)) for m, b, o in zip(mask, base, offset)]
    np.testing.assert_array_equal(out, np.array(ref, np.uint32))
    assert qd.math.fns(np.uint32(0b1011), 0, 3) == 3


spd_in = qd.Matrix.field(3, 3, qd.f64, shape=16)
spd_out = qd.Matrix.field(3, 3, qd.f64, shape=16)


@qd.kernel
def nearest_spd():
    for i in spd_in:
        spd_out[i] = qd.make_spd(spd_in[i])


def test_make_spd(rng):
    a = rng.normal(size=(16, 3, 3))
    a = a + a.transpose(0, 2, 1)
    spd_in.from_numpy(a)
    nearest_spd()
    w, q = np.linalg.eigh(a)
    ref = q @ (np.maximum(w, 0)[:, :, None] * q.transpose(0, 2, 1))
    np.testing.assert_allclose(spd_out.to_numpy(), ref, atol=1e-12)
    b = a[0, :2, :2]
    w2, q2 = np.linalg.eigh(b)
    np.testing.assert_allclose(qd.make_spd(qd.Matrix(b, dt=qd.f64)).to_numpy(), q2 @ np.diag(np.maximum(w2, 0)) @ q2.T,
                               atol=1e-12)


@qd.kernel
def complex_ops(z: qd.types.ndarray(dtype=qd.f32, ndim=2), out: qd.types.ndarray(dtype=qd.f32, ndim=3)):
    for i in range(z.shape[0]):
        a, b = qd.math.vec2(z[i, 0], z[i, 1]), qd.math.vec2(z[i, 2], z[i, 3])
        rs = (qd.math.cmul(a, b), qd.math.cdiv(a, b), qd.math.cconj(a), qd.math.cinv(a), qd.math.csqrt(a),
              qd.math.cpow(a, 1.5), qd.math.cexp(a), qd.math.clog(a))
        for k in qd.static(range(8)):
            out[i, k, 0], out[i, k, 1] = rs[k][0], rs[k][1]


def test_complex_helpers(rng):
    z = rng.normal(size=(40, 4)).astype(np.float32)
    out = np.zeros((40, 8, 2), np.float32)
    complex_ops(z, out)
    a, b = (z[:, 0] + 1j * z[:, 1]).astype(np.complex128), (z[:, 2] + 1j * z[:, 3]).astype(np.complex128)
    ref = [a * b, a / b, np.conj(a), 1 / a, np.sqrt(a), a ** 1.5, np.exp(a), np.log(a)]
    got = out[:, :, 0] + 1j * out[:, :, 1]
    for k, r in enumerate(ref):
        np.testing.assert_allclose(got[:, k], r, rtol=2e-5, atol=2e-5, err_msg=f"complex op {k}")
    np.testing.assert_allclose(qd.math.cmul(qd.math.vec2(1, 1), qd.math.vec2(0, 1)).to_numpy(), [-1, 1])


half = qd.field(qd.f16, shape=3)
vec_slots = qd.Vector.field(3, qd.i64, shape=4)


@qd.kernel
def half_and_components(f: qd.types.ndarray(dtype=qd.f32, ndim=1), won: qd.types.ndarray(dtype=qd.i32, ndim=1)):
    for i in range(f.shape[0]):
        qd.atomic_mul(half[0], f[i])
        qd.atomic_exchange(half[1], 0.5)
        # a vector component; the desired value is never the expected one (thread 7 writing 7
        # would let a second thread win)
        if qd.atomic_cas(vec_slots[i % 4][2], 7, i + 100) == 7:
            won[i] = 1


def test_atomics_on_f16_and_vector_components(rng):
    f = rng.permutation([2.0] * 6 + [0.5] * 4 + [1.0] * 30).astype(np.float32)  # exact in f16 in any order
    half.from_numpy(np.array([1.0, 3.0, 9.0], np.float16))
    vec_slots.from_numpy(np.tile(np.array([1, 2, 7], np.int64), (4, 1)))
    won = np.zeros(40, np.int32)
    half_and_components(f, won)
    np.testing.assert_array_equal(half.to_numpy(), np.array([np.prod(f), 0.5, 9.0], np.float16))
    slots = vec_slots.to_numpy()
    np.testing.assert_array_equal(slots[:, :2], np.tile([1, 2], (4, 1)))
    for s in range(4):   # one winner per slot, and the slot holds its index + 100
        assert won[s::4].sum() == 1 and slots[s, 2] == np.arange(40)[s::4][won[s::4] == 1][0] + 100


lin_a = qd.Matrix.field(3, 3, qd.f64, shape=16)
lin_b = qd.Vector.field(3, qd.f64, shape=16)
lin_x = qd.Vector.field(3, qd.f64, shape=16)


@qd.kernel
def solve_all():
    for i in lin_a:
        lin_x[i] = qd.solve(lin_a[i], lin_b[i])


def test_solve(rng):
    a, b = rng.normal(size=(16, 3, 3)) + 3 * np.eye(3), rng.normal(size=(16, 3))
    lin_a.from_numpy(a)
    lin_b.from_numpy(b)
    solve_all()
    np.testing.assert_allclose(lin_x.to_numpy(), np.linalg.solve(a, b[:, :, None])[:, :, 0], rtol=1e-10, atol=1e-12)
    x = qd.solve(qd.Matrix(a[0, :2, :2], dt=qd.f64), qd.Vector(b[0, :2], dt=qd.f64))
    np.testing.assert_allclose(x.to_numpy(), np.linalg.solve(a[0, :2, :2], b[0, :2]), rtol=1e-12)


normal = qd.field(qd.f64, shape=40000)


@qd.kernel
def draw_normal():
    for i in range(40000):
        normal[i] = qd.randn(qd.f64) if i % 2 == 0 else qd.randn()


def test_randn_is_standard_normal():
    draw_normal()
    x = normal.to_numpy()
    assert abs(x.mean()) < 0.02 and abs(x.std() - 1) < 0.02
    for k, p in ((1, 0.6827), (2, 0.9545)):   # the mass within k standard deviations
        assert abs(np.mean(np.abs(x) < k) - p) < 0.01
    assert len(np.unique(x)) > 39000


eig_in = qd.Matrix.field(2, 2, qd.f64, shape=64)
eig_val = qd.Matrix.field(2, 2, qd.f64, shape=64)
eig_vec = qd.Matrix.field(4, 2, qd.f64, shape=64)


@qd.kernel
def eig_all():
    for i in eig_in:
        eig_val[i], eig_vec[i] = qd.eig(eig_in[i])


def test_eig_2x2_real_and_complex(rng):
    a = rng.normal(size=(64, 2, 2))
    a[0] = 2.5 * np.eye(2)                      # a multiple of the identity
    eig_in.from_numpy(a)
    eig_all()
    lam = eig_val.to_numpy()[:, :, 0] + 1j * eig_val.to_numpy()[:, :, 1]
    vec = eig_vec.to_numpy()[:, 0::2, :] + 1j * eig_vec.to_numpy()[:, 1::2, :]   # (64, 2 rows, 2 columns)
    assert (~np.isreal(lam)).any() and np.isreal(lam).any()   # both kinds occur
    for i in range(64):
        np.testing.assert_allclose(np.sort_complex(lam[i]), np.sort_complex(np.linalg.eigvals(a[i])), atol=1e-10)
        for k in range(2):
            v = vec[i, :, k]
            np.testing.assert_allclose(np.linalg.norm(v), 1.0, rtol=1e-12)
            np.testing.assert_allclose(a[i] @ v, lam[i, k] * v, atol=1e-10)
    val, _ = qd.eig(qd.Matrix([[0.0, -1.0], [1.0, 0.0]], dt=qd.f64))
    np.testing.assert_allclose(val.to_numpy(), [[0.0, 1.0], [0.0, -1.0]], atol=1e-15)
