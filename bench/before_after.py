"""Before/after benchmark of two qd_numba trees, side by side in one run (a restructuring must
keep speed): launch cost (ndarray arguments; 16 fields), saxpy, cold compile of 1/8/32-loop
kernels on an ndarray and with each loop on its own pair of fields.

    python bench/before_after.py BEFORE_DIR AFTER_DIR --arch cpu|cuda [--rounds 2] [--loops 1,8,32] [--out F.json]

Each tree is a directory holding a ``qd_numba`` package (e.g. ``git archive <commit> qd_numba |
tar -x -C .before``). Every measurement runs in a fresh process with that tree first on
``PYTHONPATH``; the trees alternate within each round. Workloads use only the public API, so
both trees run the same source. Prints a markdown table (medians over rounds, after/before);
a cold compile is timed in wall seconds (``_s``) and in CPU seconds of its process (``_cpu_s``,
steadier on a shared machine; it includes the thread pool's spinning, if any).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import textwrap

HERE = os.path.dirname(os.path.abspath(__file__))

_CALLS = textwrap.dedent('''
    import json, sys
    import numpy as np
    import qd_numba as qd
    arch = sys.argv[1]
    qd.init(arch=getattr(qd, arch))
    sys.path.insert(0, sys.argv[2])
    import gpu_workloads
    if arch == "cuda":
        out = gpu_workloads.run_quadrants_api(qd, "qd_numba")
    else:
        @qd.kernel
        def copy(a: qd.types.ndarray(dtype=qd.f32, ndim=1), b: qd.types.ndarray(dtype=qd.f32, ndim=1)):
            for i in range(a.shape[0]):
                b[i] = a[i] + 1.0

        @qd.kernel
        def saxpy(s: qd.f32, x: qd.types.ndarray(dtype=qd.f32, ndim=1), y: qd.types.ndarray(dtype=qd.f32, ndim=1)):
            for i in range(x.shape[0]):
                y[i] = s * x[i] + y[i]

        def best(fn, reps):
            return gpu_workloads._best(fn, reps, repeats=7, sync=lambda: None)

        rng = np.random.default_rng(0)
        a, b = rng.random(16).astype(np.float32), np.zeros(16, np.float32)
        copy(a, b)
        assert np.allclose(b, a + 1)
        x, y = rng.random(1 << 24).astype(np.float32), rng.random(1 << 24).astype(np.float32)
        y0 = y.copy()
        saxpy(2.0, x, y)
        assert np.allclose(y, 2 * x + y0, rtol=1e-5)
        fields = [qd.field(qd.f32, shape=(16,)) for _ in range(16)]
        src = "def touch(s: qd.f32):\\n" + "".join(
            f"    for i in range(16):\\n        f{j + 1}[i] = f{j}[i] * s\\n" for j in range(0, 16, 2))
        ns = {"qd": qd, **{f"f{j}": f for j, f in enumerate(fields)}}
        exec(src, ns)
        touch = qd.kernel(ns["touch"])
        fields[0].from_numpy(a)
        touch(2.0)
        assert np.allclose(fields[1].to_numpy(), 2 * a)
        out = {"call_ndarrays_us": best(lambda: copy(a, b), 20000) * 1e6,
               "call_16_fields_8_loops_us": best(lambda: touch(2.0), 20000) * 1e6,
               "saxpy_ms": best(lambda: saxpy(2.0, x, y), 10) * 1e3}
    print("RESULT " + json.dumps(out))
''')

_COLD = textwrap.dedent('''
    import json, sys, time
    import numpy as np
    t0 = time.perf_counter()
    import qd_numba as qd
    arch, loops = sys.argv[1], int(sys.argv[2])
    qd.init(arch=getattr(qd, arch))
    a = qd.ndarray(qd.f32, shape=(4,)) if arch == "cuda" else np.zeros(4, np.float32)
    if sys.argv[3] == "fields":   # each loop on its own pair of fields (bench/compile_time.py's kernel)
        fields = {f"{x}{j}": qd.field(qd.f32, shape=(4096,)) for j in range(loops) for x in "ab"}
        src = "def k(a: qd.types.ndarray(dtype=qd.f32, ndim=1)):\\n" + "".join(
            f"    for i in range(4096):\\n        b{j}[i] = a{j}[i] * 2.0 + 1.0\\n" for j in range(loops))
        src += "    for i in range(a.shape[0]):\\n        a[i] = b0[i]\\n"
    else:
        fields = {}
        src = "def k(a: qd.types.ndarray(dtype=qd.f32, ndim=1)):\\n" + "".join(
            f"    for i in range(a.shape[0]):\\n        a[i] = a[i] + {j}.0\\n" for j in range(loops))
    ns = {"qd": qd, **fields}
    exec(src, ns)
    k = qd.kernel(ns["k"])
    t1, c1 = time.perf_counter(), time.process_time()
    k(a)
    qd.sync()
    t2, c2 = time.perf_counter(), time.process_time()
    got = a.to_numpy() if arch == "cuda" else a
    assert got[0] == (1.0 if fields else sum(range(loops))), got
    print("RESULT", json.dumps({"s": t2 - t1, "cpu_s": c2 - c1}))
''')


def _run(tree, args, program):
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([os.path.abspath(tree)] + [p for p in env.get("PYTHONPATH", "").split(
        os.pathsep) if p and os.path.abspath(p) != os.path.abspath(".")])
    env["NUMBA_CACHE_DIR"] = f"/tmp/qd_bench_nocache_{os.getpid()}"
    env["QD_OFFLINE_CACHE"] = "0"  # cold compiles must stay cold in every round
    env.pop("CUDA_CACHE_DISABLE", None)
    with tempfile.TemporaryDirectory(prefix="qd_cuda_jit_cache_") as jit_cache:
        env["CUDA_CACHE_PATH"] = jit_cache   # nor may the driver's PTX cache of an earlier round
        out = subprocess.run([sys.executable, "-c", program, *args], capture_output=True, text=True, env=env,
                             timeout=900, cwd="/tmp")
    if out.returncode != 0:
        raise RuntimeError(f"{tree}: {out.stderr[-3000:]}")
    line = next(ln for ln in out.stdout.splitlines() if ln.startswith("RESULT "))
    return json.loads(line[len("RESULT "):])


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("before")
    ap.add_argument("after")
    ap.add_argument("--arch", default="cpu", choices=("cpu", "cuda"))
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--loops", default="1,8,32")
    ap.add_argument("--out", help="also write every sample and the medians to this JSON file")
    opts = ap.parse_args()
    trees = {"before": opts.before, "after": opts.after}
    samples = {}
    for r in range(opts.rounds):
        order = ("before", "after") if r % 2 == 0 else ("after", "before")
        for name in order:
            for key, value in _run(trees[name], [opts.arch, HERE], _CALLS).items():
                if isinstance(value, (int, float)) and not isinstance(value, bool):
                    samples.setdefault((key, name), []).append(value)
            for loops in map(int, opts.loops.split(",")):
                for kind in ("ndarray", "fields"):
                    times = _run(trees[name], [opts.arch, str(loops), kind], _COLD)
                    suffix = "loops" if kind == "ndarray" else "field_loops"
                    for unit, t in times.items():   # wall seconds, and CPU seconds of the process
                        samples.setdefault((f"cold_compile_{loops}_{suffix}_{unit}", name), []).append(t)
        print(f"round {r + 1} done", file=sys.stderr, flush=True)
    keys = sorted({k for k, _ in samples})
    if opts.out:
        rows = {key: {name: {"median": statistics.median(samples[key, name]), "samples": samples[key, name]}
                      for name in trees if (key, name) in samples} for key in keys}
        with open(opts.out, "w") as f:
            json.dump({"before": os.path.abspath(opts.before), "after": os.path.abspath(opts.after),
                       "arch": opts.arch, "rounds": opts.rounds, "python": sys.version.split()[0],
                       "results": rows}, f, indent=1)
    print(f"| {opts.arch} | before | after | after / before |")
    print("| --- | --- | --- | --- |")
    for key in keys:
        b, a = samples.get((key, "before")), samples.get((key, "after"))
        if not a or not b:
            continue
        mb, ma = statistics.median(b), statistics.median(a)
        spread = f" ({', '.join(f'{v:.4g}' for v in b)} / {', '.join(f'{v:.4g}' for v in a)})"
        print(f"| {key} | {mb:.4g} | {ma:.4g} | {ma / mb:.2f} |{spread}")


if __name__ == "__main__":
    main()
