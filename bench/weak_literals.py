"""What float literals cost an f32 kernel: the same kernels compiled with literals that follow
their data (the default, passes/weak_literals.py) and with every literal f64
(``qd.init(default_fp=qd.f64)``, which is how every literal computed before), side by side in
one process.

    python bench/weak_literals.py [--arch cpu|cuda] [--n 16777216]

Kernels: ``poly``, a degree-16 polynomial per element (Horner, compute-bound), and ``axpb``,
``y = x * 1.5 + 0.25`` (memory-bound). Prints the best of 20 timed calls (after a warm-up call)
of each and the ratio; checks both against numpy.
"""

from __future__ import annotations

import argparse
import json
import time

import numpy as np

import qd_numba as qd

COEFFS = [0.5 / (k + 1) for k in range(17)]


def build(n: int):
    x, y = qd.field(qd.f32, shape=n), qd.field(qd.f32, shape=n)
    horner = repr(COEFFS[16])          # the coefficients as literals in the code
    for k in range(15, -1, -1):
        horner = f"({horner}) * v + {COEFFS[k]!r}"
    source = (f"def poly():\n    for i in x:\n        v = x[i]\n        y[i] = {horner}\n"
              "def axpb():\n    for i in x:\n        y[i] = x[i] * 1.5 + 0.25\n")
    ns = {"qd": qd, "x": x, "y": y}
    exec(compile(source, "<weak_literals bench>", "exec"), ns)
    return x, y, qd.kernel(ns["poly"]), qd.kernel(ns["axpb"])


def best_ms(fn, calls=20) -> float:
    fn()
    qd.sync()
    best = float("inf")
    for _ in range(calls):
        t = time.perf_counter()
        fn()
        qd.sync()
        best = min(best, time.perf_counter() - t)
    return best * 1e3


def measure(arch: str, n: int, default_fp) -> dict:
    qd.init(arch=getattr(qd, arch), offline_cache=False, default_fp=default_fp)
    x, y, poly, axpb = build(n)
    data = np.random.default_rng(0).uniform(-1, 1, n).astype(np.float32)
    x.from_numpy(data)
    out = {"poly_ms": best_ms(poly)}
    expected = np.polynomial.polynomial.polyval(data.astype(np.float64), COEFFS)
    out["poly_max_rel_err"] = float(np.max(np.abs(y.to_numpy() - expected) / np.maximum(np.abs(expected), 1e-3)))
    out["axpb_ms"] = best_ms(axpb)
    out["axpb_max_abs_err"] = float(np.max(np.abs(y.to_numpy() - (data * np.float32(1.5) + np.float32(0.25)))))
    return out


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--arch", default="cpu", choices=["cpu", "cuda"])
    parser.add_argument("--n", type=int, default=1 << 24)
    args = parser.parse_args()
    follow = measure(args.arch, args.n, qd.f32)
    wide = measure(args.arch, args.n, qd.f64)
    print(json.dumps({"arch": args.arch, "n": args.n, "literals_follow_data": follow, "literals_f64": wide}, indent=1))
    for name in ("poly", "axpb"):
        print(f"{name}: {follow[name + '_ms']:.3f} ms (literals follow f32 data) vs {wide[name + '_ms']:.3f} ms "
              f"(f64 literals): {follow[name + '_ms'] / wide[name + '_ms']:.2f}x")


if __name__ == "__main__":
    main()
