"""Vectors, matrices and dtypes inside kernels, as a user meets them in the first hour:
ndarrays of vectors, the class constructors (``qd.Matrix.identity`` ...), component stores
(``v.x = ...``), calling a vector type (``vec3(a, b, c)``), f16 fields, vector return values and
vector parameters. Every kernel here is also compiled for CUDA by the suite (tests/conftest.py);
the ``cuda``-marked tests run them on a GPU. References are numpy, on random data.
"""

from __future__ import annotations

import numpy as np
import pytest

import qd_numba as qd

vec3 = qd.types.vector(3, qd.f32)
mat2 = qd.types.matrix(2, 2, qd.f64)


@pytest.fixture
def on_cuda():
    qd.init(arch=qd.cuda)
    yield
    qd.init(arch=qd.cpu)


# -- qd.Vector.ndarray / qd.Matrix.ndarray --------------------------------------------------------


def test_vector_and_matrix_ndarrays(rng):
    n = 37
    v = qd.Vector.ndarray(3, qd.f32, (n,))
    m = qd.Matrix.ndarray(2, 2, qd.f64, (n,))
    out = qd.Vector.ndarray(2, qd.f64, n)
    assert isinstance(v, qd.Ndarray) and v.shape == (n,) and v.element_shape == (3,)
    assert m.to_numpy().shape == (n, 2, 2) and m.dtype == qd.f64
    v0 = rng.standard_normal((n, 3)).astype(np.float32)
    m0 = rng.standard_normal((n, 2, 2))
    v.from_numpy(v0)
    m.from_numpy(m0)

    @qd.kernel
    def apply(v: qd.types.ndarray(dtype=vec3, ndim=1), m: qd.types.ndarray(dtype=mat2, ndim=1),
              out: qd.types.ndarray(dtype=qd.types.vector(2, qd.f64), ndim=1)):
        for i in v:
            out[i] = m[i] @ qd.Vector([v[i].x, v[i].z], dt=qd.f64)
            v[i] = v[i] * 2.0

    apply(v, m, out)
    ref = np.einsum("nij,nj->ni", m0, v0[:, [0, 2]].astype(np.float64))
    np.testing.assert_allclose(out.to_numpy(), ref, rtol=1e-12)
    np.testing.assert_array_equal(v.to_numpy(), v0 * 2)


# -- class constructors and methods of captured values --------------------------------------------


def test_class_constructors_in_kernels(rng):
    a = rng.standard_normal((16, 2)).astype(np.float32)
    k = rng.integers(0, 3, 16).astype(np.int32)
    out = np.zeros((16, 4), np.float32)

    @qd.kernel
    def build(a: qd.types.ndarray(dtype=qd.f32, ndim=2), k: qd.types.ndarray(dtype=qd.i32, ndim=1),
              out: qd.types.ndarray(dtype=qd.f32, ndim=2)):
        for i in range(a.shape[0]):
            x = qd.Vector([a[i, 0], a[i, 1]])
            eye = qd.Matrix.identity(qd.f32, 2)
            zero = qd.Matrix.zero(qd.f32, 2, 3)
            out[i, 0] = (eye @ x + qd.Vector.zero(qd.f32, 2)).sum() + zero.sum()
            u = qd.Vector.unit(3, k[i])
            out[i, 1] = u[0] + 2.0 * u[1] + 3.0 * u[2]
            out[i, 2] = (eye * 5.0).trace()
            out[i, 3] = qd.Vector.unit(2, 1, qd.f64)[1]

    build(a, k, out)
    np.testing.assert_allclose(out[:, 0], a.sum(1), rtol=1e-6)
    np.testing.assert_array_equal(out[:, 1], k + 1)
    np.testing.assert_array_equal(out[:, 2:], np.tile([10.0, 1.0], (16, 1)))


def test_methods_of_captured_vectors(rng):
    g = qd.Vector(rng.standard_normal(3).astype(np.float32))
    m = qd.Matrix(rng.standard_normal((2, 3)).astype(np.float32))
    out = np.zeros(5, np.float32)

    @qd.kernel
    def use(out: qd.types.ndarray(dtype=qd.f32, ndim=1)):
        for _ in range(1):
            out[0] = g.norm()
            out[1] = g.x + g.z
            out[2] = m.transpose()[2, 1]
            out[3] = g.n + m.m
            out[4] = g.normalized().dot(g)

    use(out)
    e = g.to_numpy()
    np.testing.assert_allclose(out, [np.linalg.norm(e), e[0] + e[2], m.to_numpy()[1, 2], 6,
                                     np.linalg.norm(e)], rtol=1e-5)


# -- component stores -----------------------------------------------------------------------------


def test_component_stores_on_local_vectors(rng):
    a = rng.standard_normal(64).astype(np.float32)
    out = np.zeros((64, 4), np.float32)

    @qd.kernel
    def update(a: qd.types.ndarray(dtype=qd.f32, ndim=1), out: qd.types.ndarray(dtype=qd.f32, ndim=2)):
        for i in range(a.shape[0]):
            v = qd.Vector([1.0, 2.0, 3.0, 4.0])
            v.x = a[i]
            v.y -= a[i]
            v.b *= a[i]                          # r g b a, as x y z w
            v.q += 1.0                           # s t p q, as x y z w
            old = qd.atomic_add(v.z, 10.0)      # a local component: an update, returns the old value
            w = v                                # a copy: stores into w leave v alone
            w.w = 0.0
            out[i, 0] = v.x
            out[i, 1] = v.y + old
            out[i, 2] = v.z
            out[i, 3] = v.w + w.w

    update(a, out)
    ref = np.stack([a, 2 - a + 3 * a, 3 * a + 10, np.full_like(a, 5)], axis=1)
    np.testing.assert_allclose(out, ref, rtol=1e-6, atol=1e-6)


def test_component_stores_on_vector_fields(rng):
    n = 300
    f = qd.Vector.field(3, qd.f32, shape=n)
    counter = qd.Vector.field(3, qd.f32, shape=2)
    f0 = rng.standard_normal((n, 3)).astype(np.float32)
    f.from_numpy(f0)
    d = rng.standard_normal(n).astype(np.float32)

    @qd.kernel
    def update(d: qd.types.ndarray(dtype=qd.f32, ndim=1)):
        for i in f:
            f[i].y = d[i]
            f[i].x += 2.0 * d[i]
            counter[1].z += 1.0                  # atomic, as counter[1][2] += 1.0

    update(d)
    ref = f0.copy()
    ref[:, 1] = d
    ref[:, 0] += 2 * d
    np.testing.assert_allclose(f.to_numpy(), ref, rtol=1e-6, atol=1e-5)
    np.testing.assert_array_equal(counter.to_numpy(), [[0, 0, 0], [0, 0, n]])


def test_python_scope_components(rng):
    e = rng.standard_normal(4).astype(np.float32)
    v = qd.Vector(e)
    assert (v.x, v.g, v.p, v.a) == (e[0], e[1], e[2], e[3])
    v.r = 5.0
    v.t += 1.0
    np.testing.assert_array_equal(v.to_numpy(), [5.0, e[1] + np.float32(1.0), e[2], e[3]])
    assert v != "abc" and not v == None  # noqa: E711  (not numbers: Python's identity fallback)
    with pytest.raises(TypeError):
        v + "abc"


@pytest.mark.parametrize("body", ["v.z = 3.0", "v[2] = 3.0", "v[-3] += 1.0", "out[0] = v[2]"])
def test_constant_index_out_of_range(body):
    ns = {"qd": qd}
    exec(f"@qd.kernel\ndef bad(out: qd.types.ndarray(dtype=qd.f32, ndim=1)):\n    for i in range(1):\n"
         f"        v = qd.Vector([1.0, 2.0])\n        {body}\n        out[0] = v.x\n", ns)
    with pytest.raises(qd.QuadrantsIndexError, match="index -?[23] is out of range .* size 2"):
        ns["bad"](np.zeros(1, np.float32))


def test_non_component_attribute_store_is_our_error():
    @qd.kernel
    def bad(out: qd.types.ndarray(dtype=qd.f32, ndim=1)):
        for _ in range(1):
            v = qd.Vector([1.0, 2.0])
            v.n = 3
            out[0] = v.x

    with pytest.raises(qd.QuadrantsError, match="cannot assign 'n' of a vector"):
        bad(np.zeros(1, np.float32))


# -- calling a vector type ------------------------------------------------------------------------


def test_vector_type_call(rng):
    a = rng.standard_normal((32, 3)).astype(np.float32)
    out = np.zeros((32, 3), np.float32)

    @qd.kernel
    def build(a: qd.types.ndarray(dtype=qd.f32, ndim=2), out: qd.types.ndarray(dtype=vec3, ndim=1)):
        for i in range(a.shape[0]):
            out[i] = vec3(a[i, 0], a[i, 1], a[i, 2]) + vec3(a[i, 0]) + mat2(1, 2, 3, 4).sum()

    build(a, out)
    np.testing.assert_allclose(out, a + a[:, :1] + 10.0, rtol=1e-6)


# -- f16 fields -----------------------------------------------------------------------------------


def test_f16_scalar_field_loads_and_stores(rng):
    n = 512
    h = qd.field(qd.f16, shape=n)
    h0 = rng.standard_normal(n).astype(np.float16)
    h0[::4] *= np.float16(1e-6)                  # f16 subnormals too
    h.from_numpy(h0)
    # f64 values just above a midpoint of two f16 neighbours: rounding through f32 to nearest
    # twice would land on the midpoint, then on the even neighbour; once, on the upper one
    lo = np.abs(rng.standard_normal(n)).astype(np.float16) + np.float16(1)
    hi = np.nextafter(lo, np.float16(np.inf))
    x = (lo.astype(np.float64) + hi.astype(np.float64)) / 2 * (1 + 2.0 ** -40)
    x[::2] = rng.standard_normal(n // 2) * 1e3   # and ordinary values, some overflowing f16
    x[1] = 1e6
    x[4::8] *= 1e-9                              # to f16 subnormals, or zero
    widened = np.zeros(n, np.float32)

    @qd.kernel
    def roundtrip(x: qd.types.ndarray(dtype=qd.f64, ndim=1), widened: qd.types.ndarray(dtype=qd.f32, ndim=1)):
        for i in h:
            widened[i] = h[i] * 2.0
            h[i] = x[i]

    roundtrip(x, widened)
    np.testing.assert_array_equal(widened, h0.astype(np.float32) * 2)
    with np.errstate(over="ignore"):
        np.testing.assert_array_equal(h.to_numpy(), x.astype(np.float16))
    assert h.to_numpy().dtype == np.float16 and h[1] == np.inf


def test_f16_vector_field_and_atomics(rng):
    n = 256
    p = qd.Vector.field(3, qd.f16, shape=n)
    total = qd.field(qd.f16, shape=())
    top = qd.field(qd.f16, shape=())
    p0 = rng.standard_normal((n, 3)).astype(np.float16)
    p.from_numpy(p0)
    top[None] = -np.inf

    @qd.kernel
    def step(scale: qd.f32):
        for i in p:
            p[i] = p[i] * scale + qd.Vector([1.0, 2.0, 3.0])
            p[i].y += 1.0
            total[None] += 1.0
            qd.atomic_max(top[None], p[i].x)

    step(0.5)
    ref = (p0.astype(np.float32) * np.float32(0.5) + np.float32([1, 2, 3])).astype(np.float16)
    ref[:, 1] = (ref[:, 1].astype(np.float32) + 1).astype(np.float16)
    np.testing.assert_array_equal(p.to_numpy(), ref)
    assert total[None] == n and top[None] == ref[:, 0].max()


def test_f16_atomic_add_on_neighbouring_elements(rng):
    # elements sharing a 32-bit word, updated at once from many threads (each atomic is a
    # compare-and-swap of that word: the neighbour must survive)
    counts = qd.field(qd.f16, shape=4)
    idx = rng.integers(0, 4, 1000).astype(np.int32)

    @qd.kernel
    def histogram(idx: qd.types.ndarray(dtype=qd.i32, ndim=1)):
        for i in range(idx.shape[0]):
            counts[idx[i]] += 1.0

    histogram(idx)
    np.testing.assert_array_equal(counts.to_numpy(), np.bincount(idx, minlength=4).astype(np.float16))


@pytest.mark.cuda
def test_f16_fields_on_gpu(on_cuda, rng):
    test_f16_scalar_field_loads_and_stores(rng)
    test_f16_vector_field_and_atomics(rng)
    test_f16_atomic_add_on_neighbouring_elements(rng)


# -- vector return values -------------------------------------------------------------------------


@qd.kernel
def rotation(angle: qd.f64) -> mat2:
    return qd.Matrix([[qd.cos(angle), -qd.sin(angle)], [qd.sin(angle), qd.cos(angle)]])


def _check_returns(rng):
    total = qd.Vector.field(3, qd.f32, shape=())   # on the arch of the caller

    @qd.kernel
    def centroid(p: qd.types.ndarray(dtype=vec3, ndim=1)) -> vec3:
        total[None] = qd.Vector([0.0, 0.0, 0.0])
        for i in range(p.shape[0]):
            total[None] += p[i]
        return total[None] / p.shape[0]

    p = rng.standard_normal((100, 3)).astype(np.float32)
    c = centroid(p)
    assert isinstance(c, qd.Vector) and c.dtype == qd.f32
    np.testing.assert_allclose(c.to_numpy(), p.mean(0), rtol=1e-4, atol=1e-6)
    t = float(rng.uniform(0, 6))
    r = rotation(t)
    assert isinstance(r, qd.Matrix) and r.dtype == qd.f64
    np.testing.assert_allclose(r.to_numpy(), [[np.cos(t), -np.sin(t)], [np.sin(t), np.cos(t)]], rtol=1e-12)


def test_vector_returns(rng):
    _check_returns(rng)


@pytest.mark.parametrize("ty", [vec3, mat2, qd.types.vector(4, qd.i32), qd.f64, qd.i32], ids=str)
def test_return_slot_decoding(rng, ty):
    """The CUDA launcher reads a return value back from its temporary slot as these bytes."""
    from qd_numba.targets.cuda.plan import read_return, return_slot
    from qd_numba.typing.matrix import MatrixType

    dt, count = return_slot(ty)
    values = rng.integers(-100, 100, count).astype(dt) if dt.kind == "i" else rng.standard_normal(count).astype(dt)
    raw = np.zeros(64, np.uint8)  # a slot: the value's bytes first
    raw[:values.nbytes] = values.view(np.uint8)
    got = read_return(raw, dt, ty)
    if not isinstance(ty, MatrixType):
        assert type(got) is (int if dt.kind == "i" else float) and got == values[0]
    else:
        assert isinstance(got, qd.Matrix) and got.type == ty
        np.testing.assert_array_equal(got.to_numpy().reshape(-1), values)


# -- vector and matrix parameters -----------------------------------------------------------------


@qd.kernel
def affine(m: mat2, b: qd.types.vector(2, qd.f64), scale: qd.f32, k: qd.types.vector(2, qd.i32),
           x: qd.types.ndarray(dtype=qd.f64, ndim=2), out: qd.types.ndarray(dtype=qd.f64, ndim=2)):
    for i in range(x.shape[0]):
        y = m @ qd.Vector([x[i, 0], x[i, 1]], dt=qd.f64) + b * scale
        out[i, 0] = y.x + k.x
        out[i, 1] = y.y * k[1]


def _check_parameters(rng):
    x = rng.standard_normal((50, 2))
    out = np.zeros((50, 2))
    m0, b0 = rng.standard_normal((2, 2)), rng.standard_normal(2)
    k0 = rng.integers(-5, 5, 2)
    compiled = affine.compile_count
    for m, b, k in [(qd.Matrix(m0), qd.Vector(b0), qd.Vector(k0.astype(np.int32))),  # exact types
                    (m0.tolist(), tuple(b0), list(k0)),                               # converted
                    (m0.astype(np.float32), b0, k0)]:
        affine(m, b, 1.5, k, x, out)
        y = x @ np.asarray(m, np.float64).T + b0 * 1.5
        np.testing.assert_allclose(out, np.stack([y[:, 0] + k0[0], y[:, 1] * k0[1]], axis=1), rtol=1e-6)
    assert affine.compile_count - compiled <= 1  # one instance, whatever the container


def test_vector_parameters(rng):
    _check_parameters(rng)


@pytest.mark.parametrize(("b", "k", "match"), [
    ((1.0, 2.0, 3.0), (1, 2), r"argument 'b': expected a vector\(2, float64\) .* shape \(2,\)"),
    ([[1.0], [2.0]], (1, 2), r"argument 'b': expected a vector\(2, float64\)"),
    ("ab", (1, 2), r"argument 'b': expected a vector\(2, float64\)"),
    ((1.0, 2.0), (1.5, 2), r"argument 'k': expected integer elements for vector\(2, int32\)"),
])
def test_bad_vector_arguments(b, k, match):
    with pytest.raises(qd.QuadrantsTypeError, match=match):
        affine(np.eye(2), b, 1.0, k, np.zeros((1, 2)), np.zeros((1, 2)))


def test_cuda_runner_writes_vector_parameters(rng):
    """The CUDA launcher's generated runner (no GPU needed): one cell per element of a vector
    parameter, and host iteration counts recomputed on every call (the vector may have changed
    in place)."""
    import ctypes
    from types import SimpleNamespace

    from qd_numba.targets.cuda.plan import _runner_source

    cells = {"v": [ctypes.c_float() for _ in range(3)], "s": [ctypes.c_int64()]}
    totals = []
    plan = SimpleNamespace(params=[("v", "matrix"), ("s", "scalar")], cells=cells, rt=None, packed=None,
                           launch_all=lambda: -1, totals_fn=object(), totals_args=[0], error_words=[],
                           timer=None, ret=None, _update_grids=lambda args: totals.append(int(args[0].x)),
                           written=[], written_args=[], stream_blocks=None, cells_owner=None, graph=None,
                           _launch_all_users=[])
    src, ns = _runner_source(plan)
    exec(src, ns)
    run = ns["make"]()
    v = qd.Vector(rng.standard_normal(3).astype(np.float32) * 10)
    run(v, 7)
    assert [c.value for c in cells["v"]] == v.to_numpy().tolist() and cells["s"][0].value == 7
    first = int(v.x)
    v.x = 42.0
    run(v, 7)
    assert cells["v"][0].value == 42.0 and totals == [first, 42]


def test_vector_parameter_is_the_kernels_copy(rng):
    v0 = rng.standard_normal(3).astype(np.float32)
    out = np.zeros((8, 3), np.float32)

    @qd.kernel
    def shifted(v: vec3, out: qd.types.ndarray(dtype=qd.f32, ndim=2)):
        v.x = 10.0                               # updates the kernel's copy, as v[0] = 10.0
        v[1] += 5.0
        for i in range(out.shape[0]):
            w = v
            w.z += i
            out[i, 0], out[i, 1], out[i, 2] = w.x, w.y, w.z

    arg = qd.Vector(v0)
    shifted(arg, out)
    ref = np.tile([10.0, v0[1] + np.float32(5.0), v0[2]], (8, 1)).astype(np.float32)
    ref[:, 2] += np.arange(8)
    np.testing.assert_allclose(out, ref, rtol=1e-6)
    np.testing.assert_array_equal(arg.to_numpy(), v0)  # the caller's vector is unchanged


@pytest.mark.cuda
def test_vector_returns_and_parameters_on_gpu(on_cuda, rng):
    _check_returns(rng)
    _check_parameters(rng)
    with pytest.raises(qd.QuadrantsTypeError, match=r"argument 'b': expected a vector\(2, float64\)"):
        affine(np.eye(2), (1.0, 2.0, 3.0), 1.0, (1, 2), np.zeros((1, 2)), np.zeros((1, 2)))


def test_row_stores_on_local_matrices(rng):
    a = rng.standard_normal((64, 3)).astype(np.float32)
    out = np.zeros((64, 2, 2), np.float32)

    @qd.kernel
    def update(a: qd.types.ndarray(dtype=qd.f32, ndim=2), out: qd.types.ndarray(dtype=qd.f32, ndim=3)):
        for i in range(a.shape[0]):
            m = qd.Matrix([[1.0, 2.0], [3.0, 4.0]])
            m[0].x = a[i, 0]                     # a component of a row
            m[1][1] = a[i, 1]                    # an element through the row
            m[1][0] += a[i, 2]
            row = m[0]                           # a copy: stores into row leave m alone
            row.y = 0.0
            for r in qd.static(range(2)):
                for c in qd.static(range(2)):
                    out[i, r, c] = m[r, c] + row[1]

    update(a, out)
    ref = np.empty((64, 2, 2), np.float32)
    ref[:, 0, 0], ref[:, 0, 1] = a[:, 0], 2
    ref[:, 1, 0], ref[:, 1, 1] = 3 + a[:, 2], a[:, 1]
    np.testing.assert_allclose(out, ref, rtol=1e-6)


def test_multi_letter_swizzles_read_components(rng):
    """``v.zx``, ``v.rgbr``, ``v.xxyy`` (Quadrants/GLSL swizzles) build vectors of the picked
    components, in kernels and in Python scope; a letter past the vector's size is our error."""
    f = qd.Vector.field(3, qd.f32, shape=(16,))
    two = qd.Vector.field(2, qd.f32, shape=(16,))
    four = qd.Vector.field(4, qd.f32, shape=(16,))

    @qd.kernel
    def pick():
        for i in range(16):
            v = f[i]
            two[i] = v.zx
            four[i] = v.rgbr + v.xxyy * 2.0

    d = rng.uniform(-1, 1, (16, 3)).astype(np.float32)
    f.from_numpy(d)
    pick()
    np.testing.assert_allclose(two.to_numpy(), d[:, [2, 0]], rtol=1e-6)
    np.testing.assert_allclose(four.to_numpy(), d[:, [0, 1, 2, 0]] + d[:, [0, 0, 1, 1]] * 2, rtol=1e-6)
    v = qd.Vector(list(d[0]))
    np.testing.assert_allclose(v.zyx.to_numpy(), d[0, ::-1], rtol=1e-6)

    @qd.kernel
    def too_far():
        for i in range(16):
            two[i] = f[i].xw

    with pytest.raises(qd.QuadrantsTypeError, match="swizzle 'xw'"):
        too_far()


def test_int_and_float_of_vectors(rng):
    """``int(v)``/``float(v)`` convert every component (``default_ip``/``default_fp``), as in
    Quadrants' MPM: ``base = int(Xp - 0.5)``."""
    a = rng.uniform(0.0, 20.0, (16, 2)).astype(np.float32)
    base = np.zeros((16, 2), np.int32)
    back = np.zeros((16, 2), np.float32)

    @qd.kernel
    def convert(a: qd.types.ndarray(), base: qd.types.ndarray(), back: qd.types.ndarray()):
        for p in range(a.shape[0]):
            b = int(qd.Vector([a[p, 0], a[p, 1]]) - 0.5)
            f = float(b * 2)
            for d in qd.static(range(2)):
                base[p, d] = b[d]
                back[p, d] = f[d] + 0.25
    convert(a, base, back)
    np.testing.assert_array_equal(base, (a - 0.5).astype(np.int32))
    np.testing.assert_array_equal(back, (a - 0.5).astype(np.int32) * 2 + np.float32(0.25))
