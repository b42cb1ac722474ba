"""Run time of typical task kernels, for comparing two qd_numba trees' generated code (the
shape of a task's grid-stride loop, say). Run with the tree first on ``PYTHONPATH``; prints one
JSON object of microseconds per call (best of 7 batches, host wall time with a sync after each
batch). ``--arch cuda`` (the default) needs a GPU; ``--arch cpu`` runs the same kernels on the
CPU (sizes divided by 16 but for the launch-bound one), with ``numba.njit(parallel=True)``
``prange`` loops over numpy arrays next to the field copy and the multiply-add chain (``*_njit_us``).

    PYTHONPATH=<tree> python3 bench/task_runtime.py [--arch cpu|cuda]

Kernels: saxpy over 2^26 f32 (ndarrays), a field copy over 2^24, a 5-point stencil on a 4096^2
field, 64 dependent multiply-adds per element over 2^20, a sum into one field cell over 2^24 (a
reduction), 1,024 elements (launch-bound), and ``range(n)`` with ``n`` an argument over 2^24.
bench/results/session12.md has a before/after run.
"""

from __future__ import annotations

import argparse
import json
import time

import numpy as np

import qd_numba as qd


def best_us(fn, reps, repeats=7, sync=qd.sync):
    fn()
    sync()
    best = float("inf")
    for _ in range(repeats):
        t = time.perf_counter()
        for _ in range(reps):
            fn()
        sync()
        best = min(best, (time.perf_counter() - t) / reps)
    return best * 1e6


def _size(k: int) -> str:
    return f"{k >> 20}M" if k >= 1 << 20 else f"{k >> 10}K"


def _njit_references(f_data, c_data, m: int, c_n: int) -> dict:
    """The field copy and the multiply-add chain as hand-written ``prange`` loops (CPU)."""
    import numba

    @numba.njit(parallel=True)
    def copy(src, dst):
        for i in numba.prange(src.shape[0]):
            dst[i] = src[i] * 0.5

    @numba.njit(parallel=True)
    def chain(src, dst):
        for i in numba.prange(src.shape[0]):
            v = src[i]
            for _ in range(64):
                v = v * 0.999 + 0.001
            dst[i] = v

    g_data, d_data = np.empty_like(f_data), np.empty_like(c_data)
    def no_sync():
        pass

    return {f"field_copy_{_size(m)}_njit_us": best_us(lambda: copy(f_data, g_data), 20, sync=no_sync),
            f"compute_{_size(c_n)}_x64_njit_us": best_us(lambda: chain(c_data, d_data), 20, sync=no_sync)}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--arch", default="cuda", choices=["cpu", "cuda"])
    arch = parser.parse_args().arch
    qd.init(arch=qd.cpu if arch == "cpu" else qd.cuda, offline_cache=False)
    shrink = 4 if arch == "cpu" else 0     # CPU: sizes / 16
    rng = np.random.default_rng(0)
    out = {}
    n = 1 << (26 - shrink)
    x, y = qd.ndarray(qd.f32, shape=(n,)), qd.ndarray(qd.f32, shape=(n,))
    x.from_numpy(rng.random(n, dtype=np.float32))
    y.from_numpy(rng.random(n, dtype=np.float32))

    @qd.kernel
    def saxpy(a: qd.f32, x: qd.types.ndarray(dtype=qd.f32, ndim=1), y: qd.types.ndarray(dtype=qd.f32, ndim=1)):
        for i in range(x.shape[0]):
            y[i] = a * x[i] + y[i]

    out[f"saxpy_{_size(n)}_us"] = best_us(lambda: saxpy(2.0, x, y), 10)

    m = 1 << (24 - shrink)
    f, g = qd.field(qd.f32, shape=m), qd.field(qd.f32, shape=m)
    f.from_numpy(rng.random(m, dtype=np.float32))

    @qd.kernel
    def field_copy():
        for i in f:
            g[i] = f[i] * 0.5

    out[f"field_copy_{_size(m)}_us"] = best_us(field_copy, 20)

    side = 4096 >> (shrink // 2)
    a, b = qd.field(qd.f32, shape=(side, side)), qd.field(qd.f32, shape=(side, side))
    a.from_numpy(rng.random((side, side), dtype=np.float32))

    @qd.kernel
    def stencil():
        for i, j in a:
            if 0 < i < side - 1 and 0 < j < side - 1:
                b[i, j] = 0.25 * (a[i - 1, j] + a[i + 1, j] + a[i, j - 1] + a[i, j + 1])

    out[f"stencil_{side}sq_us"] = best_us(stencil, 10)

    c_n = 1 << (20 - shrink)
    c, d = qd.field(qd.f32, shape=c_n), qd.field(qd.f32, shape=c_n)
    c.from_numpy(rng.random(c_n, dtype=np.float32))

    @qd.kernel
    def compute():
        for i in c:
            v = c[i]
            for _ in range(64):
                v = v * 0.999 + 0.001
            d[i] = v

    out[f"compute_{_size(c_n)}_x64_us"] = best_us(compute, 20)
    if arch == "cpu":
        out.update(_njit_references(f.to_numpy(), c.to_numpy(), m, c_n))

    s = qd.field(qd.f32, shape=())

    @qd.kernel
    def total():
        for i in f:
            s[None] += f[i]

    out[f"sum_{_size(m)}_us"] = best_us(total, 20)

    small = qd.field(qd.f32, shape=1024)

    @qd.kernel
    def tiny():
        for i in small:
            small[i] += 1.0

    out["small_1024_us"] = best_us(tiny, 2000)

    @qd.kernel
    def ranged(k: int):
        for i in range(k):
            g[i] = f[i] + 1.0

    out[f"range_arg_{_size(m)}_us"] = best_us(lambda: ranged(m), 20)
    print(json.dumps(out))


if __name__ == "__main__":
    main()
