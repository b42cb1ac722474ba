"""``qd.linalg.SparseMatrixBuilder`` and ``qd.linalg.SparseMatrix``.

A builder holds triplets ``(row, col, value)`` in fields on the device of the backend in force.
A kernel fills it through a ``qd.types.sparse_matrix_builder()`` parameter: ``A[i, j] += v``
appends ``(i, j, v)`` (``-=`` appends ``-v``) at a slot taken with an atomic counter
(passes/structs.py turns the statement into a call of :func:`_add_entry`). ``build()`` copies the
triplets to the host and sums duplicates into a ``scipy.sparse`` CSR matrix, the storage of
:class:`SparseMatrix`; the builder is then empty, ready to be filled again.

scipy is an optional dependency (``pip install 'qd_numba[scipy]'``): filling a builder needs
none, building or using a matrix raises our error naming it when it is missing.
"""

from __future__ import annotations

import numbers

import numpy as np

from .. import dtypes
from ..dtypes import f32
from ..errors import QuadrantsRuntimeError
from ..field import Field, Ndarray, field, ndarray
from ..frontend.objects import func
from ..lang import atomic_add


def scipy_sparse():
    """``scipy.sparse``, or our error saying what to install."""
    try:
        import scipy.sparse
    except ImportError:
        raise QuadrantsRuntimeError("qd.linalg sparse matrices and solvers need scipy: "
                                    "pip install 'qd_numba[scipy]' (or pip install scipy)") from None
    return scipy.sparse


@func
def _add_entry(builder, index, value):
    k = atomic_add(builder._count[None], 1)
    if k < builder._capacity:
        builder._rows[k] = index[0]
        builder._cols[k] = index[1]
        builder._vals[k] = value


@func
def _subtract_entry(builder, index, value):
    _add_entry(builder, index, -value)


class SparseMatrixBuilder:
    """Triplets of a ``num_rows`` x ``num_cols`` matrix, at most ``max_num_triplets`` of them,
    added in kernels (``A[i, j] += v`` on a ``qd.types.sparse_matrix_builder()`` parameter).
    ``storage_format`` is accepted for Quadrants' signature; the matrix is stored as CSR."""

    qd_subscript_updates = {"add": _add_entry, "sub": _subtract_entry}

    def __init__(self, num_rows=None, num_cols=None, max_num_triplets=0, dtype=f32, storage_format="col_major"):
        self.num_rows = num_rows
        self.num_cols = num_cols if num_cols else num_rows
        self.dtype = dtypes.to_numba(dtype)
        self._capacity = int(max_num_triplets)
        size = max(self._capacity, 1)   # a field needs a cell; the capacity guards every write
        self._rows = field(dtypes.i32, shape=size)
        self._cols = field(dtypes.i32, shape=size)
        self._vals = field(self.dtype, shape=size)
        self._count = field(dtypes.i32, shape=())

    def _triplets(self):
        count = int(self._count[None])
        if count > self._capacity:
            raise QuadrantsRuntimeError(f"SparseMatrixBuilder: {count} triplets were added, more than its "
                                        f"max_num_triplets={self._capacity}")
        return (self._rows.to_numpy()[:count], self._cols.to_numpy()[:count], self._vals.to_numpy()[:count])

    def print_triplets(self) -> None:
        """Print the triplets added so far."""
        rows, cols, vals = self._triplets()
        print(f"n={self.num_rows}, m={self.num_cols}, num_triplets={len(rows)} (max={self._capacity})")
        for i, j, v in zip(rows, cols, vals):
            print(f"({i}, {j}) val={v}")

    def build(self, dtype=f32, _format="CSR") -> SparseMatrix:
        """The matrix of the triplets (duplicates summed), in the builder's dtype; empties the builder."""
        sparse = scipy_sparse()
        rows, cols, vals = self._triplets()
        shape = (self.num_rows, self.num_cols)
        if len(rows) and (rows.min() < 0 or cols.min() < 0 or rows.max() >= shape[0] or cols.max() >= shape[1]):
            raise QuadrantsRuntimeError(f"SparseMatrixBuilder: a triplet lies outside the {shape[0]}x{shape[1]} matrix")
        matrix = sparse.coo_matrix((vals, (rows, cols)), shape=shape, dtype=vals.dtype).tocsr()
        matrix.sum_duplicates()
        self._count[None] = 0
        return SparseMatrix(sm=matrix, dtype=self.dtype)


def _np_dtype(dtype):
    return dtypes.to_numpy(dtypes.to_numba(dtype))


class SparseMatrix:
    """An ``n`` x ``m`` sparse matrix (a ``scipy.sparse`` CSR matrix underneath, ``sm`` when given)."""

    def __init__(self, n=None, m=None, sm=None, dtype=f32, storage_format="col_major"):
        sparse = scipy_sparse()
        self.dtype = dtypes.to_numba(dtype)
        if sm is None:
            self.n, self.m = n, (m if m else n)
            self.matrix = sparse.csr_matrix((self.n, self.m), dtype=_np_dtype(dtype))
        else:
            self.matrix = sparse.csr_matrix(sm)
            self.n, self.m = self.matrix.shape

    def _same(self, sm) -> SparseMatrix:
        return SparseMatrix(sm=sm, dtype=self.dtype)

    def _check_shape(self, other) -> None:
        if (self.n, self.m) != (other.n, other.m):
            raise QuadrantsRuntimeError(f"Dimension mismatch between sparse matrices ({self.n}, {self.m}) and "
                                        f"({other.n}, {other.m})")

    def __add__(self, other: SparseMatrix) -> SparseMatrix:
        self._check_shape(other)
        return self._same(self.matrix + other.matrix)

    def __sub__(self, other: SparseMatrix) -> SparseMatrix:
        self._check_shape(other)
        return self._same(self.matrix - other.matrix)

    def __iadd__(self, other: SparseMatrix) -> SparseMatrix:
        self._check_shape(other)
        self.matrix = (self.matrix + other.matrix).tocsr()
        return self

    def __isub__(self, other: SparseMatrix) -> SparseMatrix:
        self._check_shape(other)
        self.matrix = (self.matrix - other.matrix).tocsr()
        return self

    def __mul__(self, other):
        """A scalar multiple, or the element-wise (Hadamard) product with another sparse matrix."""
        if isinstance(other, SparseMatrix):
            self._check_shape(other)
            return self._same(self.matrix.multiply(other.matrix))
        if isinstance(other, numbers.Real):
            return self._same(self.matrix * other)
        return NotImplemented

    def __rmul__(self, other):
        if isinstance(other, numbers.Real):
            return self._same(self.matrix * other)
        return NotImplemented

    def transpose(self) -> SparseMatrix:
        return self._same(self.matrix.transpose())

    def __matmul__(self, other):
        """``A @ B`` (a SparseMatrix), ``A @ v`` with ``v`` a numpy array or a field (a numpy
        array back) or a ``qd.ndarray`` (a ``qd.ndarray`` back)."""
        if isinstance(other, SparseMatrix):
            if self.m != other.n:
                raise QuadrantsRuntimeError(f"Dimension mismatch between sparse matrices ({self.n}, {self.m}) and "
                                            f"({other.n}, {other.m})")
            return self._same(self.matrix @ other.matrix)
        if isinstance(other, (Field, Ndarray, np.ndarray)):
            vector = other if isinstance(other, np.ndarray) else other.to_numpy()
            if self.m != vector.shape[0]:
                raise QuadrantsRuntimeError(f"Dimension mismatch between sparse matrix ({self.n}, {self.m}) and "
                                            f"vector ({vector.shape})")
            result = (self.matrix @ vector).astype(self.matrix.dtype, copy=False)
            if isinstance(other, Ndarray):
                out = ndarray(other.dtype, shape=(self.n,))
                out.from_numpy(result.astype(_np_dtype(other.dtype)))
                return out
            return result
        raise QuadrantsRuntimeError(f"Sparse matrix-matrix/vector multiplication does not support {type(other)} "
                                    "for now. Supported types are SparseMatrix, qd.field, qd.ndarray and numpy "
                                    "ndarray.")

    def __getitem__(self, indices):
        return self.matrix[indices[0], indices[1]]

    def __setitem__(self, indices, value) -> None:
        lil = self.matrix.tolil()
        lil[indices[0], indices[1]] = value
        self.matrix = lil.tocsr()

    @property
    def shape(self) -> tuple:
        return (self.n, self.m)

    def to_numpy(self) -> np.ndarray:
        """The dense matrix."""
        return self.matrix.toarray()

    def __str__(self) -> str:
        return "".join("[" + ", ".join(f"{v:g}" for v in row) + "]\n" for row in self.matrix.toarray())

    __repr__ = __str__

    def build_from_ndarray(self, array) -> None:
        """Set the matrix to the triplets ``(row, col, value)`` read from a ``qd.ndarray`` (any
        shape; its scalars taken three at a time), duplicates summed."""
        if not isinstance(array, Ndarray):
            raise QuadrantsRuntimeError("Sparse matrix only supports building from "
                                        "[qd.ndarray, qd.Vector.ndarray, qd.Matrix.ndarray]")
        flat = array.to_numpy().reshape(-1)
        if flat.size % 3 != 0:
            raise QuadrantsRuntimeError("The number of ndarray elements must have a length that is divisible by 3.")
        triplets = flat.reshape(-1, 3)
        rows, cols = triplets[:, 0].astype(np.int64), triplets[:, 1].astype(np.int64)
        vals = triplets[:, 2].astype(_np_dtype(self.dtype))
        self.matrix = scipy_sparse().coo_matrix((vals, (rows, cols)), shape=(self.n, self.m)).tocsr()

    def mmwrite(self, filename) -> None:
        """Write the matrix to a Matrix Market file."""
        import scipy.io

        scipy.io.mmwrite(filename, self.matrix)
