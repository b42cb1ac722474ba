"""2-D explicit heat diffusion on qd.fields, checked against numpy running the same steps.

    python examples/heat_diffusion.py
    QD_ARCH=cuda python examples/heat_diffusion.py      # on an NVIDIA GPU

Prints the max abs error against numpy and exits non-zero if it exceeds the tolerance.
"""

import sys
import time

import numpy as np

import qd_numba as qd

N = 256          # grid is N x N, boundary held at 0
STEPS = 200
ALPHA = 0.2      # dt * kappa / dx^2, stable for <= 0.25

qd.init()  # the arch from QD_ARCH (default: cpu)

u = qd.field(qd.f32, shape=(N, N))
u_new = qd.field(qd.f32, shape=(N, N))


@qd.kernel
def step(alpha: qd.f32):
    for i, j in qd.ndrange((1, N - 1), (1, N - 1)):
        lap = u[i - 1, j] + u[i + 1, j] + u[i, j - 1] + u[i, j + 1] - 4.0 * u[i, j]
        u_new[i, j] = u[i, j] + alpha * lap
    for i, j in qd.ndrange((1, N - 1), (1, N - 1)):
        u[i, j] = u_new[i, j]


def numpy_step(v, alpha):
    out = v.copy()
    lap = v[:-2, 1:-1] + v[2:, 1:-1] + v[1:-1, :-2] + v[1:-1, 2:] - np.float32(4.0) * v[1:-1, 1:-1]
    out[1:-1, 1:-1] = v[1:-1, 1:-1] + np.float32(alpha) * lap
    return out


def main() -> int:
    rng = np.random.default_rng(0)
    init = np.zeros((N, N), np.float32)
    init[1:-1, 1:-1] = rng.random((N - 2, N - 2), dtype=np.float32)
    init[N // 4:N // 2, N // 4:N // 2] += 5.0
    u.from_numpy(init)

    t0 = time.perf_counter()
    step(ALPHA)                       # first call compiles
    t1 = time.perf_counter()
    for _ in range(STEPS - 1):
        step(ALPHA)
    t2 = time.perf_counter()

    ref = init
    for _ in range(STEPS):
        ref = numpy_step(ref, ALPHA)
    t3 = time.perf_counter()

    got = u.to_numpy()
    err = float(np.max(np.abs(got - ref)))
    tol = 1e-4
    print(f"heat_diffusion: {N}x{N} grid, {STEPS} steps: compile+first step {t1 - t0:.2f}s, "
          f"{STEPS - 1} steps {t2 - t1:.3f}s (numpy {t3 - t2:.3f}s)")
    print(f"heat_diffusion: total heat {got.sum():.3f} (numpy {ref.sum():.3f})")
    ok = err < tol
    verdict = 'OK' if ok else 'FAIL'
    print(f"heat_diffusion: max abs error vs numpy = {err:.3e} (tolerance {tol:.0e}): {verdict}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
