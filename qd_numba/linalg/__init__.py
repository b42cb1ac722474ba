"""``qd.linalg``: matrix-free Krylov solvers (matrixfree.py) and sparse matrices built in kernels,
solved with scipy.sparse (sparse_matrix.py, sparse_solver.py). docs/linalg.md describes both."""

from .matrixfree import LinearOperator, MatrixFreeBICGSTAB, MatrixFreeCG
from .sparse_matrix import SparseMatrix, SparseMatrixBuilder
from .sparse_solver import SparseSolver

__all__ = ["LinearOperator", "MatrixFreeCG", "MatrixFreeBICGSTAB", "SparseMatrix", "SparseMatrixBuilder",
           "SparseSolver"]
