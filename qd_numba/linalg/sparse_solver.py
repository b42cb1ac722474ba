"""``qd.linalg.SparseSolver``: direct solves of a :class:`SparseMatrix` with scipy's SuperLU.

Quadrants factorizes with Eigen on the CPU (cuSOLVER on CUDA); here every backend factorizes on
the host:

* ``"LU"``: ``A = P L U Q`` of the matrix as given.
* ``"LLT"``, ``"LDLT"``: as Eigen's simplicial Cholesky solvers, the matrix is taken as symmetric
  and only its lower triangle is read; SuperLU factorizes that symmetric matrix with diagonal
  pivots. ``"LLT"`` fails (``info()`` is False) when the matrix is not positive definite (a pivot
  <= 0), both when a pivot is exactly zero.

``ordering``: ``"AMD"`` is SuperLU's minimum degree on ``A^T + A``, ``"COLAMD"`` its COLAMD.
"""

from __future__ import annotations

import numpy as np

from .. import dtypes
from ..dtypes import f32
from ..errors import QuadrantsRuntimeError
from ..field import Field, Ndarray, ndarray
from .sparse_matrix import SparseMatrix, scipy_sparse

_SOLVER_TYPES = ["LLT", "LDLT", "LU"]
_ORDERINGS = {"AMD": "MMD_AT_PLUS_A", "COLAMD": "COLAMD"}


class SparseSolver:
    """Direct solver of ``A x = b`` for a :class:`SparseMatrix` ``A``."""

    def __init__(self, dtype=f32, solver_type="LLT", ordering="AMD"):
        if solver_type not in _SOLVER_TYPES or ordering not in _ORDERINGS:
            raise QuadrantsRuntimeError(f"The solver type {solver_type} with {ordering} is not supported for now. "
                                        f"Only {_SOLVER_TYPES} with {list(_ORDERINGS)} are supported.")
        scipy_sparse()
        self.dtype = dtypes.to_numba(dtype)
        self.solver_type, self.ordering = solver_type, ordering
        self.matrix = None
        self._lu = None
        self._ok = False

    def _require(self, sparse_matrix) -> None:
        if not isinstance(sparse_matrix, SparseMatrix):
            raise QuadrantsRuntimeError(f"The parameter type: {type(sparse_matrix)} is not supported in linear "
                                        "solvers for now.")

    def compute(self, sparse_matrix: SparseMatrix) -> None:
        """``analyze_pattern`` then ``factorize``."""
        self.analyze_pattern(sparse_matrix)
        self.factorize(sparse_matrix)

    def analyze_pattern(self, sparse_matrix: SparseMatrix) -> None:
        """Checks the matrix; SuperLU chooses its fill-reducing ordering when it factorizes."""
        self._require(sparse_matrix)
        if sparse_matrix.dtype != self.dtype:
            raise QuadrantsRuntimeError(f"The SparseSolver's dtype {self.dtype} is not consistent with the "
                                        f"SparseMatrix's dtype {sparse_matrix.dtype}.")
        self.matrix = sparse_matrix

    def factorize(self, sparse_matrix: SparseMatrix) -> None:
        self._require(sparse_matrix)
        self.matrix = sparse_matrix
        sparse = scipy_sparse()
        from scipy.sparse.linalg import splu

        a = sparse_matrix.matrix
        symmetric = self.solver_type != "LU"
        if symmetric:
            a = sparse.tril(a) + sparse.tril(a, -1).T
        options = {"SymmetricMode": True} if symmetric else {}
        try:
            self._lu = splu(sparse.csc_matrix(a), permc_spec=_ORDERINGS[self.ordering],
                            diag_pivot_thresh=0.0 if symmetric else None, options=options)
        except RuntimeError:   # exactly singular
            self._lu, self._ok = None, False
            return
        pivots = self._lu.U.diagonal()
        self._ok = bool(np.all(np.isfinite(pivots)) and
                        (np.all(pivots > 0) if self.solver_type == "LLT" else np.all(pivots != 0)))

    def solve(self, b):
        """The solution ``x`` of ``A x = b``: a numpy array for a numpy array or field ``b``, a
        ``qd.ndarray`` for a ``qd.ndarray``. NaNs when the factorization failed (``info()``)."""
        if self.matrix is None:
            raise QuadrantsRuntimeError("Please call compute() before calling solve().")
        if not isinstance(b, (Field, Ndarray, np.ndarray)):
            raise QuadrantsRuntimeError(f"The parameter type: {type(b)} is not supported in linear solvers for now.")
        rhs = b if isinstance(b, np.ndarray) else b.to_numpy()
        np_dtype = dtypes.to_numpy(self.dtype)
        if self._lu is None:
            x = np.full(self.matrix.m, np.nan, dtype=np_dtype)
        else:
            x = self._lu.solve(rhs.astype(self._lu.U.dtype)).astype(np_dtype, copy=False)
        if isinstance(b, Ndarray):
            out = ndarray(b.dtype, shape=(self.matrix.m,))
            out.from_numpy(x.astype(dtypes.to_numpy(b.dtype)))
            return out
        return x

    def info(self) -> bool:
        """Whether the last factorization succeeded."""
        return self._ok
