"""Per-task CFG optimisation (passes/cfg_optimize.py): loads and stores removed, run time and
compile time with the pass on and off.

    python bench/cfg_optimize.py [--arch cpu|cuda] [--n 4000000] [--reps 20] [--rounds 3] [--loops 32]

Workloads (public API only):

* ``integrate``: a particle step written as people write it — re-reading what it just stored,
  a velocity stored twice, a bounce under an ``if``;
* ``stencil``: a 2-D diffusion step reading each centre element several times;
* ``k_loops``: the compile-time kernel of issue 12 (``--loops`` top-level loops, each a few
  float ops on its own pair of fields): what the pass costs at compile time; first alone, the
  untyped pipeline for K = ``--scaling`` loops (the pass must stay linear in the task count).

For each: the loads and stores of global data its tasks make (``kernel.tasks()``), the best
run time over ``--reps`` calls, the cold compile time (first call after ``qd.init``) and the time
spent in the pass itself. Prints a markdown table.
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np

import qd_numba as qd
from qd_numba.passes import cfg_optimize

_PASS_TIME = []


def _timed_pass(run):
    def wrapper(self, state):
        t0 = time.perf_counter()
        try:
            return run(self, state)
        finally:
            _PASS_TIME.append(time.perf_counter() - t0)
    return wrapper


cfg_optimize.CfgOptimize.run = _timed_pass(cfg_optimize.CfgOptimize.run)


def k_loop_kernel(loops):
    """Issue 12's compile-time kernel: ``loops`` top-level loops, each on its own pair of fields."""
    pairs = [(qd.field(qd.f32, shape=64), qd.field(qd.f32, shape=64)) for _ in range(loops)]
    src = ["def k_loops():"]
    for k in range(loops):
        src += ["    for i in range(64):", f"        b{k}[i] = a{k}[i] * 2.0 + 1.0",
                f"        a{k}[i] = b{k}[i] - a{k}[i]"]
    ns = {"qd": qd, **{f"a{k}": p[0] for k, p in enumerate(pairs)}, **{f"b{k}": p[1] for k, p in enumerate(pairs)}}
    exec(compile("\n".join(src) + "\n", f"<k_loops_{loops}>", "exec"), ns)
    return qd.kernel(ns["k_loops"])


def pass_scaling(sizes, rounds=3):
    """The untyped pipeline of the K-loop kernel with the pass off and on, and the pass alone
    (best of ``rounds``): the pass must stay linear in the number of tasks."""
    from qd_numba.passes.base import IRTools
    from qd_numba.targets.untyped import untyped_compile

    rows = []
    for loops in sizes:
        kernel = k_loop_kernel(loops)
        row = {"loops": loops}
        for on in (False, True):
            qd.init(arch=qd.cpu, cfg_optimization=on)
            best, best_pass = float("inf"), float("inf")
            for _ in range(rounds):
                _PASS_TIME.clear()
                t0 = time.perf_counter()
                untyped_compile(kernel, IRTools.for_cpu(), {}, {})
                best = min(best, time.perf_counter() - t0)
                best_pass = min(best_pass, sum(_PASS_TIME))
            row[on] = best
            row["pass"] = best_pass
        rows.append(row)
    return rows


def build(n, loops):
    side = int(round(n ** 0.5))
    x, v, f, m, e = (qd.field(qd.f32, shape=n) for _ in range(5))
    u, w = qd.field(qd.f32, shape=(side, side)), qd.field(qd.f32, shape=(side, side))

    @qd.kernel
    def integrate(dt: qd.f32, damping: qd.f32):
        for i in range(n):
            v[i] = v[i] + dt * f[i] / m[i]
            v[i] = v[i] * damping
            x[i] = x[i] + dt * v[i]
            if x[i] < 0.0:
                x[i] = -x[i]
                v[i] = -v[i]
            e[i] = 0.5 * m[i] * v[i] * v[i]

    @qd.kernel
    def stencil(k: qd.f32):
        for i, j in qd.ndrange((1, side - 1), (1, side - 1)):
            lap = u[i - 1, j] + u[i + 1, j] + u[i, j - 1] + u[i, j + 1] - 4.0 * u[i, j]
            w[i, j] = u[i, j] + k * lap
            if w[i, j] > 1.0:
                w[i, j] = 1.0

    k_loops = k_loop_kernel(loops)

    rng = np.random.default_rng(0)
    for fld in (x, v, f):
        fld.from_numpy(rng.random(n).astype(np.float32) - 0.5)
    m.from_numpy(rng.random(n).astype(np.float32) + 0.5)
    u.from_numpy(rng.random((side, side)).astype(np.float32))
    return {"integrate": (integrate, (0.01, 0.99)), "stencil": (stencil, (0.1,)), "k_loops": (k_loops, ())}


def counts(kernel, args):
    loads = stores = 0
    for task in kernel.tasks(*args):
        whats = [a.what for a in task.accesses]
        loads += whats.count("load") + whats.count("partial load")
        stores += whats.count("store")
    return loads, stores


def measure(arch, on, n, reps, loops):
    qd.init(arch=getattr(qd, arch), cfg_optimization=on)
    out = {}
    for name, (kernel, args) in build(n, loops).items():
        _PASS_TIME.clear()
        t0 = time.perf_counter()
        kernel(*args)
        qd.sync()
        compile_s = time.perf_counter() - t0
        times = []
        for _ in range(reps):
            t0 = time.perf_counter()
            kernel(*args)
            qd.sync()
            times.append(time.perf_counter() - t0)
        out[name] = dict(counts=counts(kernel, args), best=min(times), median=statistics.median(times),
                         compile=compile_s, pass_s=sum(_PASS_TIME))
    return out


def _combine(rounds):
    out = {}
    for name in rounds[0]:
        rs = [r[name] for r in rounds]
        out[name] = dict(counts=rs[0]["counts"], best=min(r["best"] for r in rs),
                         median=statistics.median(r["median"] for r in rs), compile=min(r["compile"] for r in rs),
                         pass_s=min(r["pass_s"] for r in rs))
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--arch", default="cpu", choices=("cpu", "cuda"))
    ap.add_argument("--n", type=int, default=4_000_000)
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--loops", type=int, default=32)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--scaling", default="8,32,128", help="loop counts of the compile-time scaling table")
    args = ap.parse_args()
    print("untyped pipeline of the K-loop kernel (best of 3), pass off / on, and the pass alone:\n")
    print("| K | untyped off (ms) | untyped on (ms) | pass (ms) | pass per task (ms) |")
    print("| --- | --- | --- | --- | --- |")
    for row in pass_scaling([int(k) for k in args.scaling.split(",")]):
        print(f"| {row['loops']} | {row[False] * 1e3:.1f} | {row[True] * 1e3:.1f} | {row['pass'] * 1e3:.1f} "
              f"| {row['pass'] * 1e3 / row['loops']:.2f} |")
    print()
    runs = {False: [], True: []}
    for _ in range(args.rounds):          # alternating, against the drift of a shared machine
        for on in (False, True):
            runs[on].append(measure(args.arch, on, args.n, args.reps, args.loops))
    off, on = (_combine(runs[flag]) for flag in (False, True))
    print(f"arch={args.arch} n={args.n} reps={args.reps} rounds={args.rounds} loops={args.loops} "
          f"(best: of all calls; median: of the rounds' medians; compile: best round)\n")
    print("| kernel | loads off → on | stores off → on | run best off / on (ms) | run median off / on (ms) "
          "| cold compile off / on (s) | pass time (ms) |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    for name in on:
        a, b = off[name], on[name]
        print(f"| {name} | {a['counts'][0]} → {b['counts'][0]} | {a['counts'][1]} → {b['counts'][1]} "
              f"| {a['best'] * 1e3:.2f} / {b['best'] * 1e3:.2f} | {a['median'] * 1e3:.2f} / {b['median'] * 1e3:.2f} "
              f"| {a['compile']:.2f} / {b['compile']:.2f} | {b['pass_s'] * 1e3:.1f} |")


if __name__ == "__main__":
    main()
