"""Particles bouncing in a unit box, with a density histogram built by atomic adds.

    python examples/particles.py
    QD_ARCH=cuda python examples/particles.py      # on an NVIDIA GPU

Checks that the histogram counts every particle exactly once, that all particles stay in the
box, and that the histogram equals numpy's histogram of the same positions; exits non-zero otherwise.
"""

import sys

import numpy as np

import qd_numba as qd

N = 200_000      # particles
GRID = 32        # histogram cells per axis
STEPS = 50
DT = 0.01

qd.init()  # the arch from QD_ARCH (default: cpu)

pos = qd.field(qd.f32, shape=(N, 2))
vel = qd.field(qd.f32, shape=(N, 2))
density = qd.field(qd.i32, shape=(GRID, GRID))


@qd.kernel
def advance(dt: qd.f32):
    for p in range(N):
        for d in range(2):
            x = pos[p, d] + vel[p, d] * dt
            if x < 0.0:
                x = -x
                vel[p, d] = -vel[p, d]
            if x > 1.0:
                x = 2.0 - x
                vel[p, d] = -vel[p, d]
            pos[p, d] = x


@qd.kernel
def histogram():
    for i, j in qd.ndrange(GRID, GRID):
        density[i, j] = 0
    for p in range(N):
        cx = min(int(pos[p, 0] * GRID), GRID - 1)
        cy = min(int(pos[p, 1] * GRID), GRID - 1)
        # `+=` on global data in a parallel loop is an atomic add (as in Quadrants/Taichi).
        # (qd.atomic_add(density[cx, cy], 1) is the explicit form; it currently fails to
        # compile inside a top-level loop on a field: see the bug list.)
        density[cx, cy] += 1


def main() -> int:
    rng = np.random.default_rng(7)
    pos.from_numpy(rng.random((N, 2), dtype=np.float32))
    vel.from_numpy(rng.uniform(-1.0, 1.0, (N, 2)).astype(np.float32))
    for _ in range(STEPS):
        advance(DT)
    histogram()

    p = pos.to_numpy()
    h = density.to_numpy()
    cells = np.minimum((p * GRID).astype(np.int64), GRID - 1)
    ref = np.zeros((GRID, GRID), np.int64)
    np.add.at(ref, (cells[:, 0], cells[:, 1]), 1)

    total = int(h.sum())
    in_box = bool(np.all((p >= 0.0) & (p <= 1.0)))
    same = bool(np.array_equal(h, ref))
    print(f"particles: {N} particles, {STEPS} steps, {GRID}x{GRID} histogram; "
          f"min/max cell count {h.min()}/{h.max()}")
    ok = total == N and in_box and same
    print(f"particles: histogram total = {total} (expected {N}), all in box: {in_box}, "
          f"matches numpy histogram: {same}: {'OK' if ok else 'FAIL'}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
