"""Implicit time steps of a 2-D linear-elastic plate (linear triangles, plane stress, lumped mass)
under gravity, clamped on its left edge. Each backward-Euler step solves

    (M + dt^2 K) v' = M v + dt (f - K u),   u' = u + dt v'

with qd.linalg.MatrixFreeCG: the operator applies K element by element in a kernel, never
assembled. The same K is also assembled in a kernel through a qd.linalg.SparseMatrixBuilder and
solved directly with qd.linalg.SparseSolver (scipy). Each step is checked against numpy: K
assembled independently in numpy and the system solved by numpy's dense solver.

    python examples/fem_cg.py [--nx 12 --ny 4 --steps 3]
    QD_ARCH=cuda python examples/fem_cg.py --nx 128 --ny 32      # on an NVIDIA GPU

Prints each step's CG result and errors and "OK"; exits non-zero when a check fails.
"""

import argparse
import sys

import numpy as np

import qd_numba as qd

E, NU, RHO = 1e4, 0.3, 1.0          # Young's modulus, Poisson's ratio, density
GRAVITY = -9.8
DT = 0.01


def plate_mesh(nx: int, ny: int, width: float, height: float):
    """Node positions ((nx+1)(ny+1), 2) and triangles (2 nx ny, 3) of a structured plate."""
    xs, ys = np.meshgrid(np.linspace(0, width, nx + 1), np.linspace(0, height, ny + 1), indexing="ij")
    nodes = np.stack([xs.ravel(), ys.ravel()], axis=1)
    node = np.arange((nx + 1) * (ny + 1)).reshape(nx + 1, ny + 1)
    a, b, c, d = node[:-1, :-1].ravel(), node[1:, :-1].ravel(), node[1:, 1:].ravel(), node[:-1, 1:].ravel()
    triangles = np.concatenate([np.stack([a, b, c], 1), np.stack([a, c, d], 1)])
    return nodes, triangles.astype(np.int32)


@qd.data_oriented
class ElasticPlate:
    def __init__(self, nodes: np.ndarray, triangles: np.ndarray, fixed: np.ndarray):
        n_nodes, n_elements = len(nodes), len(triangles)
        self.n_nodes = n_nodes
        self.elements = qd.Vector.field(3, qd.i32)
        self.grad_n = qd.Matrix.field(3, 2, qd.f64)     # shape-function gradients per element
        self.area = qd.field(qd.f64)
        qd.root.dense(qd.i, n_elements).place(self.elements, self.grad_n, self.area)
        self.mass = qd.field(qd.f64)
        self.free = qd.field(qd.f64)                     # 1 for a free node, 0 for a clamped one
        qd.root.dense(qd.i, n_nodes).place(self.mass, self.free)
        # the unknowns, 2 per node: displacement, velocity, the CG unknown and right-hand side
        self.u, self.v, self.v_new, self.rhs, self.ku = (qd.field(qd.f64) for _ in range(5))
        qd.root.dense(qd.ij, (n_nodes, 2)).place(self.u, self.v, self.v_new, self.rhs, self.ku)
        self.elements.from_numpy(triangles)
        self.free.from_numpy((~fixed).astype(np.float64))
        self.init_elements(nodes)
        self.mass_lumping()

    @qd.kernel
    def init_elements(self, x: qd.types.ndarray(dtype=qd.f64, ndim=2)):
        for e in self.elements:
            a, b, c = self.elements[e][0], self.elements[e][1], self.elements[e][2]
            d1 = qd.Vector([x[b, 0] - x[a, 0], x[b, 1] - x[a, 1]])
            d2 = qd.Vector([x[c, 0] - x[a, 0], x[c, 1] - x[a, 1]])
            det = d1[0] * d2[1] - d1[1] * d2[0]
            self.area[e] = 0.5 * qd.abs(det)
            # gradients of the barycentric coordinates of b and c; a's is minus their sum
            gb = qd.Vector([d2[1], -d2[0]]) / det
            gc = qd.Vector([-d1[1], d1[0]]) / det
            self.grad_n[e] = qd.Matrix([[-gb[0] - gc[0], -gb[1] - gc[1]], [gb[0], gb[1]], [gc[0], gc[1]]])

    @qd.kernel
    def mass_lumping(self):
        for e in self.elements:
            for k in qd.static(range(3)):
                self.mass[self.elements[e][k]] += RHO * self.area[e] / 3.0

    @qd.func
    def element_force(self, e, p: qd.template()):
        """K_e p_e of element e: the nodal forces (3 x 2) of the stress of displacements p."""
        g = self.grad_n[e]
        eps_xx, eps_yy, gamma = 0.0, 0.0, 0.0
        for k in qd.static(range(3)):
            node = self.elements[e][k]
            eps_xx += g[k, 0] * p[node, 0]
            eps_yy += g[k, 1] * p[node, 1]
            gamma += g[k, 1] * p[node, 0] + g[k, 0] * p[node, 1]
        scale = E / (1.0 - NU * NU)
        s_xx = scale * (eps_xx + NU * eps_yy)
        s_yy = scale * (NU * eps_xx + eps_yy)
        s_xy = scale * 0.5 * (1.0 - NU) * gamma
        forces = qd.Matrix.zero(qd.f64, 3, 2)
        for k in qd.static(range(3)):
            forces[k, 0] = self.area[e] * (g[k, 0] * s_xx + g[k, 1] * s_xy)
            forces[k, 1] = self.area[e] * (g[k, 1] * s_yy + g[k, 0] * s_xy)
        return forces

    @qd.func
    def add_element_forces(self, p: qd.template(), out: qd.template(), scale):
        """out += scale * K p, element by element (atomic adds into shared nodes)."""
        for e in self.elements:
            forces = self.element_force(e, p)
            for k in qd.static(range(3)):
                for d in qd.static(range(2)):
                    out[self.elements[e][k], d] += scale * forces[k, d]

    @qd.kernel
    def apply_stiffness(self, p: qd.template(), out: qd.template()):
        for i, d in out:
            out[i, d] = 0.0
        self.add_element_forces(p, out, 1.0)

    @qd.kernel
    def system_matvec(self, p: qd.template(), out: qd.template()):
        """out = (M + dt^2 K) p on free nodes, p on clamped ones (an SPD operator)."""
        for i, d in out:
            out[i, d] = 0.0
        self.add_element_forces(p, out, DT * DT)
        for i, d in out:
            free = self.free[i]
            out[i, d] = free * (self.mass[i] * p[i, d] + out[i, d]) + (1.0 - free) * p[i, d]

    @qd.kernel
    def assemble_rhs(self):
        for i, d in self.rhs:
            gravity = GRAVITY if d == 1 else 0.0
            momentum = self.mass[i] * self.v[i, d]
            self.rhs[i, d] = self.free[i] * (momentum + DT * (self.mass[i] * gravity - self.ku[i, d]))
            self.v_new[i, d] = self.v[i, d]      # CG starts from the old velocity

    @qd.kernel
    def advance(self):
        for i, d in self.u:
            self.v[i, d] = self.v_new[i, d]
            self.u[i, d] += DT * self.v_new[i, d]

    @qd.kernel
    def assemble_stiffness(self, K: qd.types.sparse_matrix_builder()):
        """K into a sparse matrix builder, one triplet per (element, node pair, direction pair):
        entry ((k, x|y), (m, x|y)) of K_e = area B_k^T D B_m, B_k from node k's shape-function gradient."""
        for e in self.elements:
            g = self.grad_n[e]
            scale = E / (1.0 - NU * NU)
            for k in qd.static(range(3)):
                for m in qd.static(range(3)):
                    a, b = g[k, 0], g[k, 1]
                    c, d = g[m, 0], g[m, 1]
                    row, col = 2 * self.elements[e][k], 2 * self.elements[e][m]
                    w = self.area[e] * scale
                    K[row, col] += w * (a * c + 0.5 * (1.0 - NU) * b * d)
                    K[row, col + 1] += w * (NU * a * d + 0.5 * (1.0 - NU) * b * c)
                    K[row + 1, col] += w * (NU * b * c + 0.5 * (1.0 - NU) * a * d)
                    K[row + 1, col + 1] += w * (b * d + 0.5 * (1.0 - NU) * a * c)

    def step(self, tol: float) -> bool:
        self.apply_stiffness(self.u, self.ku)
        self.assemble_rhs()
        converged = qd.linalg.MatrixFreeCG(qd.linalg.LinearOperator(self.system_matvec), self.rhs, self.v_new,
                                           tol=tol, maxiter=20 * self.n_nodes)
        self.advance()
        return converged


def numpy_stiffness(nodes: np.ndarray, triangles: np.ndarray) -> np.ndarray:
    """K assembled from B^T D B per element (dense; small meshes)."""
    k = np.zeros((2 * len(nodes), 2 * len(nodes)))
    d = E / (1 - NU ** 2) * np.array([[1, NU, 0], [NU, 1, 0], [0, 0, (1 - NU) / 2]])
    for tri in triangles:
        x = nodes[tri]
        jac = np.array([x[1] - x[0], x[2] - x[0]]).T
        grads = np.linalg.solve(jac.T, np.array([[-1.0, 1.0, 0.0], [-1.0, 0.0, 1.0]]))   # (2, 3)
        area = 0.5 * abs(np.linalg.det(jac))
        b = np.zeros((3, 6))
        b[0, 0::2], b[1, 1::2] = grads[0], grads[1]
        b[2, 0::2], b[2, 1::2] = grads[1], grads[0]
        dofs = np.stack([2 * tri, 2 * tri + 1], 1).ravel()
        k[np.ix_(dofs, dofs)] += area * b.T @ d @ b
    return k


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--nx", type=int, default=12)
    parser.add_argument("--ny", type=int, default=4)
    parser.add_argument("--steps", type=int, default=3)
    args = parser.parse_args()
    qd.init()  # the arch from QD_ARCH (default: cpu)
    nodes, triangles = plate_mesh(args.nx, args.ny, 3.0, 1.0)
    fixed = nodes[:, 0] == 0.0
    plate = ElasticPlate(nodes, triangles, fixed)

    small = len(nodes) <= 2000
    free = np.repeat(~fixed, 2)
    if small:
        k_ref = numpy_stiffness(nodes, triangles)
        mass = np.repeat(plate.mass.to_numpy(), 2)
        a_ref = (np.diag(mass) + DT * DT * k_ref)[np.ix_(free, free)]
    try:
        import scipy  # noqa: F401
        have_scipy = True
    except ImportError:
        have_scipy = False
        print("scipy missing: the SparseMatrixBuilder / SparseSolver check is skipped")
    if have_scipy:
        builder = qd.linalg.SparseMatrixBuilder(2 * len(nodes), 2 * len(nodes), max_num_triplets=36 * len(triangles),
                                                dtype=qd.f64)
        plate.assemble_stiffness(builder)
        k_sparse = builder.build()
        solver = qd.linalg.SparseSolver(dtype=qd.f64, solver_type="LLT")
        mass_matrix = qd.linalg.SparseMatrix(2 * len(nodes), 2 * len(nodes), dtype=qd.f64)
        for i, m in enumerate(np.repeat(plate.mass.to_numpy(), 2)):
            mass_matrix[i, i] = m
        system = mass_matrix + (DT * DT) * k_sparse
        keep = np.flatnonzero(free)
        system_free = qd.linalg.SparseMatrix(sm=system.matrix[keep][:, keep], dtype=qd.f64)
        solver.compute(system_free)

    ok = True
    tol = 1e-9
    for step in range(args.steps):
        u, v = plate.u.to_numpy().reshape(-1), plate.v.to_numpy().reshape(-1)
        converged = plate.step(tol)
        v_new = plate.v_new.to_numpy().reshape(-1)
        rhs = plate.rhs.to_numpy().reshape(-1)
        line = f"step {step}: CG converged={converged}, max |v| {np.abs(v_new).max():.4e}"
        ok &= converged and np.all(v_new[~free] == 0.0)
        if small:
            gravity = np.tile([0.0, GRAVITY], len(nodes))
            b_ref = (mass * v + DT * (mass * gravity - k_ref @ u))[free]
            ok &= np.allclose(rhs[free], b_ref, rtol=1e-12, atol=1e-12)
            residual = np.linalg.norm(a_ref @ v_new[free] - b_ref)
            err = np.abs(v_new[free] - np.linalg.solve(a_ref, b_ref)).max() / np.abs(v_new).max()
            line += f", residual {residual:.2e}, error vs numpy {err:.2e}"
            ok &= residual < 10 * tol and err < 1e-8
        if have_scipy:
            direct = solver.solve(rhs[free])
            err = np.abs(v_new[free] - direct).max() / np.abs(v_new).max()
            line += f", vs SparseSolver {err:.2e}"
            ok &= solver.info() and err < 1e-8
        print(line)
    print("OK" if ok else "FAILED")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
