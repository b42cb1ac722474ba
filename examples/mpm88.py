"""MPM88: a 2-D MLS-MPM fluid (the classic 88-line demo), written as Quadrants users write it.

    python examples/mpm88.py                        # checks, then a short run
    python examples/mpm88.py --n 8192 --steps 2000  # the classic size
    QD_ARCH=cuda python examples/mpm88.py           # on an NVIDIA GPU
    python examples/mpm88.py --gui                  # draws with qd.GUI when there is one

One substep is three kernels of an ``@qd.data_oriented`` class: particle to grid (P2G, atomic
scatter of mass and APIC momentum), the grid update (momentum to velocity, gravity, walls) and
grid to particle (G2P, gather of velocity and the affine matrix C). Particles carry a position,
a velocity, C and the volume ratio J (a weakly compressible fluid: pressure from J).

Checks, on random particles (exit status non-zero when one fails):
- mass: P2G puts ``n * p_mass`` on the grid (the B-spline weights of a particle sum to 1);
- momentum: without gravity and away from the walls P2G and G2P conserve it (the weights'
  first moments vanish, so the affine and stress terms add no net momentum);
- one substep equals an independent numpy implementation of the same substep;
- after the run every particle is inside the domain.

The file uses only names that Quadrants has: with ``import quadrants as qd`` it runs under
Quadrants unchanged (bench/mpm88_bench.py times both that way).
"""

from __future__ import annotations

import argparse
import sys

import numpy as np

import qd_numba as qd

DIM = 2


@qd.data_oriented
class MPM88:
    """State and kernels of one MLS-MPM fluid on an ``n_grid`` x ``n_grid`` grid over [0, 1]^2."""

    def __init__(self, n_particles: int = 2048, n_grid: int = 64, dt: float = 2e-4, E: float = 400.0,
                 layout: str = "aos"):
        self.n_particles, self.n_grid = n_particles, n_grid
        self.dx = 1.0 / n_grid
        self.dt = dt
        self.p_vol = (self.dx * 0.5) ** 2
        self.p_mass = self.p_vol * 1.0       # density 1
        self.E = E
        self.bound = 3                       # wall thickness in cells
        self.x = qd.Vector.field(DIM, qd.f32)
        self.v = qd.Vector.field(DIM, qd.f32)
        self.C = qd.Matrix.field(DIM, DIM, qd.f32)
        self.J = qd.field(qd.f32)
        particles = (self.x, self.v, self.C, self.J)
        if layout == "aos":      # one array of particle records
            qd.root.dense(qd.i, n_particles).place(*particles)
        elif layout == "soa":    # one array per attribute
            for f in particles:
                qd.root.dense(qd.i, n_particles).place(f)
        elif layout == "blocked" and n_particles % 64 == 0:   # records in blocks of 64 particles
            qd.root.dense(qd.i, n_particles // 64).dense(qd.i, 64).place(*particles)
        else:
            raise ValueError(f"layout is 'aos', 'soa' or 'blocked' (n_particles a multiple of 64), not {layout!r}")
        self.grid_v = qd.Vector.field(DIM, qd.f32, shape=(n_grid, n_grid))
        self.grid_m = qd.field(qd.f32, shape=(n_grid, n_grid))

    @qd.func
    def weights(self, fx):
        """Quadratic B-spline weights of the 3 x 3 nodes around a particle, per axis. (Quadrants'
        demo writes a list of 3 vectors; a list needs Numba's runtime, which CUDA kernels lack,
        so a tuple here.)"""
        return 0.5 * (1.5 - fx) ** 2, 0.75 - (fx - 1.0) ** 2, 0.5 * (fx - 0.5) ** 2

    @qd.kernel
    def p2g(self):
        for i, j in self.grid_m:
            self.grid_v[i, j] = qd.Vector.zero(qd.f32, 2)
            self.grid_m[i, j] = 0.0
        for p in self.x:
            Xp = self.x[p] / self.dx
            base = int(Xp - 0.5)
            fx = Xp - base
            w = self.weights(fx)
            stress = -self.dt * 4.0 * self.E * self.p_vol * (self.J[p] - 1.0) / self.dx ** 2
            affine = qd.Matrix([[stress, 0.0], [0.0, stress]]) + self.p_mass * self.C[p]
            for i, j in qd.static(qd.ndrange(3, 3)):
                offset = qd.Vector([i, j])
                dpos = (offset - fx) * self.dx
                weight = w[i].x * w[j].y
                self.grid_v[base + offset] += weight * (self.p_mass * self.v[p] + affine @ dpos)
                self.grid_m[base + offset] += weight * self.p_mass

    @qd.kernel
    def grid_update(self, gravity: qd.f32):
        for i, j in self.grid_m:
            if self.grid_m[i, j] > 0:
                self.grid_v[i, j] /= self.grid_m[i, j]
            self.grid_v[i, j].y -= self.dt * gravity
            if i < self.bound and self.grid_v[i, j].x < 0:
                self.grid_v[i, j].x = 0.0
            if i > self.n_grid - self.bound and self.grid_v[i, j].x > 0:
                self.grid_v[i, j].x = 0.0
            if j < self.bound and self.grid_v[i, j].y < 0:
                self.grid_v[i, j].y = 0.0
            if j > self.n_grid - self.bound and self.grid_v[i, j].y > 0:
                self.grid_v[i, j].y = 0.0

    @qd.kernel
    def g2p(self):
        for p in self.x:
            Xp = self.x[p] / self.dx
            base = int(Xp - 0.5)
            fx = Xp - base
            w = self.weights(fx)
            new_v = qd.Vector.zero(qd.f32, 2)
            new_C = qd.Matrix.zero(qd.f32, 2, 2)
            for i, j in qd.static(qd.ndrange(3, 3)):
                offset = qd.Vector([i, j])
                dpos = (offset - fx) * self.dx
                weight = w[i].x * w[j].y
                g_v = self.grid_v[base + offset]
                new_v += weight * g_v
                new_C += 4.0 * weight * g_v.outer_product(dpos) / self.dx ** 2
            self.v[p] = new_v
            self.x[p] += self.dt * self.v[p]
            self.J[p] *= 1.0 + self.dt * new_C.trace()
            self.C[p] = new_C

    def substep(self, gravity: float = 9.8) -> None:
        self.p2g()
        self.grid_update(gravity)
        self.g2p()

    def init_random(self, rng, lo: float = 0.2, hi: float = 0.6, speed: float = 1.0) -> None:
        """Particles uniformly in [lo, hi]^2 with random velocities, C and J near 1."""
        n = self.n_particles
        self.x.from_numpy(rng.uniform(lo, hi, (n, DIM)).astype(np.float32))
        self.v.from_numpy(rng.uniform(-speed, speed, (n, DIM)).astype(np.float32))
        self.C.from_numpy(rng.uniform(-1.0, 1.0, (n, DIM, DIM)).astype(np.float32))
        self.J.from_numpy(rng.uniform(0.95, 1.05, n).astype(np.float32))


def numpy_substep(x, v, C, J, n_grid, dt, E, gravity, bound=3):
    """The same substep in numpy (float64): returns x, v, C, J after it and the grid after P2G."""
    dx = 1.0 / n_grid
    p_vol = (dx * 0.5) ** 2
    p_mass = p_vol
    Xp = x / dx
    base = (Xp - 0.5).astype(np.int64)
    fx = Xp - base
    w = [0.5 * (1.5 - fx) ** 2, 0.75 - (fx - 1.0) ** 2, 0.5 * (fx - 0.5) ** 2]
    stress = -dt * 4.0 * E * p_vol * (J - 1.0) / dx ** 2
    affine = stress[:, None, None] * np.eye(2) + p_mass * C
    grid_v = np.zeros((n_grid, n_grid, 2))
    grid_m = np.zeros((n_grid, n_grid))
    for i in range(3):
        for j in range(3):
            offset = np.array([i, j])
            dpos = (offset - fx) * dx
            weight = w[i][:, 0] * w[j][:, 1]
            node = base + offset
            mom = p_mass * v + np.einsum("pab,pb->pa", affine, dpos)
            np.add.at(grid_v, (node[:, 0], node[:, 1]), weight[:, None] * mom)
            np.add.at(grid_m, (node[:, 0], node[:, 1]), weight * p_mass)
    p2g = (grid_v.copy(), grid_m.copy())
    has_mass = grid_m > 0
    grid_v[has_mass] /= grid_m[has_mass][:, None]
    grid_v[..., 1] -= dt * gravity
    idx = np.arange(n_grid)
    gx, gy = grid_v[..., 0], grid_v[..., 1]
    gx[(idx[:, None] < bound) & (gx < 0)] = 0.0
    gx[(idx[:, None] > n_grid - bound) & (gx > 0)] = 0.0
    gy[(idx[None, :] < bound) & (gy < 0)] = 0.0
    gy[(idx[None, :] > n_grid - bound) & (gy > 0)] = 0.0
    new_v = np.zeros_like(v)
    new_C = np.zeros_like(C)
    for i in range(3):
        for j in range(3):
            offset = np.array([i, j])
            dpos = (offset - fx) * dx
            weight = w[i][:, 0] * w[j][:, 1]
            node = base + offset
            g_v = grid_v[node[:, 0], node[:, 1]]
            new_v += weight[:, None] * g_v
            new_C += 4.0 * weight[:, None, None] * np.einsum("pa,pb->pab", g_v, dpos) / dx ** 2
    x = x + dt * new_v
    J = J * (1.0 + dt * np.trace(new_C, axis1=1, axis2=2))
    return x, new_v, new_C, J, p2g


def check(n_particles: int = 512, n_grid: int = 32, seed: int = 0) -> list[tuple[str, bool, str]]:
    """The checks of the module docstring, as (name, passed, detail)."""
    rng = np.random.default_rng(seed)
    sim = MPM88(n_particles, n_grid)
    results = []

    sim.init_random(rng)
    x0, v0, C0, J0 = (f.to_numpy().astype(np.float64) for f in (sim.x, sim.v, sim.C, sim.J))
    sim.p2g()
    grid_m, grid_v = sim.grid_m.to_numpy().astype(np.float64), sim.grid_v.to_numpy().astype(np.float64)
    mass = grid_m.sum()
    results.append(("P2G mass", abs(mass - n_particles * sim.p_mass) <= 1e-5 * n_particles * sim.p_mass,
                    f"{mass:.9g} vs {n_particles * sim.p_mass:.9g}"))
    p_mom = sim.p_mass * v0.sum(axis=0)
    g_mom = grid_v.reshape(-1, 2).sum(axis=0)
    scale = sim.p_mass * np.abs(v0).sum()
    results.append(("P2G momentum", bool(np.all(np.abs(g_mom - p_mom) <= 1e-4 * scale)), f"{g_mom} vs {p_mom}"))
    sim.grid_update(0.0)   # particles are far from the walls: the grid update only divides by mass
    grid_v = sim.grid_v.to_numpy().astype(np.float64)
    g_mom = (grid_m[..., None] * grid_v).reshape(-1, 2).sum(axis=0)
    sim.g2p()
    p_mom = sim.p_mass * sim.v.to_numpy().astype(np.float64).sum(axis=0)
    results.append(("G2P momentum", bool(np.all(np.abs(g_mom - p_mom) <= 1e-4 * scale)), f"{p_mom} vs {g_mom}"))

    sim.init_random(rng, lo=1.0 / n_grid, hi=1.0 - 2.0 / n_grid)   # into the walls: every 3x3 stencil in the grid
    state = [f.to_numpy().astype(np.float64) for f in (sim.x, sim.v, sim.C, sim.J)]
    sim.substep(9.8)
    ref = numpy_substep(*state, n_grid, sim.dt, sim.E, 9.8)[:4]
    got = [f.to_numpy().astype(np.float64) for f in (sim.x, sim.v, sim.C, sim.J)]
    errs = [float(np.max(np.abs(g - r)) / max(float(np.max(np.abs(r))), 1e-30)) for g, r in zip(got, ref)]
    results.append(("one substep == numpy", max(errs) < 1e-4, "relative errors x v C J " +
                    " ".join(f"{e:.1e}" for e in errs)))
    del x0, C0, J0
    return results


def run(n_particles: int, n_grid: int, steps: int, gui: bool = False, seed: int = 1):
    """A block of fluid falling under gravity for ``steps`` substeps; returns the simulation."""
    sim = MPM88(n_particles, n_grid)
    sim.init_random(np.random.default_rng(seed), lo=0.15, hi=0.45, speed=0.5)
    sim.v.from_numpy(sim.v.to_numpy() + np.float32([0.0, -3.0]))   # thrown at the floor
    sim.C.fill(0.0)
    sim.J.fill(1.0)
    window = _gui() if gui else None
    for s in range(steps):
        sim.substep()
        if window is not None and s % 50 == 0:
            window.clear(0x112F41)
            window.circles(sim.x.to_numpy(), radius=1.5, color=0x068587)
            window.show()
    return sim


def _gui():
    """``qd.GUI`` if there is one and a display to draw on; None (with a message) otherwise."""
    make = getattr(qd, "GUI", None)
    if make is None:
        print(f"mpm88: qd.GUI is not available in {qd.__name__}; running without drawing")
        return None
    try:
        return make("MPM88", res=512, background_color=0x112F41)
    except Exception as e:   # no display: draw nothing, still run and check
        print(f"mpm88: no GUI ({type(e).__name__}: {e}); running without drawing")
        return None


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=2048, help="particles of the run")
    parser.add_argument("--grid", type=int, default=64, help="grid cells per axis of the run")
    parser.add_argument("--steps", type=int, default=200, help="substeps of the run")
    parser.add_argument("--check-n", type=int, default=512, help="particles of the checks")
    parser.add_argument("--gui", action="store_true", help="draw the run (needs qd.GUI and a display)")
    args = parser.parse_args(argv)
    qd.init()   # the arch from QD_ARCH (default: cpu)

    results = check(args.check_n)
    sim = run(args.n, args.grid, args.steps, args.gui)
    x = sim.x.to_numpy()
    inside = bool(np.all(np.isfinite(x)) and np.all((x > 0.0) & (x < 1.0)))
    results.append(("particles inside the domain", inside, f"x in [{x.min():.4f}, {x.max():.4f}]"))
    for name, ok, detail in results:
        print(f"mpm88: {name}: {detail}: {'ok' if ok else 'FAIL'}")
    ok = all(ok for _, ok, _ in results)
    print(f"mpm88: {args.n} particles, {args.grid}^2 grid, {args.steps} substeps: {'OK' if ok else 'FAIL'}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
