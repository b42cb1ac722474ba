"""Struct-for over sparse 2-D grids, side by side: qd_numba vs Quadrants (the same source under
``import qd_numba as qd`` and ``import quadrants as qd``, each case in a fresh process).

    python bench/sparse_bench.py [--arch cpu|cuda] [--impls qd_numba,quadrants] [--n 2048]
                                 [--fractions 0.01,0.1] [--cpu-threads N] [--out FILE.json]

An ``n`` x ``n`` grid holds two f32 fields placed together (``place(x, y)``) under one of:

* ``dense``: ``qd.root.dense(qd.ij, (n, n))`` -- every cell, the reference;
* ``bitmasked``: ``qd.root.bitmasked(qd.ij, (n, n))`` -- a random ``fraction`` of the cells active;
* ``pointer``: ``qd.root.pointer(qd.ij, (n/B, n/B)).dense(qd.ij, (B, B))`` (B = 8) -- a random
  ``fraction`` of the B x B blocks active, every cell of them written (so the same fraction of
  cells).

Cells are activated by a kernel that writes ``x`` at a list of indices (ndarray arguments). The
timed kernel is one struct-for, ``for i, j in x: y[i, j] = 2 * x[i, j] + 1``; it should cost in
proportion to the active cells. Time: host wall time per call, median of 7 batches, synchronised
before and after. Each case checks ``y`` against numpy (``2x + 1`` on active cells, 0 elsewhere).

qd_numba today stores sparse nodes at full size with a flag per cell, and a struct-for tests
every flag (docs/data_layout.md): its sparse times follow the whole grid, not the active cells.

``--cpu-threads N`` passes ``cpu_max_num_threads=N`` to both on the CPU (a loaded machine: 1).

Quadrants runs when ``import quadrants`` works in this interpreter (the 1.4.0 wheel is for
Python 3.12); otherwise it is skipped with a message. ``--impls quadrants`` alone runs it
under another interpreter: ``python3.12 bench/sparse_bench.py --impls quadrants``.
"""

import argparse
import importlib.util
import json
import os
import subprocess
import sys
import time

LAYOUTS = ("dense", "bitmasked", "pointer")
BLOCK = 8


def _median_call(fn, sync, batch, repeats=7):
    fn()
    sync()
    times = []
    for _ in range(repeats):
        sync()
        t0 = time.perf_counter()
        for _ in range(batch):
            fn()
        sync()
        times.append((time.perf_counter() - t0) / batch)
    times.sort()
    return times[len(times) // 2]


def active_cells(layout: str, n: int, fraction: float, seed: int = 7):
    """(i, j) of the cells to write, int32 each: all of them, a random fraction of the cells, or
    every cell of a random fraction of the BLOCK x BLOCK blocks."""
    import numpy as np

    rng = np.random.default_rng(seed)
    if layout == "dense":
        ii, jj = np.divmod(np.arange(n * n), n)
    elif layout == "bitmasked":
        ii, jj = np.divmod(rng.choice(n * n, max(1, int(round(fraction * n * n))), replace=False), n)
    else:
        nb = n // BLOCK
        bi, bj = np.divmod(rng.choice(nb * nb, max(1, int(round(fraction * nb * nb))), replace=False), nb)
        di, dj = np.divmod(np.arange(BLOCK * BLOCK), BLOCK)
        ii = (bi[:, None] * BLOCK + di[None, :]).ravel()
        jj = (bj[:, None] * BLOCK + dj[None, :]).ravel()
    return ii.astype(np.int32), jj.astype(np.int32)


def child(qd, layout: str, n: int, fraction: float, timed: bool = True) -> dict:
    """One case: build, activate, run and check; time the struct-for if ``timed``."""
    import numpy as np

    x, y = qd.field(qd.f32), qd.field(qd.f32)
    if layout == "dense":
        qd.root.dense(qd.ij, (n, n)).place(x, y)
    elif layout == "bitmasked":
        qd.root.bitmasked(qd.ij, (n, n)).place(x, y)
    else:
        qd.root.pointer(qd.ij, (n // BLOCK, n // BLOCK)).dense(qd.ij, (BLOCK, BLOCK)).place(x, y)

    @qd.kernel
    def scatter(ii: qd.types.ndarray(), jj: qd.types.ndarray(), v: qd.types.ndarray()):
        for k in range(ii.shape[0]):
            x[ii[k], jj[k]] = v[k]

    @qd.kernel
    def struct_for():
        for i, j in x:
            y[i, j] = 2.0 * x[i, j] + 1.0

    ii, jj = active_cells(layout, n, fraction)
    vals = np.random.default_rng(8).random(ii.shape[0], dtype=np.float32) + 0.5
    t0 = time.perf_counter()
    scatter(ii, jj, vals)
    qd.sync()
    scatter_first = time.perf_counter() - t0
    t0 = time.perf_counter()
    struct_for()
    qd.sync()
    first = time.perf_counter() - t0
    want = np.zeros((n, n), np.float32)
    want[ii, jj] = 2.0 * vals + 1.0
    ok = bool(np.array_equal(y.to_numpy(), want))
    out = {"layout": layout, "fraction": fraction if layout != "dense" else 1.0, "active_cells": int(ii.shape[0]),
           "first_call_s": first, "scatter_first_call_s": scatter_first, "ok": ok}
    if not timed:
        return out
    batch = max(3, min(200, int(0.2 / max(first, 1e-5))))
    ms = _median_call(struct_for, qd.sync, batch) * 1e3
    return {**out, "struct_for_ms": ms, "ns_per_active_cell": ms * 1e6 / ii.shape[0]}


def run_child(impl: str, arch: str, layout: str, n: int, fraction: float, cpu_threads: int) -> dict:
    cmd = [sys.executable, os.path.abspath(__file__), "--child", "--impl", impl, "--arch", arch,
           "--layout", layout, "--n", str(n), "--fraction", str(fraction), "--cpu-threads", str(cpu_threads)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=1800)
    for line in proc.stdout.splitlines():
        if line.startswith("RESULT "):
            return json.loads(line[7:])
    tail = (proc.stdout + proc.stderr).strip().splitlines()[-6:]
    return {"layout": layout, "fraction": fraction, "error": " | ".join(tail)}


def available(impl: str) -> bool:
    if importlib.util.find_spec(impl) is not None:
        return True
    print(f"sparse_bench: {impl} is not importable in Python {sys.version.split()[0]}: skipped")
    return False


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--impl", default="qd_numba", help=argparse.SUPPRESS)
    ap.add_argument("--layout", default="dense", help=argparse.SUPPRESS)
    ap.add_argument("--fraction", type=float, default=1.0, help=argparse.SUPPRESS)
    ap.add_argument("--impls", default="qd_numba,quadrants")
    ap.add_argument("--arch", default="cpu", choices=("cpu", "cuda"))
    ap.add_argument("--n", type=int, default=0, help="cells per axis (default 1024 on cpu, 4096 on cuda)")
    ap.add_argument("--fractions", default="0.01,0.1", help="fractions of active cells of the sparse layouts")
    ap.add_argument("--cpu-threads", type=int, default=0,
                    help="cpu_max_num_threads of qd.init on the CPU, both impls (default: all cores)")
    ap.add_argument("--out", default="", help="write the results as JSON")
    args = ap.parse_args()
    n = args.n or (4096 if args.arch == "cuda" else 1024)
    if n % BLOCK:
        ap.error(f"--n must be a multiple of {BLOCK}")
    if args.child:
        qd = importlib.import_module(args.impl)
        threads = {"cpu_max_num_threads": args.cpu_threads} if args.cpu_threads else {}
        qd.init(arch=getattr(qd, args.arch), offline_cache=False, **threads)
        print("RESULT " + json.dumps(child(qd, args.layout, n, args.fraction)))
        return
    fractions = [float(f) for f in args.fractions.split(",")]
    cases = [("dense", 1.0)] + [(layout, f) for layout in LAYOUTS[1:] for f in fractions]
    results = {"arch": args.arch, "n": n, "block": BLOCK, "cpu_threads": args.cpu_threads,
               "python": sys.version.split()[0],
               "date": time.strftime("%Y-%m-%d"), "impls": {}}
    impls = [impl for impl in args.impls.split(",") if available(impl)]
    for impl in impls:
        results["impls"][impl] = [run_child(impl, args.arch, layout, n, f, args.cpu_threads)
                                    for layout, f in cases]

    print(f"struct-for over a {n} x {n} grid ({args.arch}), ms per call (ns per active cell)")
    print(f"{'layout':10s} {'active':>7s}  " + "  ".join(f"{impl:>22s}" for impl in impls)
          + ("   qd_numba / quadrants" if len(impls) == 2 else ""))
    for k, (layout, f) in enumerate(cases):
        cells = []
        for impl in impls:
            r = results["impls"][impl][k]
            if "error" in r:
                cells.append(f"{'error':>22s}")
            else:
                bad = "" if r["ok"] else " WRONG"
                cells.append(f"{r['struct_for_ms']:10.3f} ({r['ns_per_active_cell']:7.2f}){bad:>3s}")
        ratio = ""
        if len(impls) == 2:
            a, b = (results["impls"][impl][k] for impl in impls)
            if "error" not in a and "error" not in b:
                ratio = f"   {a['struct_for_ms'] / b['struct_for_ms']:8.2f}x"
        print(f"{layout:10s} {f:7.1%}  " + "  ".join(cells) + ratio)
    for impl in impls:
        for r in results["impls"][impl]:
            if "error" in r:
                print(f"{impl} {r['layout']} {r['fraction']}: {r['error']}")
    if args.out:
        with open(args.out, "w") as fh:
            json.dump(results, fh, indent=1)
        print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
