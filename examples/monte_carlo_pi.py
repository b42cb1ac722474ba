"""Estimate pi by throwing random points at the unit square (qd.random + an atomic counter).

    python examples/monte_carlo_pi.py
    QD_ARCH=cuda python examples/monte_carlo_pi.py      # on an NVIDIA GPU

Exits non-zero if the estimate is further from pi than 6 standard deviations of the estimator.
"""

import math
import sys

import qd_numba as qd

SAMPLES = 4_000_000

qd.init(random_seed=42)  # the arch from QD_ARCH (default: cpu)

hits = qd.field(qd.i64, shape=())


@qd.kernel
def throw(n: qd.i64):
    for _ in range(n):
        x = qd.random(qd.f32)
        y = qd.random(qd.f32)
        if x * x + y * y < 1.0:
            hits[None] += 1  # atomic add on global data (qd.atomic_add currently fails to compile here)


def main() -> int:
    hits.fill(0)
    throw(SAMPLES)
    inside = int(hits.to_numpy())
    estimate = 4.0 * inside / SAMPLES
    p = math.pi / 4
    sigma = 4.0 * math.sqrt(p * (1 - p) / SAMPLES)
    err = abs(estimate - math.pi)
    ok = err < 6 * sigma and 0 < inside < SAMPLES
    print(f"monte_carlo_pi: {SAMPLES} samples, {inside} inside")
    print(f"monte_carlo_pi: pi ~= {estimate:.6f}, error {err:.2e} (6 sigma = {6 * sigma:.2e}): "
          f"{'OK' if ok else 'FAIL'}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
