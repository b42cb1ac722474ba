"""CPU benchmark: adjacent range-for task fusion on vs off (docs/fusion.md).

    python bench/fusion_bench.py            # writes bench/results/fusion_cpu.md

Cases, each one kernel compiled twice (``@qd.kernel(fuse=False)`` / ``fuse=True``):
(a) the 8-small-loops kernel: 8 back-to-back loops of 4096 float32 elements, each reading
    earlier loops' outputs (separate arrays) at the same index (same-thread read-after-write; fuses to 1 task);
(b) the same 8 loops on 8 unrelated arrays (disjoint resources);
(c) (a) at 2**22 elements, where memory traffic, not launches, dominates;
(d) cold compile time of (a).
Reported as time per call, median of repeats, and the unfused/fused ratio (> 1: fusion wins).
"""

import datetime
import os
import platform
import statistics
import subprocess
import sys
import textwrap
import time

import numba
import numpy as np

import qd_numba as qd

HERE = os.path.dirname(os.path.abspath(__file__))
F32 = qd.types.ndarray(dtype=qd.f32, ndim=1)


def make_chain(fuse):
    @qd.kernel(fuse=fuse)
    def chain(a: F32, t0: F32, t1: F32, t2: F32, t3: F32, t4: F32, t5: F32, t6: F32):
        for i in range(a.shape[0]):
            t0[i] = a[i] * 1.5 + 1.0
        for i in range(a.shape[0]):
            t1[i] = t0[i] * 0.5 - 2.0
        for i in range(a.shape[0]):
            t2[i] = t1[i] + t0[i]
        for i in range(a.shape[0]):
            t3[i] = t2[i] * t2[i]
        for i in range(a.shape[0]):
            t4[i] = t3[i] - t1[i]
        for i in range(a.shape[0]):
            t5[i] = t4[i] * 0.25
        for i in range(a.shape[0]):
            t6[i] = t5[i] + a[i]
        for i in range(a.shape[0]):
            a[i] = t6[i] * 0.125
    return chain


def make_disjoint(fuse):
    @qd.kernel(fuse=fuse)
    def disjoint(a0: F32, a1: F32, a2: F32, a3: F32, a4: F32, a5: F32, a6: F32, a7: F32):
        for i in range(a0.shape[0]):
            a0[i] = a0[i] * 1.5 + 1.0
        for i in range(a0.shape[0]):
            a1[i] = a1[i] * 0.5 - 2.0
        for i in range(a0.shape[0]):
            a2[i] = a2[i] + 3.0
        for i in range(a0.shape[0]):
            a3[i] = a3[i] * a3[i]
        for i in range(a0.shape[0]):
            a4[i] = a4[i] - 1.0
        for i in range(a0.shape[0]):
            a5[i] = a5[i] * 0.25
        for i in range(a0.shape[0]):
            a6[i] = a6[i] + 0.5
        for i in range(a0.shape[0]):
            a7[i] = a7[i] * 0.125
    return disjoint


def median_call(fn, args, reps, inner):
    fn(*args)
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        for _ in range(inner):
            fn(*args)
        times.append((time.perf_counter() - t0) / inner)
    return statistics.median(times)


def run_case(make, args_of, n, reps, inner):
    rng = np.random.default_rng(0)
    results, outs = {}, {}
    for fuse in (False, True):
        k = make(fuse)
        args = args_of(rng if fuse is False else np.random.default_rng(0), n)
        tasks = len(k.tasks(*args))
        results[fuse] = (median_call(k, args, reps, inner), tasks)
        outs[fuse] = args
    for x, y in zip(outs[False], outs[True]):
        np.testing.assert_array_equal(x, y)     # the same inputs and the same number of calls
    return results


def chain_args(rng, n):
    return (rng.standard_normal(n).astype(np.float32), *(np.zeros(n, np.float32) for _ in range(7)))


def disjoint_args(rng, n):
    return tuple(rng.standard_normal(n).astype(np.float32) for _ in range(8))


COMPILE_SNIPPET = textwrap.dedent("""
    import sys, time
    sys.path.insert(0, {here!r})
    import numpy as np, qd_numba as qd
    from fusion_bench import make_chain, chain_args
    k = make_chain({fuse})
    args = chain_args(np.random.default_rng(0), 4096)
    t0 = time.perf_counter(); k(*args); print(time.perf_counter() - t0)
""")


def compile_time(fuse, reps=3):
    times = []
    for _ in range(reps):
        out = subprocess.run([sys.executable, "-c", COMPILE_SNIPPET.format(here=HERE, fuse=fuse)],
                             capture_output=True, text=True, check=True)
        times.append(float(out.stdout.strip().splitlines()[-1]))
    return statistics.median(times)


def main():
    qd.init()
    rows = []
    for label, make, args_of, n, reps, inner in (
            ("(a) 8 small loops, chained (RAW), n=4096", make_chain, chain_args, 4096, 31, 200),
            ("(b) 8 small loops, disjoint arrays, n=4096", make_disjoint, disjoint_args, 4096, 31, 200),
            ("(c) 8 loops, chained (RAW), n=2**22", make_chain, chain_args, 2**22, 7, 2)):
        res = run_case(make, args_of, n, reps, inner)
        (tu, nu), (tf, nf) = res[False], res[True]
        rows.append((label, f"{nu} -> {nf}", f"{tu * 1e6:.1f} us", f"{tf * 1e6:.1f} us", f"{tu / tf:.2f}x"))
        print(rows[-1], flush=True)
    cu, cf = compile_time(False), compile_time(True)
    rows.append(("(d) cold compile of (a)", rows[0][1], f"{cu:.2f} s", f"{cf:.2f} s", f"{cu / cf:.2f}x"))
    print(rows[-1], flush=True)

    table = ["| case | tasks | unfused | fused | unfused / fused |", "| --- | --- | --- | --- | --- |"]
    table += [f"| {' | '.join(r)} |" for r in rows]
    try:
        cpu = subprocess.run(["lscpu"], capture_output=True, text=True).stdout
        model = next((line.split(":", 1)[1].strip() for line in cpu.splitlines() if "Model name" in line), "?")
    except OSError:
        model = platform.processor() or "?"
    text = "\n".join([
        "# Fusion of adjacent range-for tasks: CPU",
        "",
        f"- date: {datetime.date.today().isoformat()}",
        f"- machine: {model}, {os.cpu_count()} logical CPUs, {platform.system()} {platform.release()}",
        f"- versions: Python {platform.python_version()}, numba {numba.__version__}, numpy {np.__version__}, "
        f"threading layer {numba.threading_layer()}, {numba.get_num_threads()} threads",
        "- command: `python bench/fusion_bench.py`",
        "- per-call time: median over repeats of a timed batch of calls; ratio > 1 means fusion is faster",
        "",
        *table,
        "",
    ])
    os.makedirs(os.path.join(HERE, "results"), exist_ok=True)
    with open(os.path.join(HERE, "results", "fusion_cpu.md"), "w") as f:
        f.write(text)
    print(text)


if __name__ == "__main__":
    main()
