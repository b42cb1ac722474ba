"""MPM88 substeps per second, side by side: qd_numba vs Quadrants, the same program under both.

    python bench/mpm88_bench.py [--arch cpu|cuda] [--impls qd_numba,quadrants] [--n 8192]
                                [--grid 128] [--steps 2000] [--layouts aos,soa] [--cpu-threads N]
                                [--out FILE.json]

The program is examples/mpm88.py (a 2-D MLS-MPM fluid: P2G with atomics, grid update, G2P, as
an ``@qd.data_oriented`` class with Vector/Matrix fields). It uses only names that Quadrants
has, so the Quadrants version is the same file with ``import quadrants as qd``: each case
writes that copy to a temporary folder and runs it in a fresh process (nothing warm that should
not be, no offline cache).

Per case (impl, particle layout): the example's own checks at 512 particles (mass and momentum
conservation, one substep against numpy), then a block of ``n`` particles thrown at the floor:
10 substeps to warm up (the compiles), then ``steps`` substeps timed (host wall time,
synchronised before and after) -> substeps per second. ``x_mean`` (the particles' mean position
at the end) should be close between the implementations: the same start, the same algorithm,
but atomic sums in another order, so not bit-equal.

``--cpu-threads N`` passes ``cpu_max_num_threads=N`` to both on the CPU (a loaded machine: 1).

Quadrants runs when ``import quadrants`` works in this interpreter (the 1.4.0 wheel is for
Python 3.12); otherwise it is skipped with a message. ``--impls quadrants`` alone runs it
under another interpreter: ``python3.12 bench/mpm88_bench.py --impls quadrants``.
"""

import argparse
import importlib
import importlib.util
import json
import os
import subprocess
import sys
import tempfile
import time

EXAMPLE = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "examples", "mpm88.py")


def program_source(impl: str) -> str:
    """examples/mpm88.py importing ``impl`` as qd."""
    with open(EXAMPLE) as fh:
        text = fh.read()
    line = "import qd_numba as qd\n"
    if text.count(line) != 1:
        raise RuntimeError(f"{EXAMPLE} should import qd_numba as qd exactly once")
    return text.replace(line, f"import {impl} as qd\n")


def child(impl: str, arch: str, n: int, grid: int, steps: int, layout: str, workdir: str, cpu_threads: int) -> dict:
    import numpy as np

    path = os.path.join(workdir, f"mpm88_{impl}.py")
    with open(path, "w") as fh:
        fh.write(program_source(impl))
    sys.path.insert(0, workdir)
    mpm = importlib.import_module(f"mpm88_{impl}")
    qd = mpm.qd
    threads = {"cpu_max_num_threads": cpu_threads} if cpu_threads else {}
    qd.init(arch=getattr(qd, arch), offline_cache=False, **threads)
    checks = mpm.check(512, 32)
    sim = mpm.MPM88(n, grid, layout=layout)
    sim.init_random(np.random.default_rng(1), lo=0.15, hi=0.45, speed=0.5)
    sim.v.from_numpy(sim.v.to_numpy() + np.float32([0.0, -3.0]))
    sim.C.fill(0.0)
    sim.J.fill(1.0)
    qd.sync()
    t0 = time.perf_counter()
    for _ in range(10):
        sim.substep()
    qd.sync()
    warm = time.perf_counter() - t0
    t0 = time.perf_counter()
    for _ in range(steps):
        sim.substep()
    qd.sync()
    elapsed = time.perf_counter() - t0
    x = sim.x.to_numpy()
    inside = bool(np.all(np.isfinite(x)) and np.all((x > 0.0) & (x < 1.0)))
    return {"layout": layout, "substeps_per_s": steps / elapsed, "us_per_substep": elapsed / steps * 1e6,
            "warmup_s": warm, "x_mean": [float(v) for v in x.mean(axis=0)], "inside": inside,
            "checks": {name: bool(ok) for name, ok, _ in checks},
            "ok": inside and all(bool(ok) for _, ok, _ in checks)}


def run_child(impl: str, arch: str, n: int, grid: int, steps: int, layout: str, cpu_threads: int) -> dict:
    with tempfile.TemporaryDirectory() as work:
        cmd = [sys.executable, os.path.abspath(__file__), "--child", "--impl", impl, "--arch", arch, "--n", str(n),
               "--grid", str(grid), "--steps", str(steps), "--layouts", layout, "--workdir", work,
               "--cpu-threads", str(cpu_threads)]
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=3600)
    for line in proc.stdout.splitlines():
        if line.startswith("RESULT "):
            return json.loads(line[7:])
    tail = (proc.stdout + proc.stderr).strip().splitlines()[-6:]
    return {"layout": layout, "error": " | ".join(tail)}


def available(impl: str) -> bool:
    if importlib.util.find_spec(impl) is not None:
        return True
    print(f"mpm88_bench: {impl} is not importable in Python {sys.version.split()[0]}: skipped")
    return False


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--impl", default="qd_numba", help=argparse.SUPPRESS)
    ap.add_argument("--workdir", default="", help=argparse.SUPPRESS)
    ap.add_argument("--impls", default="qd_numba,quadrants")
    ap.add_argument("--arch", default="cpu", choices=("cpu", "cuda"))
    ap.add_argument("--n", type=int, default=0, help="particles (default 2048 on cpu, 8192 on cuda)")
    ap.add_argument("--grid", type=int, default=0, help="grid cells per axis (default 64 on cpu, 128 on cuda)")
    ap.add_argument("--steps", type=int, default=0, help="timed substeps (default 200 on cpu, 2000 on cuda)")
    ap.add_argument("--layouts", default="aos,soa", help="particle layouts: aos, soa, blocked")
    ap.add_argument("--cpu-threads", type=int, default=0,
                    help="cpu_max_num_threads of qd.init on the CPU, both impls (default: all cores)")
    ap.add_argument("--out", default="", help="write the results as JSON")
    args = ap.parse_args()
    cuda = args.arch == "cuda"
    n = args.n or (8192 if cuda else 2048)
    grid = args.grid or (128 if cuda else 64)
    steps = args.steps or (2000 if cuda else 200)
    layouts = args.layouts.split(",")
    if args.child:
        print("RESULT " + json.dumps(child(args.impl, args.arch, n, grid, steps, layouts[0], args.workdir,
                                         args.cpu_threads)))
        return
    results = {"arch": args.arch, "n": n, "grid": grid, "steps": steps, "cpu_threads": args.cpu_threads,
               "python": sys.version.split()[0],
               "date": time.strftime("%Y-%m-%d"), "impls": {}}
    impls = [impl for impl in args.impls.split(",") if available(impl)]
    for impl in impls:
        results["impls"][impl] = [run_child(impl, args.arch, n, grid, steps, layout, args.cpu_threads)
                                    for layout in layouts]

    print(f"MPM88, {n} particles, {grid}^2 grid, {steps} substeps ({args.arch}): substeps/s")
    print(f"{'layout':8s}" + "".join(f"{impl:>14s}" for impl in impls)
          + ("   qd_numba / quadrants" if len(impls) == 2 else ""))
    for k, layout in enumerate(layouts):
        row = [results["impls"][impl][k] for impl in impls]
        cells = [f"{'error':>14s}" if "error" in r else f"{r['substeps_per_s']:11.1f}{'' if r['ok'] else ' !!':>3s}"
                 for r in row]
        ratio = ""
        if len(row) == 2 and all("error" not in r for r in row):
            ratio = f"   {row[0]['substeps_per_s'] / row[1]['substeps_per_s']:8.2f}x"
        print(f"{layout:8s}" + "".join(cells) + ratio)
    for impl in impls:
        for r in results["impls"][impl]:
            if "error" in r:
                print(f"{impl} {r['layout']}: {r['error']}")
            elif not r["ok"]:
                print(f"{impl} {r['layout']}: a check failed: {r['checks']}, inside the domain: {r['inside']}")
            else:
                print(f"{impl} {r['layout']}: x_mean {r['x_mean'][0]:.5f} {r['x_mean'][1]:.5f}, "
                      f"warm-up (compiles) {r['warmup_s']:.1f} s")
    if args.out:
        with open(args.out, "w") as fh:
            json.dump(results, fh, indent=1)
        print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
