"""Particles in cells: a neighbour count through per-cell particle lists on ``dynamic`` SNodes.

    python examples/particle_list.py
    QD_ARCH=cuda python examples/particle_list.py --n 200000 --grid 128

Each step moves the particles (reflecting at the walls of the unit box), empties the cell lists
(``x.parent().deactivate_all()``), appends every particle to the list of its cell
(``qd.append``, concurrent) and counts, for every particle, the others closer than ``radius``
by visiting the 3 x 3 cells around it (``qd.length`` of each list). ``radius`` is at most a
cell's side, so the 3 x 3 cells hold every neighbour.

Checks against numpy (exit status non-zero when one fails), after every step: the list
lengths equal numpy's per-cell counts, each list holds exactly the particles of its cell, and
the neighbour counts equal a brute-force all-pairs count.

The file uses only names that Quadrants has: with ``import quadrants as qd`` it runs under
Quadrants unchanged, with the same counts.
"""

from __future__ import annotations

import argparse
import sys

import numpy as np

import qd_numba as qd


@qd.data_oriented
class ParticleList:
    """``n`` particles, a ``grid`` x ``grid`` cell grid over [0, 1]^2, lists of up to ``capacity``."""

    def __init__(self, n: int, grid: int, capacity: int, radius: float):
        if radius > 1.0 / grid:
            raise ValueError("radius must be at most a cell's side (1 / grid)")
        self.n, self.grid, self.capacity, self.radius = n, grid, capacity, radius
        self.pos = qd.Vector.field(2, qd.f32, shape=n)
        self.vel = qd.Vector.field(2, qd.f32, shape=n)
        self.neighbours = qd.field(qd.i32, shape=n)
        self.lengths = qd.field(qd.i32, shape=(grid, grid))
        self.members = qd.field(qd.i32)        # particle ids, per cell
        self.cells = qd.root.dense(qd.ij, (grid, grid)).dynamic(qd.k, capacity)
        self.cells.place(self.members)

    @qd.func
    def cell_of(self, p):
        return qd.min(int(self.pos[p] * self.grid), self.grid - 1)

    @qd.kernel
    def move(self, dt: qd.f32):
        for p in self.pos:
            x = self.pos[p] + self.vel[p] * dt
            for d in qd.static(range(2)):
                if x[d] < 0.0:
                    x[d] = -x[d]
                    self.vel[p][d] = -self.vel[p][d]
                if x[d] > 1.0:
                    x[d] = 2.0 - x[d]
                    self.vel[p][d] = -self.vel[p][d]
            self.pos[p] = x

    @qd.kernel
    def build(self):
        for p in self.pos:
            c = self.cell_of(p)
            qd.append(self.cells, [c.x, c.y], p)

    @qd.kernel
    def count(self):
        for i, j in self.lengths:
            self.lengths[i, j] = qd.length(self.cells, [i, j])
        for p in self.pos:
            c = self.cell_of(p)
            found = 0
            for di, dj in qd.static(qd.ndrange((-1, 2), (-1, 2))):
                i, j = c.x + di, c.y + dj
                if 0 <= i < self.grid and 0 <= j < self.grid:
                    for k in range(qd.length(self.cells, [i, j])):
                        q = self.members[i, j, k]
                        if q != p and (self.pos[q] - self.pos[p]).norm_sqr() < self.radius ** 2:
                            found += 1
            self.neighbours[p] = found

    def step(self, dt: float) -> None:
        self.move(dt)
        self.members.parent().deactivate_all()    # empty every list
        self.build()
        self.count()


def numpy_check(sim: ParticleList) -> list[str]:
    """What differs from numpy (empty when all agrees)."""
    pos = sim.pos.to_numpy().astype(np.float64)
    cell = np.minimum((sim.pos.to_numpy() * np.float32(sim.grid)).astype(np.int64), sim.grid - 1)
    flat = cell[:, 0] * sim.grid + cell[:, 1]
    counts = np.bincount(flat, minlength=sim.grid ** 2).reshape(sim.grid, sim.grid)
    problems = []
    if counts.max() > sim.capacity:
        problems.append(f"a cell holds {counts.max()} particles, above the capacity {sim.capacity}")
    lengths = sim.lengths.to_numpy()
    if not np.array_equal(lengths, counts):
        problems.append(f"list lengths differ from numpy's cell counts in {int((lengths != counts).sum())} cells")
    members = sim.members.to_numpy()
    for c in np.flatnonzero(counts):
        i, j = divmod(int(c), sim.grid)
        if not np.array_equal(np.sort(members[i, j, :counts[i, j]]), np.flatnonzero(flat == c)):
            problems.append(f"the list of cell ({i}, {j}) does not hold its particles")
            break
    d2 = ((pos[:, None, :] - pos[None, :, :]) ** 2).sum(-1)
    brute = (d2 < sim.radius ** 2).sum(1) - 1
    got = sim.neighbours.to_numpy()
    # float32 distances in the kernel: a pair within rounding of the radius may count differently
    near = np.abs(np.sqrt(d2) - sim.radius) < 1e-5
    unsure = near.sum(1) - np.diag(near)
    bad = np.abs(got - brute) > unsure
    if bad.any():
        problems.append(f"neighbour counts differ from the all-pairs count for {int(bad.sum())} particles")
    return problems


def run(n: int, grid: int, steps: int, seed: int = 0, check_every: int = 1) -> tuple[ParticleList, list[str]]:
    rng = np.random.default_rng(seed)
    capacity = max(32, int(4 * n / grid ** 2) + 16)
    sim = ParticleList(n, grid, capacity, radius=0.9 / grid)
    sim.pos.from_numpy(rng.random((n, 2), dtype=np.float32))
    sim.vel.from_numpy(rng.uniform(-1.0, 1.0, (n, 2)).astype(np.float32))
    problems = []
    for s in range(steps):
        sim.step(0.01)
        if check_every and (s % check_every == 0 or s == steps - 1):
            problems += [f"step {s}: {p}" for p in numpy_check(sim)]
    return sim, problems


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=2000, help="particles")
    parser.add_argument("--grid", type=int, default=16, help="cells per axis")
    parser.add_argument("--steps", type=int, default=5, help="steps, each checked")
    args = parser.parse_args(argv)
    qd.init()   # the arch from QD_ARCH (default: cpu)
    sim, problems = run(args.n, args.grid, args.steps, check_every=1 if args.n <= 20_000 else 0)
    for p in problems:
        print(f"particle_list: {p}: FAIL")
    counts = sim.neighbours.to_numpy()
    checked = "checked against numpy" if args.n <= 20_000 else "not checked (too many for all pairs)"
    print(f"particle_list: {args.n} particles, {args.grid}^2 cells, {args.steps} steps, mean neighbours "
          f"{counts.mean():.2f}, longest list {sim.lengths.to_numpy().max()}, {checked}: "
          f"{'OK' if not problems else 'FAIL'}")
    return 0 if not problems else 1


if __name__ == "__main__":
    sys.exit(main())
