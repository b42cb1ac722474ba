"""qd.linalg: matrix-free CG / BiCGSTAB against numpy solves, the sparse matrix builder filled in
kernels, SparseMatrix arithmetic and SparseSolver against numpy/scipy (docs/linalg.md)."""

from __future__ import annotations

import sys

import numpy as np
import pytest

import qd_numba as qd

NP = {qd.f32: np.float32, qd.f64: np.float64}


def _dense_operator(matrix: np.ndarray, shape: tuple, dtype):
    """A LinearOperator applying ``matrix`` to fields of ``shape`` (flattened in C order)."""
    a = qd.field(dtype, shape=matrix.shape)
    a.from_numpy(matrix.astype(NP[dtype]))
    n = matrix.shape[0]
    cols = shape[-1]

    if len(shape) == 1:
        @qd.kernel
        def matvec(v: qd.template(), out: qd.template()):
            for i in out:
                s = 0.0
                for k in range(n):
                    s += a[i, k] * v[k]
                out[i] = s
    else:
        @qd.kernel
        def matvec(v: qd.template(), out: qd.template()):
            for i, j in out:
                s = 0.0
                for k in range(n):
                    s += a[i * cols + j, k] * v[k // cols, k % cols]
                out[i, j] = s
    return qd.linalg.LinearOperator(matvec)


def _fields(rng, shape, dtype):
    b = qd.field(dtype, shape=shape)
    x = qd.field(dtype, shape=shape)
    b_np = rng.standard_normal(shape)
    b.from_numpy(b_np.astype(NP[dtype]))
    return b, x, b_np


@pytest.mark.parametrize("shape,dtype", [((24,), qd.f32), ((4, 6), qd.f64)])
def test_matrix_free_cg_solves_spd_system(rng, shape, dtype):
    n = int(np.prod(shape))
    m = rng.standard_normal((n, n))
    spd = m @ m.T + n * np.eye(n)
    b, x, b_np = _fields(rng, shape, dtype)
    x0 = rng.standard_normal(shape)   # a start that is not zero
    x.from_numpy(x0.astype(NP[dtype]))
    tol = 1e-3 if dtype == qd.f32 else 1e-9
    assert qd.linalg.MatrixFreeCG(_dense_operator(spd, shape, dtype), b, x, tol=tol, maxiter=200) is True
    expected = np.linalg.solve(spd, b_np.reshape(-1)).reshape(shape)
    np.testing.assert_allclose(x.to_numpy(), expected, rtol=0, atol=1e-4 if dtype == qd.f32 else 1e-9)
    assert np.linalg.norm(spd @ x.to_numpy().reshape(-1).astype(np.float64) - b_np.reshape(-1)) < 10 * tol


@pytest.mark.parametrize("shape,dtype", [((24,), qd.f64), ((4, 6), qd.f32)])
def test_matrix_free_bicgstab_solves_nonsymmetric_system(rng, shape, dtype):
    n = int(np.prod(shape))
    a = rng.standard_normal((n, n)) + 2 * np.sqrt(n) * np.eye(n)
    assert not np.allclose(a, a.T)
    b, x, b_np = _fields(rng, shape, dtype)
    tol = 1e-3 if dtype == qd.f32 else 1e-9
    assert qd.linalg.MatrixFreeBICGSTAB(_dense_operator(a, shape, dtype), b, x, tol=tol, maxiter=200) is True
    expected = np.linalg.solve(a, b_np.reshape(-1)).reshape(shape)
    np.testing.assert_allclose(x.to_numpy(), expected, rtol=0, atol=1e-4 if dtype == qd.f32 else 1e-9)


def test_matrix_free_solvers_report_failure_and_print_progress(rng, capsys):
    n = 24
    m = rng.standard_normal((n, n))
    spd = m @ m.T + np.eye(n)
    op = _dense_operator(spd, (n,), qd.f64)
    b, x, _ = _fields(rng, (n,), qd.f64)
    assert qd.linalg.MatrixFreeCG(op, b, x, tol=1e-12, maxiter=2, quiet=False) is False
    out = capsys.readouterr().out
    assert ">>> Initial residual" in out and "failed to converge in 2 iterations" in out
    x.fill(0)
    assert qd.linalg.MatrixFreeBICGSTAB(op, b, x, tol=1e-12, maxiter=1) is False


def test_matrix_free_solver_argument_errors():
    op = qd.linalg.LinearOperator(lambda v, out: None)
    with pytest.raises(qd.QuadrantsTypeError, match="Dtype mismatch"):
        qd.linalg.MatrixFreeCG(op, qd.field(qd.f32, shape=4), qd.field(qd.f64, shape=4))
    with pytest.raises(qd.QuadrantsRuntimeError, match="Dimension mismatch"):
        qd.linalg.MatrixFreeBICGSTAB(op, qd.field(qd.f32, shape=4), qd.field(qd.f32, shape=5))
    with pytest.raises(qd.QuadrantsTypeError, match="Not supported dtype"):
        qd.linalg.MatrixFreeCG(op, qd.field(qd.i32, shape=4), qd.field(qd.i32, shape=4))
    with pytest.raises(qd.QuadrantsRuntimeError, match="Dimension mismatch"):
        op.matvec(qd.field(qd.f32, shape=4), qd.field(qd.f32, shape=3))


# -- sparse matrices --------------------------------------------------------------------------------------

N_TRIPLETS = 40


@qd.kernel
def fill_triplets(A: qd.types.sparse_matrix_builder(), rows: qd.types.ndarray(), cols: qd.types.ndarray(),
                  vals: qd.types.ndarray()):
    for k in range(rows.shape[0]):
        if k % 3 == 0:
            A[rows[k], cols[k]] -= -vals[k]
        else:
            A[rows[k], cols[k]] += vals[k]


def _random_triplets(rng, n, m, count):
    rows = rng.integers(0, n, count).astype(np.int32)
    cols = rng.integers(0, m, count).astype(np.int32)
    rows[1], cols[1] = rows[0], cols[0]      # a duplicate: build() sums it
    return rows, cols, rng.standard_normal(count)


def _dense(rows, cols, vals, shape):
    out = np.zeros(shape)
    np.add.at(out, (rows, cols), vals)
    return out


@pytest.mark.parametrize("dtype", [qd.f32, qd.f64])
def test_builder_filled_in_a_kernel_builds_the_matrix(rng, dtype):
    pytest.importorskip("scipy")
    n, m = 7, 5
    builder = qd.linalg.SparseMatrixBuilder(n, m, max_num_triplets=N_TRIPLETS, dtype=dtype)
    rows, cols, vals = _random_triplets(rng, n, m, N_TRIPLETS)
    fill_triplets(builder, rows, cols, vals.astype(NP[dtype]))
    a = builder.build()
    assert a.shape == (n, m) and a.dtype == dtype and a.to_numpy().dtype == NP[dtype]
    expected = _dense(rows, cols, vals, (n, m))
    np.testing.assert_allclose(a.to_numpy(), expected, rtol=1e-5, atol=1e-5)
    # build() empties the builder: a second fill gives the second matrix only
    rows2, cols2, vals2 = _random_triplets(rng, n, m, N_TRIPLETS)
    fill_triplets(builder, rows2, cols2, vals2.astype(NP[dtype]))
    np.testing.assert_allclose(builder.build().to_numpy(), _dense(rows2, cols2, vals2, (n, m)), rtol=1e-5, atol=1e-5)


@qd.kernel
def fill_conditional(A: qd.types.sparse_matrix_builder(), v: qd.types.ndarray()):
    for i in range(v.shape[0]):
        A[i, 0] += v[i] if v[i] > 0 else -v[i]     # the value's branches split the update's blocks
        A[i, 1] -= 2.0 * v[i]
        A[0, 2] += 1.0                             # constant index


def test_builder_updates_with_conditional_values_and_constant_indices(rng):
    pytest.importorskip("scipy")
    v = rng.standard_normal(9)
    builder = qd.linalg.SparseMatrixBuilder(9, 3, max_num_triplets=27, dtype=qd.f64)
    fill_conditional(builder, v)
    expected = np.zeros((9, 3))
    expected[:, 0], expected[:, 1], expected[0, 2] = np.abs(v), -2 * v, 9.0
    np.testing.assert_allclose(builder.build().to_numpy(), expected)


def test_builder_overflow_and_misuse_are_our_errors(rng):
    pytest.importorskip("scipy")
    builder = qd.linalg.SparseMatrixBuilder(4, 4, max_num_triplets=3, dtype=qd.f64)
    rows, cols, vals = _random_triplets(rng, 4, 4, 6)
    fill_triplets(builder, rows, cols, vals)
    with pytest.raises(qd.QuadrantsRuntimeError, match="max_num_triplets=3"):
        builder.build()

    @qd.kernel
    def read_entry(A: qd.types.sparse_matrix_builder()) -> qd.f64:
        return A[0, 0]

    with pytest.raises(qd.QuadrantsSyntaxError, match=r"A\[i, j\] \+= v") as info:
        read_entry(builder)
    assert "read_entry" in str(info.value) and "return A[0, 0]" in str(info.value)

    @qd.kernel
    def assign_entry(A: qd.types.sparse_matrix_builder()):
        A[0, 0] = 1.0

    with pytest.raises(qd.QuadrantsSyntaxError, match=r"A\[i, j\] \+= v"):
        assign_entry(builder)
    with pytest.raises(qd.QuadrantsTypeError, match="argument 'A'.*takes a qd.linalg.SparseMatrixBuilder, got Field"):
        fill_conditional(qd.field(qd.f64, shape=3), np.ones(3))


def _matrix(rng, n, m, dtype):
    dense = np.where(rng.random((n, m)) < 0.4, rng.standard_normal((n, m)), 0.0).astype(NP[dtype])
    rows, cols = np.nonzero(dense)
    triplets = qd.ndarray(qd.f64, shape=(len(rows), 3))
    triplets.from_numpy(np.stack([rows, cols, dense[rows, cols]], axis=1).astype(np.float64))
    a = qd.linalg.SparseMatrix(n, m, dtype=dtype)
    a.build_from_ndarray(triplets)
    return a, dense.astype(np.float64)


def test_sparse_matrix_arithmetic_matches_numpy(rng):
    pytest.importorskip("scipy")
    a, da = _matrix(rng, 6, 6, qd.f64)
    b, db = _matrix(rng, 6, 6, qd.f64)
    np.testing.assert_allclose(a.to_numpy(), da)
    np.testing.assert_allclose((a + b).to_numpy(), da + db)
    np.testing.assert_allclose((a - b).to_numpy(), da - db)
    np.testing.assert_allclose((a * 2.5).to_numpy(), da * 2.5)
    np.testing.assert_allclose((0.5 * a).to_numpy(), da * 0.5)
    np.testing.assert_allclose((a * b).to_numpy(), da * db)
    np.testing.assert_allclose((a @ b).to_numpy(), da @ db)
    np.testing.assert_allclose(a.transpose().to_numpy(), da.T)
    v = rng.standard_normal(6)
    np.testing.assert_allclose(a @ v, da @ v)
    f = qd.field(qd.f64, shape=6)
    f.from_numpy(v)
    np.testing.assert_allclose(a @ f, da @ v)
    nd = qd.ndarray(qd.f64, shape=6)
    nd.from_numpy(v)
    out = a @ nd
    assert isinstance(out, qd.Ndarray)
    np.testing.assert_allclose(out.to_numpy(), da @ v)
    assert a[2, 3] == da[2, 3]
    a[2, 3] = 7.0
    assert a.to_numpy()[2, 3] == 7.0
    c = a + b
    c -= b
    np.testing.assert_allclose(c.to_numpy(), a.to_numpy())
    with pytest.raises(qd.QuadrantsRuntimeError, match="Dimension mismatch"):
        a + qd.linalg.SparseMatrix(6, 5, dtype=qd.f64)
    with pytest.raises(qd.QuadrantsRuntimeError, match="does not support"):
        a @ [1.0] * 6


def test_sparse_matrix_prints_rows():
    pytest.importorskip("scipy")
    a = qd.linalg.SparseMatrix(3, 3, dtype=qd.f32)
    a[0, 1] = 1.0
    a[2, 0] = 2.5
    assert str(a) == "[0, 1, 0]\n[0, 0, 0]\n[2.5, 0, 0]\n"


@pytest.mark.parametrize("solver_type", ["LLT", "LDLT", "LU"])
@pytest.mark.parametrize("dtype", [qd.f32, qd.f64])
def test_sparse_solver_matches_numpy(rng, solver_type, dtype):
    pytest.importorskip("scipy")
    n = 12
    builder = qd.linalg.SparseMatrixBuilder(n, n, max_num_triplets=3 * n, dtype=dtype)
    # a 1-D Laplacian plus a random positive diagonal: symmetric positive definite
    diag = rng.uniform(0.5, 2.0, n)
    rows = np.concatenate([np.arange(n), np.arange(1, n), np.arange(n - 1)]).astype(np.int32)
    cols = np.concatenate([np.arange(n), np.arange(n - 1), np.arange(1, n)]).astype(np.int32)
    vals = np.concatenate([2.0 + diag, -np.ones(n - 1), -np.ones(n - 1)])
    if solver_type == "LU":
        vals[n:2 * n - 1] = rng.uniform(-1, 0, n - 1)   # not symmetric
    fill_triplets(builder, rows, cols, vals.astype(NP[dtype]))
    a = builder.build()
    solver = qd.linalg.SparseSolver(dtype=dtype, solver_type=solver_type, ordering="AMD")
    solver.analyze_pattern(a)
    solver.factorize(a)
    assert solver.info()
    b = rng.standard_normal(n)
    x = solver.solve(b.astype(NP[dtype]))
    assert x.dtype == NP[dtype]
    tol = 1e-4 if dtype == qd.f32 else 1e-10
    np.testing.assert_allclose(x, np.linalg.solve(_dense(rows, cols, vals, (n, n)), b), rtol=tol, atol=tol)


def test_sparse_solver_reports_failures(rng):
    pytest.importorskip("scipy")
    indefinite = qd.linalg.SparseMatrix(3, 3, dtype=qd.f64)
    for i, v in enumerate([2.0, -1.0, 3.0]):
        indefinite[i, i] = v
    solver = qd.linalg.SparseSolver(dtype=qd.f64, solver_type="LLT", ordering="COLAMD")
    solver.compute(indefinite)
    assert not solver.info()
    ldlt = qd.linalg.SparseSolver(dtype=qd.f64, solver_type="LDLT")
    ldlt.compute(indefinite)
    assert ldlt.info()
    np.testing.assert_allclose(ldlt.solve(np.array([2.0, 1.0, 3.0])), [1.0, -1.0, 1.0])
    with pytest.raises(qd.QuadrantsRuntimeError, match="not supported"):
        qd.linalg.SparseSolver(solver_type="QR")
    with pytest.raises(qd.QuadrantsRuntimeError, match="not consistent"):
        qd.linalg.SparseSolver(dtype=qd.f32).compute(indefinite)
    with pytest.raises(qd.QuadrantsRuntimeError, match="call compute"):
        qd.linalg.SparseSolver(dtype=qd.f64).solve(np.ones(3))


def test_missing_scipy_is_our_error(monkeypatch):
    monkeypatch.setitem(sys.modules, "scipy", None)
    monkeypatch.setitem(sys.modules, "scipy.sparse", None)
    with pytest.raises(qd.QuadrantsRuntimeError, match=r"pip install 'qd_numba\[scipy\]'"):
        qd.linalg.SparseMatrix(3, 3)
    builder = qd.linalg.SparseMatrixBuilder(3, 3, max_num_triplets=4)
    with pytest.raises(qd.QuadrantsRuntimeError, match="need scipy"):
        builder.build()


@pytest.fixture
def on_cuda():
    qd.init(arch=qd.cuda)
    yield
    qd.init(arch=qd.cpu)


@pytest.mark.cuda
def test_builder_and_cg_on_the_gpu(rng, on_cuda):
    """Triplets added on the device, built on the host; CG's kernels on the device."""
    pytest.importorskip("scipy")
    n = 16
    builder = qd.linalg.SparseMatrixBuilder(n, n, max_num_triplets=N_TRIPLETS, dtype=qd.f32)
    rows, cols, vals = _random_triplets(rng, n, n, N_TRIPLETS)
    fill_triplets(builder, rows, cols, vals.astype(np.float32))
    np.testing.assert_allclose(builder.build().to_numpy(), _dense(rows, cols, vals, (n, n)), rtol=1e-5, atol=1e-5)
    m = rng.standard_normal((n, n))
    spd = m @ m.T + n * np.eye(n)
    b, x, b_np = _fields(rng, (n,), qd.f32)
    assert qd.linalg.MatrixFreeCG(_dense_operator(spd, (n,), qd.f32), b, x, tol=1e-4)
    np.testing.assert_allclose(x.to_numpy(), np.linalg.solve(spd, b_np), rtol=0, atol=1e-4)
