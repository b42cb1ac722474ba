"""Sparse SNodes (qd_numba/snode.py, passes/sparse.py): bitmasked, pointer, dynamic.

Random activation patterns against numpy: stores activate cells, struct-fors visit active cells
only, inactive cells read 0, deactivation zero-fills, dynamic lists grow by concurrent appends.
"""

import numpy as np
import pytest

import qd_numba as qd
from qd_numba.errors import QuadrantsRuntimeError, QuadrantsSyntaxError

N, B = 12, 4   # cells per axis; a pointer block's side


@pytest.mark.parametrize("kind", ["bitmasked", "pointer"])
def test_store_activates_and_struct_for_visits_active_cells(kind, rng):
    x = qd.field(qd.f32)
    getattr(qd.root, kind)(qd.ij, (N, N)).place(x)
    count = qd.field(qd.i32, shape=())
    total = qd.field(qd.f32, shape=())
    seen = qd.field(qd.i32, shape=(N, N))

    @qd.kernel
    def write(mask: qd.types.ndarray(), vals: qd.types.ndarray()):
        for i, j in qd.ndrange(N, N):
            if mask[i, j]:
                x[i, j] = vals[i, j]

    @qd.kernel
    def visit():
        for i, j in x:
            count[None] += 1
            total[None] += x[i, j]
            seen[i, j] = 1

    mask = (rng.random((N, N)) < 0.3).astype(np.int32)
    vals = rng.uniform(1, 2, (N, N)).astype(np.float32)
    write(mask, vals)
    visit()
    assert count[None] == mask.sum()
    np.testing.assert_array_equal(seen.to_numpy(), mask)
    np.testing.assert_allclose(total[None], (vals * mask).sum(), rtol=1e-5)
    np.testing.assert_array_equal(x.to_numpy(), vals * mask)   # inactive cells read 0


@pytest.mark.parametrize("kind", ["bitmasked", "pointer"])
def test_activate_deactivate_is_active(kind, rng):
    x = qd.field(qd.i32)
    node = getattr(qd.root, kind)(qd.i, N)
    node.place(x)
    flags = qd.field(qd.i32, shape=N)

    @qd.kernel
    def set_all(vals: qd.types.ndarray()):
        for i in range(N):
            x[i] = vals[i]

    @qd.kernel
    def change(on: qd.types.ndarray(), off: qd.types.ndarray()):
        for i in range(N):
            if on[i]:
                qd.activate(node, i)
            if off[i]:
                qd.deactivate(node, i)

    @qd.kernel
    def query():
        for i in range(N):
            flags[i] = qd.is_active(node, i)

    @qd.kernel
    def visited():
        for i in x:
            flags[i] += 10

    vals = rng.integers(1, 100, N).astype(np.int32)
    set_all(vals)
    off = (rng.random(N) < 0.5).astype(np.int32)
    change(np.zeros(N, np.int32), off)
    query()
    np.testing.assert_array_equal(flags.to_numpy(), 1 - off)
    np.testing.assert_array_equal(x.to_numpy(), vals * (1 - off))   # deactivation zero-fills
    on = off * (rng.random(N) < 0.5)
    change(on.astype(np.int32), np.zeros(N, np.int32))   # active again, still zero
    query()
    visited()
    active = (1 - off) | on
    np.testing.assert_array_equal(flags.to_numpy(), active * 11)
    np.testing.assert_array_equal(x.to_numpy(), vals * (1 - off))


def test_pointer_blocks_and_deactivate_all(rng):
    x = qd.field(qd.f32)
    v = qd.Vector.field(2, qd.f32)
    block = qd.root.pointer(qd.ij, (N // B, N // B))
    block.dense(qd.ij, (B, B)).place(x, v)
    count = qd.field(qd.i32, shape=())

    @qd.kernel
    def scatter(pts: qd.types.ndarray(), vals: qd.types.ndarray()):
        for p in range(pts.shape[0]):
            x[pts[p, 0], pts[p, 1]] += vals[p]

    @qd.kernel
    def visit():
        for i, j in x:
            count[None] += 1
            v[i, j] = qd.Vector([i, j])

    pts = rng.integers(0, N, (7, 2)).astype(np.int32)
    vals = rng.uniform(1, 2, 7).astype(np.float32)
    scatter(pts, vals)
    expect = np.zeros((N, N), np.float32)
    np.add.at(expect, (pts[:, 0], pts[:, 1]), vals)
    np.testing.assert_allclose(x.to_numpy(), expect, rtol=1e-6)
    blocks = {(i // B, j // B) for i, j in pts}
    visit()
    assert count[None] == len(blocks) * B * B     # every cell of an active block
    touched = np.zeros((N, N), bool)
    for bi, bj in blocks:
        touched[bi * B:(bi + 1) * B, bj * B:(bj + 1) * B] = True
    ii, jj = np.meshgrid(np.arange(N), np.arange(N), indexing="ij")
    np.testing.assert_array_equal(v.to_numpy(), np.stack([ii, jj], -1) * touched[..., None])
    block.deactivate_all()
    count[None] = 0
    visit()
    assert count[None] == 0
    assert not x.to_numpy().any() and not v.to_numpy().any()


def test_python_scope_store_activates_and_root_deactivate_all(rng):
    x = qd.field(qd.i32)
    qd.root.dense(qd.i, 3).bitmasked(qd.j, N).place(x)
    seen = qd.field(qd.i32, shape=(3, N))

    @qd.kernel
    def visit():
        for i, j in x:
            seen[i, j] = x[i, j]

    cells = {(int(rng.integers(3)), int(rng.integers(N))) for _ in range(6)}
    expect = np.zeros((3, N), np.int32)
    for i, j in cells:
        x[i, j] = 5 + i * N + j
        expect[i, j] = 5 + i * N + j
    visit()
    np.testing.assert_array_equal(seen.to_numpy(), expect)
    qd.root.deactivate_all()
    seen.fill(0)
    visit()
    assert not seen.to_numpy().any()


def test_dynamic_concurrent_appends(rng):
    L, CAP = 5, 64
    x = qd.field(qd.i32)
    lists = qd.root.dense(qd.i, L).dynamic(qd.j, CAP)
    lists.place(x)
    lengths = qd.field(qd.i32, shape=L)
    sums = qd.field(qd.i32, shape=L)

    @qd.kernel
    def push(which: qd.types.ndarray(), vals: qd.types.ndarray()):
        for p in range(which.shape[0]):
            qd.append(lists, which[p], vals[p])

    @qd.kernel
    def stats():
        for i in range(L):
            lengths[i] = qd.length(lists, i)
        for i, j in x:
            sums[i] += x[i, j]

    which = rng.integers(0, L, 150).astype(np.int32)
    vals = rng.integers(1, 1000, 150).astype(np.int32)
    push(which, vals)
    stats()
    counts = np.bincount(which, minlength=L)
    np.testing.assert_array_equal(lengths.to_numpy(), counts)
    np.testing.assert_array_equal(sums.to_numpy(), np.bincount(which, vals, minlength=L).astype(np.int32))
    data = x.to_numpy()
    for i in range(L):   # order-independent: each list holds its values, in some order
        np.testing.assert_array_equal(np.sort(data[i, :counts[i]]), np.sort(vals[which == i]))
        assert not data[i, counts[i]:].any()
    x.parent().deactivate_all()
    sums.fill(0)
    stats()
    assert not lengths.to_numpy().any() and not sums.to_numpy().any()


def test_dynamic_store_grows_length(rng):
    x = qd.field(qd.f32)
    qd.root.dynamic(qd.i, 32).place(x)
    n = qd.field(qd.i32, shape=())

    @qd.kernel
    def store(k: qd.i32, val: qd.f32):
        x[k] = val

    @qd.kernel
    def get():
        n[None] = qd.length(x.parent(), [])

    k = int(rng.integers(3, 20))
    store(k, 1.5)
    store(1, 2.5)
    get()
    assert n[None] == k + 1


def test_sparse_calls_errors():
    x = qd.field(qd.f32)
    node = qd.root.bitmasked(qd.i, 4)
    node.place(x)
    with pytest.raises(QuadrantsSyntaxError, match="inside kernels"):
        qd.is_active(node, 0)

    @qd.kernel
    def wrong():
        qd.append(node, 0, 1.0)

    with pytest.raises(QuadrantsSyntaxError, match="dynamic SNode"):
        wrong()


def test_grouped_struct_for_with_offset(rng):
    x = qd.field(qd.f32)
    node = qd.root.bitmasked(qd.ij, (6, 6))
    node.place(x, offset=(-2, 3))
    flags = qd.field(qd.i32, shape=(6, 6))

    @qd.kernel
    def write(pts: qd.types.ndarray(), vals: qd.types.ndarray()):
        for p in range(pts.shape[0]):
            x[pts[p, 0] - 2, pts[p, 1] + 3] = vals[p]

    @qd.kernel
    def bump():
        for idx in qd.grouped(x):
            x[idx] += 10.0
        for i, j in qd.ndrange(6, 6):
            flags[i, j] = qd.is_active(node, [i, j])

    cells = rng.choice(36, 5, replace=False)
    pts = np.stack([cells // 6, cells % 6], -1).astype(np.int32)
    vals = rng.uniform(1, 2, 5).astype(np.float32)
    write(pts, vals)
    bump()
    active = np.zeros((6, 6), np.int32)
    active[pts[:, 0], pts[:, 1]] = 1
    expect = np.zeros((6, 6), np.float32)
    expect[pts[:, 0], pts[:, 1]] = vals + 10
    np.testing.assert_array_equal(flags.to_numpy(), active)
    np.testing.assert_allclose(x.to_numpy(), expect, rtol=1e-6)
    assert x[pts[0, 0] - 2, pts[0, 1] + 3] == pytest.approx(vals[0] + 10)


def test_gradient_over_active_cells(rng):
    y = qd.field(qd.f32, needs_grad=True)
    qd.root.bitmasked(qd.i, N).place(y)
    qd.root.lazy_grad()
    loss = qd.field(qd.f32, shape=(), needs_grad=True)

    @qd.kernel
    def f():
        for i in y:
            loss[None] += y[i] * y[i]

    cells = sorted({int(c) for c in rng.integers(0, N, 4)})
    vals = rng.uniform(-2, 2, len(cells)).astype(np.float32)
    for c, v in zip(cells, vals):
        y[c] = v
    with qd.ad.Tape(loss):
        f()
    expect = np.zeros(N, np.float32)
    expect[cells] = 2 * vals
    np.testing.assert_allclose(y.grad.to_numpy(), expect, rtol=1e-6)
    np.testing.assert_allclose(loss[None], (vals * vals).sum(), rtol=1e-5)


def test_dynamic_append_past_capacity_is_dropped(rng):
    x = qd.field(qd.i32)
    lists = qd.root.dense(qd.i, 3).dynamic(qd.j, 8)
    lists.place(x)
    n = qd.field(qd.i32, shape=3)

    @qd.kernel
    def push(vals: qd.types.ndarray()):
        for p in range(vals.shape[0]):
            qd.append(lists, 1, vals[p])
        for i in range(3):
            n[i] = qd.length(lists, i)

    vals = rng.choice(1000, 20, replace=False).astype(np.int32) + 1
    push(vals)
    np.testing.assert_array_equal(n.to_numpy(), [0, 8, 0])
    data = x.to_numpy()
    assert set(data[1]) <= set(vals) and len(set(data[1])) == 8   # 8 of the appended values
    assert not data[0].any() and not data[2].any()                 # the neighbours untouched


def test_deactivate_zero_fills_a_block(rng):
    x = qd.field(qd.f32)
    v = qd.Vector.field(2, qd.i32)
    block = qd.root.pointer(qd.i, N // B)
    block.dense(qd.ij, (B, 3)).place(x, v)
    count = qd.field(qd.i32, shape=())

    @qd.kernel
    def fill(vals: qd.types.ndarray()):
        for i, j in qd.ndrange(N, 3):
            x[i, j] = vals[i, j]
            v[i, j] = qd.Vector([i, j + 1])

    @qd.kernel
    def drop(b: qd.i32):
        qd.deactivate(block, b)

    @qd.kernel
    def visit():
        for _i, _j in x:
            count[None] += 1

    vals = rng.uniform(1, 2, (N, 3)).astype(np.float32)
    fill(vals)
    b = int(rng.integers(N // B))
    drop(b)
    visit()
    assert count[None] == (N // B - 1) * B * 3
    keep = np.ones(N, bool)
    keep[b * B:(b + 1) * B] = False
    np.testing.assert_array_equal(x.to_numpy(), vals * keep[:, None])
    ii, jj = np.meshgrid(np.arange(N), np.arange(3), indexing="ij")
    np.testing.assert_array_equal(v.to_numpy(), np.stack([ii, jj + 1], -1) * keep[:, None, None])


def test_from_numpy_and_fill_activate_every_cell(rng):
    x = qd.field(qd.f32)
    node = qd.root.bitmasked(qd.i, N)
    node.place(x)
    d = qd.field(qd.i32)
    qd.root.dense(qd.i, 2).dynamic(qd.j, 5).place(d)
    count = qd.field(qd.i32, shape=2)

    @qd.kernel
    def visit():
        for _i in x:
            count[0] += 1
        for _i, _j in d:
            count[1] += 1

    X = rng.uniform(1, 2, N).astype(np.float32)
    x.from_numpy(X)
    D = rng.integers(1, 9, (2, 5)).astype(np.int32)
    d.from_numpy(D)
    visit()
    np.testing.assert_array_equal(count.to_numpy(), [N, 2 * 5])
    np.testing.assert_array_equal(x.to_numpy(), X)
    np.testing.assert_array_equal(d.to_numpy(), D)
    node.deactivate_all()
    count.fill(0)
    visit()
    np.testing.assert_array_equal(count.to_numpy(), [0, 10])


def test_fill_writes_active_cells_only(rng):
    x = qd.field(qd.f32)
    qd.root.bitmasked(qd.i, N).place(x)
    d = qd.field(qd.i32)
    lists = qd.root.dense(qd.i, 3).dynamic(qd.j, 6)
    lists.place(d)

    @qd.kernel
    def grow(which: qd.types.ndarray()):
        for p in range(which.shape[0]):
            qd.append(lists, which[p], 1)

    active = rng.random(N) < 0.5
    for i in np.flatnonzero(active):
        x[i] = 1.0
    x.fill(7.0)
    np.testing.assert_array_equal(x.to_numpy(), 7.0 * active)
    which = rng.integers(0, 3, 8).astype(np.int32)
    grow(which)
    d.fill(4)
    lengths = np.minimum(np.bincount(which, minlength=3), 6)
    np.testing.assert_array_equal(d.to_numpy(), 4 * (np.arange(6)[None, :] < lengths[:, None]))


@pytest.mark.parametrize("kind", ["bitmasked", "pointer"])
def test_gradient_through_stores_below_a_sparse_node(kind, rng):
    y, z = qd.field(qd.f32, needs_grad=True), qd.field(qd.f32, needs_grad=True)
    getattr(qd.root, kind)(qd.i, N).place(y, z)
    qd.root.lazy_grad()
    loss = qd.field(qd.f32, shape=(), needs_grad=True)

    @qd.kernel
    def scale():
        for i in y:
            z[i] = y[i] * 3.0

    @qd.kernel
    def total():
        for i in z:
            loss[None] += z[i] * z[i]

    cells = sorted({int(c) for c in rng.integers(0, N, 4)})
    vals = rng.uniform(-2, 2, len(cells)).astype(np.float32)
    for c, v in zip(cells, vals):
        y[c] = v
    with qd.ad.Tape(loss):
        scale()
        total()
    expect = np.zeros(N, np.float32)
    expect[cells] = 18 * vals
    np.testing.assert_allclose(y.grad.to_numpy(), expect, rtol=1e-5)
    np.testing.assert_allclose(z.to_numpy()[cells], 3 * vals, rtol=1e-6)
    np.testing.assert_allclose(loss[None], 9 * (vals * vals).sum(), rtol=1e-5)


def _layout(kind, x, y):
    """``x`` and ``y`` under a node of ``kind`` over 4 x 4 blocks of a (N, N) grid (N = 12)."""
    if kind == "dense":
        qd.root.dense(qd.ij, N // B).dense(qd.ij, B).place(x, y)
        return None
    node = getattr(qd.root, kind)(qd.ij, N // B)
    node.dense(qd.ij, B).place(x, y)
    return node


@pytest.mark.parametrize("kind", ["bitmasked", "pointer"])
def test_struct_for_walks_the_list_of_active_blocks(kind, rng):
    # rounds of random activation and deactivation: the struct-for visits each element of the
    # active blocks once, and the node lists each block once however often it was re-activated
    x, y = qd.field(qd.i32), qd.field(qd.i32)
    node = _layout(kind, x, y)
    visits = qd.field(qd.i32, shape=(N, N))

    @qd.kernel
    def change(on: qd.types.ndarray(), off: qd.types.ndarray()):
        for bi, bj in qd.ndrange(N // B, N // B):
            if on[bi, bj]:
                x[bi * B + 1, bj * B + 2] = bi * 10 + bj + 1
            if off[bi, bj]:
                qd.deactivate(node, [bi, bj])

    @qd.kernel
    def visit():
        for i, j in y:
            visits[i, j] += 1
            y[i, j] = x[i, j] + 1

    active = np.zeros((N // B, N // B), bool)
    ever = np.zeros_like(active)
    for _ in range(4):
        on, off = rng.random(active.shape) < 0.3, rng.random(active.shape) < 0.3
        change(on.astype(np.int32), off.astype(np.int32))
        active = (active | on) & ~off
        ever |= on
        visits.fill(0)
        visit()
        cells = np.kron(active, np.ones((B, B), bool))
        np.testing.assert_array_equal(visits.to_numpy(), cells.astype(np.int32))
        assert node._count[None] == ever.sum()       # listed once per block ever activated
    xs = np.zeros((N, N), np.int32)
    bi, bj = np.nonzero(active)
    xs[bi * B + 1, bj * B + 2] = bi * 10 + bj + 1
    np.testing.assert_array_equal(x.to_numpy(), xs * np.kron(active, np.ones((B, B), np.int32)))
    np.testing.assert_array_equal(y.to_numpy(), (xs + 1) * np.kron(active, np.ones((B, B), np.int32)))
    node.deactivate_all()
    assert node._count[None] == 0
    visits.fill(0)
    visit()
    assert not visits.to_numpy().any()


@pytest.mark.parametrize("kind", ["dense", "bitmasked", "pointer"])
def test_same_program_on_dense_and_sparse_layouts(kind, rng):
    # scatter, a struct-for stencil that reads neighbours (inactive ones read 0) and a reduction:
    # the same numbers on every layout (a dense layout's struct-for visits zeros too)
    x, y = qd.field(qd.f32), qd.field(qd.f32)
    _layout(kind, x, y)
    total = qd.field(qd.f32, shape=())

    @qd.kernel
    def scatter(pts: qd.types.ndarray(), vals: qd.types.ndarray()):
        for p in range(pts.shape[0]):
            x[pts[p, 0], pts[p, 1]] += vals[p]

    @qd.kernel
    def stencil():
        for i, j in x:
            s = x[i, j] * 2.0
            if i > 0:
                s += x[i - 1, j]
            if j + 1 < N:
                s += x[i, j + 1]
            y[i, j] = s
        for I in qd.grouped(y):  # noqa: E741
            total[None] += y[I]

    pts = rng.integers(0, N, (9, 2)).astype(np.int32)
    vals = rng.uniform(1, 2, 9).astype(np.float32)
    scatter(pts, vals)
    stencil()
    xs = np.zeros((N, N), np.float32)
    np.add.at(xs, (pts[:, 0], pts[:, 1]), vals)
    ys = 2 * xs
    ys[1:, :] += xs[:-1, :]
    ys[:, :-1] += xs[:, 1:]
    if kind != "dense":   # y is stored in the active blocks only
        blocks = np.zeros((N // B, N // B), bool)
        blocks[pts[:, 0] // B, pts[:, 1] // B] = True
        ys *= np.kron(blocks, np.ones((B, B), bool))
    np.testing.assert_allclose(x.to_numpy(), xs, rtol=1e-6)
    np.testing.assert_allclose(y.to_numpy(), ys, rtol=1e-5)
    np.testing.assert_allclose(total[None], ys.sum(), rtol=1e-5)


def test_nested_deactivation_keeps_the_inner_list_consistent(rng):
    # deactivating a pointer cell deactivates the bitmasked cells below it; writing there again
    # activates them again, and the struct-for still visits each active cell once
    x = qd.field(qd.i32)
    outer = qd.root.pointer(qd.i, N // B)
    inner = outer.bitmasked(qd.i, B)
    inner.place(x)
    visits = qd.field(qd.i32, shape=N)

    @qd.kernel
    def write(on: qd.types.ndarray()):
        for i in range(N):
            if on[i]:
                x[i] = i + 1

    @qd.kernel
    def drop(off: qd.types.ndarray()):
        for b in range(N // B):
            if off[b]:
                qd.deactivate(outer, b)

    @qd.kernel
    def visit():
        for i in x:
            visits[i] += 1

    first = rng.random(N) < 0.5
    write(first.astype(np.int32))
    off = rng.random(N // B) < 0.5
    drop(off.astype(np.int32))
    alive = first & ~np.repeat(off, B)
    second = rng.random(N) < 0.5
    write(second.astype(np.int32))
    alive |= second
    visit()
    np.testing.assert_array_equal(visits.to_numpy(), alive.astype(np.int32))
    np.testing.assert_array_equal(x.to_numpy(), (np.arange(N) + 1) * alive)


def test_struct_for_over_snodes_is_active_on_parents_and_rescale_index(rng):
    x = qd.field(qd.i32)
    blocks = qd.root.pointer(qd.ij, N // B)
    cells = blocks.bitmasked(qd.ij, B)
    cells.place(x)
    d = qd.root.dense(qd.i, 5)
    w = qd.field(qd.i32)
    d.place(w)
    block_seen = qd.field(qd.i32, shape=(N // B, N // B))
    cell_seen = qd.field(qd.i32, shape=(N, N))
    parent_active = qd.field(qd.i32, shape=(N // B, N // B))
    coarse = qd.field(qd.i32, shape=(N, N, 2))

    @qd.kernel
    def write(pts: qd.types.ndarray()):
        for p in range(pts.shape[0]):
            x[pts[p, 0], pts[p, 1]] = 1

    @qd.kernel
    def visit():
        for I in qd.grouped(blocks):  # noqa: E741
            block_seen[I] += 1
        for i, j in x.parent():
            cell_seen[i, j] += 1
        for bi, bj in qd.ndrange(N // B, N // B):
            parent_active[bi, bj] = qd.is_active(x.snode.parent(2), [bi, bj])
        for I in qd.grouped(x):  # noqa: E741
            J = qd.rescale_index(x, blocks, I)
            coarse[I, 0] = J[0]
            coarse[I, 1] = J[1]
        for k in d:
            w[k] = k * 3

    pts = rng.integers(0, N, (6, 2)).astype(np.int32)
    write(pts)
    visit()
    on = np.zeros((N, N), np.int32)
    on[pts[:, 0], pts[:, 1]] = 1
    on_blocks = on.reshape(N // B, B, N // B, B).max(axis=(1, 3))
    np.testing.assert_array_equal(block_seen.to_numpy(), on_blocks)
    np.testing.assert_array_equal(parent_active.to_numpy(), on_blocks)
    np.testing.assert_array_equal(cell_seen.to_numpy(), on)
    ii, jj = np.nonzero(on)
    np.testing.assert_array_equal(coarse.to_numpy()[ii, jj], np.stack([ii // B, jj // B], -1))
    np.testing.assert_array_equal(w.to_numpy(), np.arange(5) * 3)


def test_struct_field_declared_without_shape_is_placed_later(rng):
    s = qd.Struct.field({"a": qd.f32, "v": qd.types.vector(2, qd.f32)})
    assert s.shape is None
    qd.root.bitmasked(qd.i, N).place(s)
    assert s.shape == (N,)
    out = qd.field(qd.f32, shape=N)

    @qd.kernel
    def write(vals: qd.types.ndarray()):
        for i in range(N):
            if vals[i] > 0.5:
                s[i].a = vals[i]
                s[i].v = qd.Vector([vals[i], 2 * vals[i]])

    @qd.kernel
    def visit():
        for i in s.a:
            out[i] = s[i].a + s[i].v[1]

    vals = rng.random(N).astype(np.float32)
    write(vals)
    visit()
    keep = vals > 0.5
    np.testing.assert_allclose(out.to_numpy(), 3 * vals * keep, rtol=1e-6)
    np.testing.assert_allclose(s.v.to_numpy()[:, 0], vals * keep, rtol=1e-6)


def test_pointer_memory_is_proportional_to_active_blocks(rng):
    # a pool of 10% of the blocks: activating 8 of 256 blocks takes 8 blocks of it (by the list's
    # counter); the tree's bytes are the dense part (slots, states) plus the pool, far below a dense
    # grid; activating more blocks than the pool has is an error naming the field
    from qd_numba import config
    from qd_numba.snode import blocks_in_use

    arch = config.current.arch
    qd.init(arch=arch, pointer_pool_fraction=0.1)
    try:
        x = qd.field(qd.f32, name="density")
        node = qd.root.pointer(qd.ij, 16)
        node.dense(qd.ij, 8).place(x)
        total = qd.field(qd.f32, shape=())

        @qd.kernel
        def scatter(pts: qd.types.ndarray(), vals: qd.types.ndarray()):
            for p in range(pts.shape[0]):
                x[pts[p, 0], pts[p, 1]] += vals[p]

        @qd.kernel
        def add_up():
            for i, j in x:
                total[None] += x[i, j]

        blocks = rng.choice(256, 8, replace=False)
        pts = np.stack([blocks // 16 * 8 + rng.integers(0, 8, 8), blocks % 16 * 8 + rng.integers(0, 8, 8)], -1)
        pts = np.concatenate([pts, pts]).astype(np.int32)      # two stores per block
        vals = rng.uniform(1, 2, 16).astype(np.float32)
        scatter(pts, vals)
        add_up()
        expect = np.zeros((128, 128), np.float32)
        np.add.at(expect, (pts[:, 0], pts[:, 1]), vals)
        np.testing.assert_allclose(x.to_numpy(), expect, rtol=1e-6)
        np.testing.assert_allclose(total[None], expect.sum(), rtol=1e-5)
        assert node._count[None] == 8 and node._capacity == 26
        assert blocks_in_use(node) == 8                  # the allocator's counter
        block_bytes = 8 * 8 * 4
        assert x._arr.shape[0] == 26 + 2
        dense_part = 16 * 16 * 4 * 2                    # a state and a slot per cell
        assert x._tree.base.nbytes <= dense_part + 28 * block_bytes + 16
        assert x._tree.base.nbytes < 128 * 128 * 4 // 4
        x[3, 3] = 5.0                                    # python scope takes a block too
        assert x[3, 3] == 5.0 and x[100, 100] == pytest.approx(expect[100, 100])
        many = np.stack(np.meshgrid(np.arange(0, 128, 8), np.arange(0, 128, 8), indexing="ij"), -1)
        many = many.reshape(-1, 2).astype(np.int32)[:40]
        scatter(many, np.ones(40, np.float32))
        with pytest.raises(QuadrantsRuntimeError, match="density.*pointer_pool_fraction"):
            x.to_numpy()
    finally:
        qd.init(arch=arch)


@pytest.mark.parametrize("kind", ["bitmasked", "pointer"])
def test_many_threads_activate_the_same_blocks(kind, rng):
    # 20000 atomic adds into 12 random blocks of 64 at once: every block is listed (and, for a
    # pointer, given a block of the pool) exactly once, and no add is lost
    x = qd.field(qd.f32)
    node = getattr(qd.root, kind)(qd.ij, 8)
    node.dense(qd.ij, 4).place(x)

    @qd.kernel
    def scatter(pts: qd.types.ndarray(), vals: qd.types.ndarray()):
        for p in range(pts.shape[0]):
            qd.atomic_add(x[pts[p, 0], pts[p, 1]], vals[p])

    blocks = rng.choice(64, 12, replace=False)
    which = rng.integers(0, 12, 20000)
    pts = np.stack([blocks[which] // 8 * 4 + rng.integers(0, 4, 20000),
                    blocks[which] % 8 * 4 + rng.integers(0, 4, 20000)], -1).astype(np.int32)
    vals = rng.integers(1, 4, 20000).astype(np.float32)
    scatter(pts, vals)
    expect = np.zeros((32, 32), np.float32)
    np.add.at(expect, (pts[:, 0], pts[:, 1]), vals)
    np.testing.assert_array_equal(x.to_numpy(), expect)
    assert node._count[None] == 12
    assert sorted(node._cells.to_numpy()[:12]) == sorted(blocks)
    if kind == "pointer":
        assert sorted(node._slots.to_numpy()[node._slots.to_numpy() > 0]) == list(range(1, 13))


def test_pointer_python_scope_in_a_blocked_layout_with_offset(rng):
    # a pointer node between two dense levels of the same axes, fields with an offset: python-scope
    # stores take blocks, to_numpy gathers them in index order, from_numpy activates every cell
    # and keeps the other field's data, fill writes the active elements only
    x, y = qd.field(qd.f32), qd.Vector.field(2, qd.i32)
    outer = qd.root.dense(qd.i, 2)
    node = outer.pointer(qd.ij, (3, 2))
    node.dense(qd.ij, (2, 4)).place(x, y, offset=(-5, 3))     # shape (12, 8)
    total = qd.field(qd.f32, shape=())

    @qd.kernel
    def add_up():
        for i, j in x:
            total[None] += x[i, j] * (i + 10) + y[i, j][1]

    keep = np.zeros((12, 8), bool)
    xs = np.zeros((12, 8), np.float32)
    for _ in range(5):
        i, j = int(rng.integers(0, 12)), int(rng.integers(0, 8))
        v = float(rng.uniform(1, 2))
        x[i - 5, j + 3] = v
        xs[i, j] = v
        keep[i // 2 * 2:i // 2 * 2 + 2, j // 4 * 4:j // 4 * 4 + 4] = True
    np.testing.assert_allclose(x.to_numpy(), xs, rtol=1e-6)
    add_up()
    ii = np.arange(12)[:, None] - 5
    np.testing.assert_allclose(total[None], (xs * (ii + 10)).sum(), rtol=1e-5)
    assert node._count[None] == keep.reshape(6, 2, 2, 4).any(axis=(1, 3)).sum()
    y.fill(3)
    np.testing.assert_array_equal(y.to_numpy(), 3 * keep[..., None] * np.ones(2, np.int32))
    ys = rng.integers(0, 9, (12, 8, 2)).astype(np.int32)
    y.from_numpy(ys)
    np.testing.assert_array_equal(y.to_numpy(), ys)
    np.testing.assert_allclose(x.to_numpy(), xs, rtol=1e-6)           # x kept in its blocks
    assert node._count[None] == 12 and y[0 - 5, 7 + 3][1] == ys[0, 7, 1]
    node.deactivate_all()
    assert not x.to_numpy().any() and not y.to_numpy().any() and node._count[None] == 0


def _moving_blocks(rng, arch, cells, block, fraction, rounds, per_round, threads):
    """Rounds of one launch that deactivates the blocks of the last round and stores into new
    ones (disjoint, random), on a pointer grid whose pool holds ``fraction`` of its cells: the
    blocks given back are taken again (more blocks are activated in all than the pool has)."""
    from qd_numba.snode import blocks_in_use

    qd.init(arch=arch, pointer_pool_fraction=fraction)
    try:
        n = cells * block
        x = qd.field(qd.f32, name="moving")
        node = qd.root.pointer(qd.ij, cells)
        node.dense(qd.ij, block).place(x)
        total = qd.field(qd.f32, shape=())

        @qd.kernel
        def step(off: qd.types.ndarray(), pts: qd.types.ndarray(), vals: qd.types.ndarray()):
            for k in range(off.shape[0] + pts.shape[0]):
                if k < off.shape[0]:
                    qd.deactivate(node, [off[k, 0], off[k, 1]])
                else:
                    p = k - off.shape[0]
                    qd.atomic_add(x[pts[p, 0], pts[p, 1]], vals[p])

        @qd.kernel
        def add_up():
            for i, j in x:
                total[None] += x[i, j]

        expect = np.zeros((n, n), np.float32)
        live = np.zeros(0, np.int64)
        taken = 0
        for _ in range(rounds):
            new = rng.choice(np.setdiff1d(np.arange(cells * cells), live), per_round, replace=False)
            which = rng.integers(0, per_round, threads)
            pts = np.stack([new[which] // cells * block + rng.integers(0, block, threads),
                            new[which] % cells * block + rng.integers(0, block, threads)], -1).astype(np.int32)
            vals = rng.integers(1, 4, threads).astype(np.float32)
            off = np.stack([live // cells, live % cells], -1).astype(np.int32).reshape(-1, 2)
            step(off, pts, vals)
            for c in live:
                expect[c // cells * block:(c // cells + 1) * block, c % cells * block:(c % cells + 1) * block] = 0
            np.add.at(expect, (pts[:, 0], pts[:, 1]), vals)
            live, taken = new, taken + per_round
            np.testing.assert_array_equal(x.to_numpy(), expect)
            assert blocks_in_use(node) == per_round
        assert taken > node._capacity
        total[None] = 0.0
        add_up()
        assert total[None] == expect.sum()
        slots = node._slots.to_numpy()
        assert sorted(slots[slots > 0]) == sorted(set(slots[slots > 0])) and (slots > 0).sum() == per_round
    finally:
        qd.init(arch=arch)


def test_pointer_blocks_are_given_back_on_deactivate(rng):
    # a pool of 16 blocks; 7 rounds each deactivate the last 6 blocks and activate 6 new ones in
    # the same launch (42 blocks activated in all): in use is always 6, values as numpy's
    from qd_numba import config

    _moving_blocks(rng, config.current.arch, 8, 4, 0.25, 7, 6, 300)


@pytest.mark.cuda
def test_pointer_blocks_are_given_back_under_many_gpu_threads(rng):
    # the same on the GPU: 100000 threads per launch store into 200 blocks while 200 others are
    # deactivated; a pool of 410 blocks of 4096 (the ring's takes and gives race)
    _moving_blocks(rng, "cuda", 64, 8, 0.1, 12, 200, 100000)


def test_bitmasked_below_a_pointer_uses_the_pointer_list(rng):
    # a bitmasked node below a pointer node: its states live in the pointer's blocks; deactivating
    # a pointer cell gives its block back with the states cleared, so a block taken again by
    # another cell starts with every inner cell inactive
    from qd_numba.snode import blocks_in_use

    x = qd.field(qd.i32)
    outer = qd.root.pointer(qd.i, N // B)
    inner = outer.bitmasked(qd.i, B)
    inner.place(x)
    visits = qd.field(qd.i32, shape=N)

    @qd.kernel
    def write(on: qd.types.ndarray()):
        for i in range(N):
            if on[i]:
                x[i] = i + 1

    @qd.kernel
    def drop(off: qd.types.ndarray()):
        for b in range(N // B):
            if off[b]:
                qd.deactivate(outer, b)

    @qd.kernel
    def visit():
        for i in x:
            visits[i] += 1

    alive = np.zeros(N, bool)
    for _ in range(4):
        on = rng.random(N) < 0.3
        write(on.astype(np.int32))
        alive |= on
        off = rng.random(N // B) < 0.5
        drop(off.astype(np.int32))
        alive &= ~np.repeat(off, B)
    assert inner._cells is None
    visits.fill(0)
    visit()
    np.testing.assert_array_equal(visits.to_numpy(), alive.astype(np.int32))
    np.testing.assert_array_equal(x.to_numpy(), (np.arange(N) + 1) * alive)
    assert blocks_in_use(outer) == alive.reshape(-1, B).any(axis=1).sum()


def test_offline_cache_tells_a_sparse_field_from_a_dense_one(tmp_path, rng):
    # one kernel source over a dense tree, then over bitmasked and pointer trees of the same layout:
    # the disk cache entry of the dense kernel is not reused for the sparse ones (their struct-fors
    # visit active cells only, their stores activate)
    from qd_numba import config

    arch = config.current.arch
    results = {}
    pts = rng.integers(0, 16, (3, 2)).astype(np.int32)
    for kind in ("dense", "bitmasked", "pointer"):
        qd.init(arch=arch, offline_cache=True, offline_cache_file_path=str(tmp_path / "qdcache"))
        try:
            x = qd.field(qd.f32)
            getattr(qd.root, kind)(qd.ij, 4).dense(qd.ij, 4).place(x)

            @qd.kernel
            def touch(p: qd.types.ndarray()):
                for k in range(p.shape[0]):
                    x[p[k, 0], p[k, 1]] = 1.0

            @qd.kernel
            def step():
                for i, j in x:
                    x[i, j] += 2.0

            touch(pts)
            step()
            results[kind] = x.to_numpy()
        finally:
            qd.init(arch=arch)
    expect = np.zeros((16, 16), np.float32)
    expect[pts[:, 0], pts[:, 1]] = 1.0
    np.testing.assert_array_equal(results["dense"], expect + 2.0)
    blocks = np.zeros((4, 4), bool)
    blocks[pts[:, 0] // 4, pts[:, 1] // 4] = True
    for kind in ("bitmasked", "pointer"):
        np.testing.assert_array_equal(results[kind], (expect + 2.0) * np.kron(blocks, np.ones((4, 4), bool)))
