"""The SNode tree (qd_numba/snode.py): dense layouts, placed fields, materialisation, errors.

Every layout is checked against numpy on random data; the same program on AoS, SoA, nested,
column-major and own-buffer layouts gives the same results.
"""

import numpy as np
import pytest

import qd_numba as qd

N, M = 6, 8


def _fields():
    return (qd.field(qd.f32, name="a"), qd.field(qd.i32, name="b"), qd.Vector.field(3, qd.f32, name="v"),
            qd.Matrix.field(2, 2, qd.f64, name="m"))


def _layout(kind):
    """Fields a (f32), b (i32), v (vec3 f32), m (2x2 f64) of shape (N, M) laid out as ``kind``."""
    if kind == "shaped":
        return (qd.field(qd.f32, shape=(N, M)), qd.field(qd.i32, shape=(N, M)), qd.Vector.field(3, qd.f32, (N, M)),
                qd.Matrix.field(2, 2, qd.f64, (N, M)))
    if kind == "order":
        return (qd.field(qd.f32, shape=(N, M), order="ji"), qd.field(qd.i32, shape=(N, M), order="ji"),
                qd.Vector.field(3, qd.f32, (N, M), order="ji"), qd.Matrix.field(2, 2, qd.f64, (N, M), order="ji"))
    fs = _fields()
    if kind == "aos":
        qd.root.dense(qd.ij, (N, M)).place(*fs)
    elif kind == "soa":
        for f in fs:
            qd.root.dense(qd.ij, (N, M)).place(f)
    elif kind == "nested":
        qd.root.dense(qd.i, N).dense(qd.j, M).place(*fs)
    elif kind == "blocked":     # each axis split over two nodes
        qd.root.dense(qd.ij, (3, 2)).dense(qd.ij, (2, 4)).place(*fs[:3])
        qd.root.dense(qd.i, 2).dense(qd.j, 8).dense(qd.i, 3).place(fs[3])
    elif kind == "ji":
        qd.root.dense(qd.j, M).dense(qd.i, N).place(fs[0], fs[2])
        qd.root.dense(qd.j, M).dense(qd.i, N).place(fs[1], fs[3])
    return fs


LAYOUTS = ["shaped", "order", "aos", "soa", "nested", "blocked", "ji"]


def _data(rng):
    return (rng.uniform(-2, 2, (N, M)).astype(np.float32), rng.integers(-50, 50, (N, M)).astype(np.int32),
            rng.uniform(-2, 2, (N, M, 3)).astype(np.float32), rng.uniform(-2, 2, (N, M, 2, 2)))


@pytest.mark.parametrize("kind", LAYOUTS)
def test_kernel_in_every_layout(rng, kind):
    a, b, v, m = _layout(kind)
    assert a.shape == b.shape == v.shape == m.shape == (N, M)
    data = _data(rng)
    for f, d in zip((a, b, v, m), data):
        f.from_numpy(d)

    @qd.kernel
    def step():
        for i, j in a:
            b[i, j] = b[i, j] * 2 + i - j
            v[i, j] = v[i, j] * a[i, j] + qd.Vector([i, j, 1.0])
            m[i, j] = m[i, j] @ m[i, j] + a[i, j]
            a[i, j] = a[i, j] + b[i, j]

    step()
    A, B, V, Mt = data
    ii, jj = np.meshgrid(np.arange(N), np.arange(M), indexing="ij")
    B2 = B * 2 + ii - jj
    V2 = V * A[..., None] + np.stack([ii, jj, np.ones_like(ii)], -1)
    M2 = Mt @ Mt + A[..., None, None]
    np.testing.assert_array_equal(b.to_numpy(), B2)
    # v * a + 1 rounds the product once on the CPU and not at all on the GPU (a fused multiply-add):
    # where the sum cancels, the two differ by an f32 rounding of the terms (|v * a| + 1 <= 5)
    np.testing.assert_allclose(v.to_numpy(), V2, rtol=1e-6, atol=5 * np.finfo(np.float32).eps)
    np.testing.assert_allclose(m.to_numpy(), M2, rtol=1e-12)
    np.testing.assert_allclose(a.to_numpy(), A + B2, rtol=1e-6)


@pytest.mark.parametrize("kind", LAYOUTS)
def test_python_scope_in_every_layout(rng, kind):
    a, b, v, m = _layout(kind)
    data = _data(rng)
    for f, d in zip((a, b, v, m), data):
        f.from_numpy(d)
    for f, d in zip((a, b, v, m), data):    # neighbours in a cell do not overwrite each other
        np.testing.assert_array_equal(f.to_numpy(), d)
    i, j = int(rng.integers(N)), int(rng.integers(M))
    assert a[i, j] == data[0][i, j] and b[i, j] == data[1][i, j]
    np.testing.assert_array_equal(v[i, j], data[2][i, j])
    b[i, j] = 1234
    m[i, j] = [[1.0, 2.0], [3.0, 4.0]]
    expect_b, expect_m = data[1].copy(), data[3].copy()
    expect_b[i, j], expect_m[i, j] = 1234, [[1.0, 2.0], [3.0, 4.0]]
    np.testing.assert_array_equal(b.to_numpy(), expect_b)
    np.testing.assert_array_equal(m.to_numpy(), expect_m)
    np.testing.assert_array_equal(a.to_numpy(), data[0])
    v.fill(0.5)
    np.testing.assert_array_equal(v.to_numpy(), np.full((N, M, 3), 0.5, np.float32))
    np.testing.assert_array_equal(a.to_numpy(), data[0])


def test_aos_interleaves_soa_separates():
    a, b = qd.field(qd.f32), qd.field(qd.f64)
    qd.root.dense(qd.i, 8).place(a, b)
    c, d = qd.field(qd.f32), qd.field(qd.f32)
    qd.root.dense(qd.i, 8).place(c)
    qd.root.dense(qd.i, 8).place(d)
    c.fill(1)
    # one cell holds a (4 bytes, padded to b's alignment) and b: a stride of 16 bytes
    assert a._arr.strides == b._arr.strides == (16,)
    assert c._arr.strides == d._arr.strides == (4,)
    assert b._arr.ctypes.data - a._arr.ctypes.data == 8
    assert d._arr.ctypes.data - c._arr.ctypes.data == 32


def test_qd_init_drops_the_nodes_the_old_runtime_never_materialised(rng):
    """Nodes placed under qd.root and never materialised (a kernel that failed to compile, say)
    belong to the runtime qd.init replaces: the next tree holds only what is placed after it."""
    from qd_numba import config

    stale = qd.field(qd.f32)
    qd.root.bitmasked(qd.i, 4).place(stale)
    qd.init(arch=config.current.arch)
    x = qd.field(qd.f32)
    qd.root.dense(qd.i, 16).place(x)
    data = rng.random(16).astype(np.float32)
    x.from_numpy(data)
    np.testing.assert_array_equal(x.to_numpy(), data)
    assert x._tree.base.nbytes == 16 * 4 and x._tree._fields == [x]


def test_shapes_from_chains():
    a, b, c, d = (qd.field(qd.f32) for _ in range(4))
    s = qd.root.dense(qd.i, 4)
    s.place(a)
    s.dense(qd.jk, (3, 5)).place(b)
    qd.root.dense(qd.j, 6).place(c)      # a field indexed by the axes on its path only
    qd.root.place(d)                     # 0-d
    assert a.shape == (4,) and b.shape == (4, 3, 5) and c.shape == (6,) and d.shape == ()
    assert b.snode.shape == (4, 3, 5) and b.snode.parent().shape == (4, 3, 5)
    assert b.parent(2) is s and s.parent() is qd.root and a.parent() is s
    assert qd.field(qd.f32, shape=(2, 9)).snode.shape == (2, 9)


def test_blocked_layout_memory_order(rng):
    x = qd.field(qd.i32)
    qd.root.dense(qd.ij, (2, 3)).dense(qd.ij, (4, 2)).place(x)
    assert x.shape == x.snode.shape == (8, 6)
    X = rng.integers(-100, 100, (8, 6)).astype(np.int32)
    x.from_numpy(X)
    # the buffer holds 4x2 blocks, one after the other in row-major block order
    blocks = X.reshape(2, 4, 3, 2).transpose(0, 2, 1, 3)
    np.testing.assert_array_equal(x._arr, blocks)
    assert x._arr.flags.c_contiguous

    @qd.kernel
    def shift():
        for i, j in x:
            x[i, j] += i * 10 + j

    shift()
    ii, jj = np.meshgrid(np.arange(8), np.arange(6), indexing="ij")
    np.testing.assert_array_equal(x.to_numpy(), X + ii * 10 + jj)
    assert x[5, 3] == X[5, 3] + 53


def test_struct_for_over_nested_fields(rng):
    x, y = qd.field(qd.f32), qd.field(qd.f32)
    s = qd.root.dense(qd.i, 4)
    s.place(x)
    s.dense(qd.j, 6).place(y)
    X, Y = rng.uniform(-1, 1, 4).astype(np.float32), rng.uniform(-1, 1, (4, 6)).astype(np.float32)
    x.from_numpy(X)
    y.from_numpy(Y)

    @qd.kernel
    def scale():
        for i, j in y:
            y[i, j] = y[i, j] * x[i] + j
        for i in x:
            x[i] = x[i] * 3

    scale()
    np.testing.assert_allclose(y.to_numpy(), Y * X[:, None] + np.arange(6), rtol=1e-6)
    np.testing.assert_allclose(x.to_numpy(), X * 3, rtol=1e-6)


def test_offset_field(rng):
    x = qd.field(qd.i32, shape=(4, 3), offset=(-2, 5))
    y = qd.field(qd.f32)
    qd.root.dense(qd.i, 6).place(y, offset=10)
    Y = rng.uniform(-1, 1, 6).astype(np.float32)
    y.from_numpy(Y)

    @qd.kernel
    def fill():
        for i, j in x:
            x[i, j] = i * 10 + j
        for i in y:
            y[i] = y[i] + i

    fill()
    ii, jj = np.meshgrid(np.arange(-2, 2), np.arange(5, 8), indexing="ij")
    np.testing.assert_array_equal(x.to_numpy(), ii * 10 + jj)
    assert x[-2, 5] == -15 and x[1, 7] == 17
    np.testing.assert_allclose(y.to_numpy(), Y + np.arange(10, 16), rtol=1e-6)
    assert y[10] == pytest.approx(Y[0] + 10)
    with pytest.raises(qd.QuadrantsIndexError, match="out of bounds"):
        x[2, 5]


def test_lazy_grad(rng):
    x = qd.field(qd.f32, needs_grad=True)
    loss = qd.field(qd.f32, needs_grad=True)
    qd.root.dense(qd.i, 16).place(x)
    qd.root.place(loss)
    qd.root.lazy_grad()
    assert x.grad.shape == (16,) and loss.grad.shape == ()
    X = rng.uniform(-1, 1, 16).astype(np.float32)
    x.from_numpy(X)

    @qd.kernel
    def compute():
        for i in x:
            loss[None] += x[i] ** 2

    with qd.ad.Tape(loss=loss):
        compute()
    np.testing.assert_allclose(loss[None], (X.astype(np.float64) ** 2).sum(), rtol=1e-5)
    np.testing.assert_allclose(x.grad.to_numpy(), 2 * X, rtol=1e-6)


def test_place_gradients_explicitly(rng):
    x, y = qd.field(qd.f64, needs_grad=True), qd.field(qd.f64, needs_grad=True)
    qd.root.dense(qd.i, 8).place(x, y)
    qd.root.dense(qd.i, 8).place(x.grad, y.grad)     # the gradients in a tree of their own layout
    X = rng.uniform(-2, 2, 8)
    x.from_numpy(X)

    @qd.kernel
    def f():
        for i in x:
            y[i] = qd.sin(x[i]) * x[i]

    f()
    y.grad.fill(1.0)
    f.grad()
    np.testing.assert_allclose(y.to_numpy(), np.sin(X) * X, rtol=1e-12)
    np.testing.assert_allclose(x.grad.to_numpy(), np.cos(X) * X + np.sin(X), rtol=1e-12)


def test_new_root_after_materialisation(rng):
    x = qd.field(qd.f32)
    node = qd.root.dense(qd.i, 8)
    node.place(x)

    @qd.kernel
    def inc():
        for i in x:
            x[i] += 1

    inc()
    y = qd.field(qd.f32, name="late")
    with pytest.raises(qd.QuadrantsRuntimeError, match=r"place of field 'late' at .*test_snode.py:\d+.*materialised"):
        node.place(y)
    qd.root.dense(qd.i, 3).place(y)      # qd.root is a new tree now
    Y = rng.uniform(-1, 1, 3).astype(np.float32)
    y.from_numpy(Y)
    np.testing.assert_array_equal(y.to_numpy(), Y)
    np.testing.assert_array_equal(x.to_numpy(), np.ones(8, np.float32))
    z = qd.field(qd.f32, shape=5)        # and new fields with a shape
    z.fill(2)
    assert z.to_numpy().sum() == 10


def test_fields_builder():
    x = qd.field(qd.i32)
    fb = qd.FieldsBuilder()
    fb.dense(qd.i, 8).place(x)
    fb.finalize()

    @qd.kernel
    def iota():
        for i in x:
            x[i] = i * i

    iota()
    np.testing.assert_array_equal(x.to_numpy(), np.arange(8) ** 2)
    with pytest.raises(qd.QuadrantsRuntimeError, match="FieldsBuilder finalized"):
        fb.finalize()


def test_deactivate_all_keeps_dense_data(rng):
    x = qd.field(qd.f32)
    qd.root.dense(qd.i, 8).place(x)
    X = rng.uniform(-1, 1, 8).astype(np.float32)
    x.from_numpy(X)
    qd.root.deactivate_all()
    x.parent().deactivate_all()
    np.testing.assert_array_equal(x.to_numpy(), X)


def test_errors():
    x = qd.field(qd.f32, name="twice")
    qd.root.dense(qd.i, 4).place(x)
    with pytest.raises(qd.QuadrantsRuntimeError, match=r"field 'twice' is placed already \(.*test_snode.py:\d+\)"):
        qd.root.dense(qd.i, 4).place(x)
    with pytest.raises(qd.QuadrantsRuntimeError, match="has a shape of its own"):
        qd.root.dense(qd.i, 4).place(qd.field(qd.f32, shape=4))
    with pytest.raises(qd.QuadrantsTypeError, match=r"test_snode.py:\d+: an axis appears twice"):
        qd.root.dense(qd.axes(0, 0), 4)
    with pytest.raises(qd.QuadrantsSyntaxError, match="shape cannot be None when offset is set"):
        qd.field(qd.f32, offset=2)
    with pytest.raises(qd.QuadrantsSyntaxError, match="The axes in order must be different"):
        qd.field(qd.f32, shape=(2, 3), order="ii")
    with pytest.raises(qd.QuadrantsSyntaxError, match="dimensionality of shape and offset"):
        qd.field(qd.f32, shape=(2, 3), offset=1)
    unplaced = qd.field(qd.f32, name="nowhere")

    @qd.kernel
    def use():
        for i in range(2):
            unplaced[i] = 1

    with pytest.raises(qd.QuadrantsRuntimeError, match="field 'nowhere' is not placed"):
        use()
    with pytest.raises(qd.QuadrantsRuntimeError, match="field 'nowhere' is not placed"):
        unplaced.to_numpy()


@pytest.mark.cuda
def test_cuda_tree_fields(rng):
    """The device side: one device buffer per tree, strided device views in the field table,
    python-scope access copying the tree's bytes between host and device."""
    qd.init(arch=qd.cuda)
    try:
        a, b, v = qd.field(qd.f32), qd.field(qd.i32), qd.Vector.field(3, qd.f64)
        qd.root.dense(qd.ij, (4, 2)).dense(qd.ij, (16, 8)).place(a, b, v)     # AoS, blocked: 64 x 16
        c = qd.field(qd.f32, shape=(64, 16), order="ji", offset=(0, 3))
        A = rng.uniform(-1, 1, (64, 16)).astype(np.float32)
        V = rng.uniform(-1, 1, (64, 16, 3))
        a.from_numpy(A)
        v.from_numpy(V)
        b[5, 7] = 11

        @qd.kernel
        def step():
            for i, j in a:
                b[i, j] += i - j
                v[i, j] = v[i, j] * a[i, j]
                c[i, j + 3] = a[i, j] * 2

        step()
        ii, jj = np.meshgrid(np.arange(64), np.arange(16), indexing="ij")
        expect_b = ii - jj
        expect_b[5, 7] += 11
        np.testing.assert_array_equal(b.to_numpy(), expect_b)
        np.testing.assert_allclose(v.to_numpy(), V * A[..., None], rtol=1e-6)
        np.testing.assert_allclose(c.to_numpy(), 2 * A, rtol=1e-6)
        np.testing.assert_array_equal(a.to_numpy(), A)
        assert b[63, 0] == 63 and c[10, 4] == pytest.approx(2 * A[10, 1])
        a.fill(0.5)
        step()
        np.testing.assert_allclose(c.to_numpy(), np.ones((64, 16)), rtol=1e-6)
    finally:
        qd.init(arch=qd.cpu)
