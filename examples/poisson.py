"""Poisson's equation -lap(u) = f on the unit square (u = 0 on the boundary), on a qd.root.dense
grid, solved twice: by Jacobi iterations and by qd.linalg.MatrixFreeCG with the 5-point Laplacian
as a matrix-free operator. Both are checked against numpy's direct solve of the assembled system.

    python examples/poisson.py [--n 64]
    QD_ARCH=cuda python examples/poisson.py --n 256      # on an NVIDIA GPU

Prints each solver's residual and error and "OK"; exits non-zero when a check fails.
"""

import argparse
import sys
import time

import numpy as np

import qd_numba as qd


@qd.data_oriented
class PoissonGrid:
    """The interior unknowns of an n x n grid (spacing h = 1 / (n + 1)), placed in one dense SNode."""

    def __init__(self, n: int):
        self.n = n
        self.h2 = 1.0 / (n + 1) ** 2
        self.u = qd.field(qd.f64)       # Jacobi's iterate
        self.u_new = qd.field(qd.f64)
        self.f = qd.field(qd.f64)       # the right-hand side, h^2 f
        self.x = qd.field(qd.f64)       # CG's unknown
        qd.root.dense(qd.ij, (n, n)).place(self.u, self.u_new, self.f, self.x)
        self.residual = qd.field(qd.f64, shape=())

    @qd.func
    def neighbours(self, v: qd.template(), i, j):
        """The sum of the 4 neighbours of (i, j), 0 outside the grid (the Dirichlet boundary)."""
        s = 0.0
        if i > 0:
            s += v[i - 1, j]
        if i < self.n - 1:
            s += v[i + 1, j]
        if j > 0:
            s += v[i, j - 1]
        if j < self.n - 1:
            s += v[i, j + 1]
        return s

    @qd.kernel
    def set_rhs(self, f: qd.types.ndarray(dtype=qd.f64, ndim=2)):
        for i, j in self.f:
            self.f[i, j] = self.h2 * f[i, j]
            self.u[i, j] = 0.0
            self.x[i, j] = 0.0

    @qd.kernel
    def jacobi_sweep(self):
        for i, j in self.u:
            self.u_new[i, j] = 0.25 * (self.f[i, j] + self.neighbours(self.u, i, j))
        for i, j in self.u:
            self.u[i, j] = self.u_new[i, j]

    @qd.kernel
    def jacobi_residual(self) -> qd.f64:
        r = 0.0
        for i, j in self.u:
            d = self.f[i, j] - (4.0 * self.u[i, j] - self.neighbours(self.u, i, j))
            r += d * d
        return qd.sqrt(r)

    @qd.kernel
    def laplacian(self, v: qd.template(), out: qd.template()):
        """out = A v, A the 5-point matrix of h^2 (-lap) with the zero boundary."""
        for i, j in v:
            out[i, j] = 4.0 * v[i, j] - self.neighbours(v, i, j)

    def solve_jacobi(self, tol: float, max_sweeps: int) -> tuple:
        sweeps = 0
        while sweeps < max_sweeps:
            for _ in range(50):
                self.jacobi_sweep()
            sweeps += 50
            residual = self.jacobi_residual()
            if residual < tol:
                break
        return sweeps, residual

    def solve_cg(self, tol: float) -> bool:
        return qd.linalg.MatrixFreeCG(qd.linalg.LinearOperator(self.laplacian), self.f, self.x, tol=tol,
                                      maxiter=10 * self.n * self.n)


def numpy_reference(f: np.ndarray, h2: float) -> np.ndarray:
    """The direct solve of the assembled 5-point system (dense: small grids)."""
    n = f.shape[0]
    t = 2 * np.eye(n) - np.eye(n, k=1) - np.eye(n, k=-1)
    a = np.kron(t, np.eye(n)) + np.kron(np.eye(n), t)
    return np.linalg.solve(a, h2 * f.reshape(-1)).reshape(n, n)


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--n", type=int, default=32, help="interior grid points per side")
    args = parser.parse_args()
    qd.init()  # the arch from QD_ARCH (default: cpu)
    n = args.n
    rng = np.random.default_rng(1)
    xs = (np.arange(n) + 1) / (n + 1)
    f = np.sin(np.pi * xs)[:, None] * np.sin(2 * np.pi * xs)[None, :] + 0.1 * rng.standard_normal((n, n))

    grid = PoissonGrid(n)
    grid.set_rhs(f)
    reference = numpy_reference(f, grid.h2) if n <= 64 else None
    tol = 1e-10
    ok = True

    start = time.perf_counter()
    sweeps, residual = grid.solve_jacobi(tol, max_sweeps=200 * n * n)
    jacobi_time = time.perf_counter() - start
    u = grid.u.to_numpy()
    print(f"Jacobi: {sweeps} sweeps, residual {residual:.2e}, {jacobi_time:.2f} s")
    ok &= residual < tol

    start = time.perf_counter()
    converged = grid.solve_cg(tol)
    cg_time = time.perf_counter() - start
    x = grid.x.to_numpy()
    cg_residual = np.linalg.norm(grid.f.to_numpy() - (4 * x - np.pad(x, 1)[:-2, 1:-1] - np.pad(x, 1)[2:, 1:-1]
                                                      - np.pad(x, 1)[1:-1, :-2] - np.pad(x, 1)[1:-1, 2:]))
    print(f"CG: converged={converged}, residual {cg_residual:.2e}, {cg_time:.2f} s")
    ok &= converged and cg_residual < 10 * tol

    if reference is not None:
        scale = np.abs(reference).max()
        for name, got in (("Jacobi", u), ("CG", x)):
            err = np.abs(got - reference).max() / scale
            print(f"{name} vs numpy direct solve: max relative error {err:.2e}")
            ok &= err < 1e-6
    print("OK" if ok else "FAILED")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
