"""CPU benchmark: qd_numba kernels vs hand-written numba.njit(parallel=True) prange functions.

    python bench/cpu_bench.py

(a) per-call overhead (1 task, 2 ndarray args, n=16), (b) saxpy at 2**24 float32,
(c) cold compile time with 1/8/32 top-level loops, each in a fresh subprocess.
Prints a markdown table and writes bench/results/cpu.md.
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


def paired_median_times(fn_a, fn_b, reps, inner=1):
    """Median time per call of each function, measured alternately (a block of ``inner`` calls
    of one, then of the other, ``reps`` times), so that both see the same machine state."""
    times_a, times_b = [], []
    for _ in range(reps):
        for fn, times in ((fn_a, times_a), (fn_b, times_b)):
            t0 = time.perf_counter()
            for _ in range(inner):
                fn()
            times.append((time.perf_counter() - t0) / inner)
    return statistics.median(times_a), statistics.median(times_b)


@qd.kernel
def qd_add(a: qd.types.ndarray(dtype=qd.f32, ndim=1), b: qd.types.ndarray(dtype=qd.f32, ndim=1)):
    for i in range(a.shape[0]):
        b[i] = a[i] + 1.0


@numba.njit(parallel=True)
def nb_add(a, b):
    for i in numba.prange(a.shape[0]):
        b[i] = a[i] + np.float32(1.0)


@qd.kernel
def qd_saxpy(x: qd.types.ndarray(dtype=qd.f32, ndim=1), y: qd.types.ndarray(dtype=qd.f32, ndim=1), s: qd.f32):
    for i in range(x.shape[0]):
        y[i] = s * x[i] + y[i]


@numba.njit(parallel=True)
def nb_saxpy(x, y, s):
    for i in numba.prange(x.shape[0]):
        y[i] = s * x[i] + y[i]


def compile_source(kind, loops):
    body_qd = "\n".join(f"    for i in range(a.shape[0]):\n        a[i] = a[i] + {k}.0" for k in range(loops))
    body_nb = "\n".join(f"    for i in numba.prange(a.shape[0]):\n        a[i] = a[i] + {k}.0"
                        for k in range(loops))
    if kind == "qd":
        src = f"""
import time, numpy as np
t0 = time.perf_counter()
import qd_numba as qd
@qd.kernel
def k(a: qd.types.ndarray(dtype=qd.f32, ndim=1)):
{body_qd}
a = np.zeros(4, np.float32)
t1 = time.perf_counter()
k(a)
t2 = time.perf_counter()
assert a[0] == {sum(range(loops))}.0, a
print(t2 - t1)
"""
    else:
        src = f"""
import time, numpy as np
import numba
@numba.njit(parallel=True)
def k(a):
{body_nb}
a = np.zeros(4, np.float32)
t1 = time.perf_counter()
k(a)
t2 = time.perf_counter()
assert a[0] == {sum(range(loops))}.0, a
print(t2 - t1)
"""
    return textwrap.dedent(src)


def cold_compile(kind, loops):
    env = dict(os.environ, NUMBA_CACHE_DIR=os.path.join("/tmp", f"qd_bench_nocache_{os.getpid()}"))
    out = subprocess.run([sys.executable, "-c", compile_source(kind, loops)], capture_output=True, text=True,
                         env=env, timeout=300)
    if out.returncode != 0:
        raise RuntimeError(out.stderr[-2000:])
    return float(out.stdout.strip().splitlines()[-1])


def cpu_model():
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def main():
    rows = []
    # (a) per-call overhead
    a = np.random.default_rng(0).random(16, dtype=np.float32)
    b1, b2 = np.zeros_like(a), np.zeros_like(a)
    qd_add(a, b1)
    nb_add(a, b2)
    assert np.array_equal(b1, b2)
    t_qd, t_nb = paired_median_times(lambda: qd_add(a, b1), lambda: nb_add(a, b2), reps=200, inner=50)
    rows.append(("per-call overhead, 1 task, 2 ndarrays, n=16", t_qd * 1e6, t_nb * 1e6, "us"))

    # (b) saxpy 2**24
    n = 2 ** 24
    rng = np.random.default_rng(1)
    x = rng.random(n, dtype=np.float32)
    y1 = rng.random(n, dtype=np.float32)
    y2 = y1.copy()
    qd_saxpy(x, y1, 2.0)
    nb_saxpy(x, y2, np.float32(2.0))
    np.testing.assert_allclose(y1, y2, rtol=1e-6)
    t_qd, t_nb = paired_median_times(lambda: qd_saxpy(x, y1, 2.0), lambda: nb_saxpy(x, y2, np.float32(2.0)),
                                     reps=30)
    rows.append(("saxpy, 2**24 float32", t_qd * 1e3, t_nb * 1e3, "ms"))

    # (c) cold compile
    for loops in (1, 8, 32):
        t_qd = cold_compile("qd", loops)
        t_nb = cold_compile("nb", loops)
        rows.append((f"cold compile, {loops} top-level loop(s) (fresh process)", t_qd, t_nb, "s"))

    table = ["| benchmark | qd_numba | njit(parallel=True) | ratio qd/njit |", "|---|---:|---:|---:|"]
    for name, tq, tn, unit in rows:
        table.append(f"| {name} | {tq:.3g} {unit} | {tn:.3g} {unit} | {tq / tn:.2f}x |")
    table_md = "\n".join(table)
    print(table_md)

    meta = [
        "# qd_numba CPU benchmark",
        "",
        f"- date: {datetime.datetime.now(datetime.timezone.utc).isoformat(timespec='seconds')}",
        "- command: `python bench/cpu_bench.py`",
        f"- machine: {os.cpu_count()} CPUs (nproc), {cpu_model()}",
        f"- NUMBA_NUM_THREADS: {numba.config.NUMBA_NUM_THREADS} (default), threading layer: "
        f"{numba.threading_layer()}",
        f"- versions: python {platform.python_version()}, numba {numba.__version__}, numpy {np.__version__}, "
        f"qd_numba {qd.__version__}",
        "- timings: medians, qd_numba and Numba measured alternately; (a) 200 x 50 calls, (b) 30 calls, "
        "(c) one fresh `python -c` per cell, time of the first call (compile + run) after imports",
        "",
        table_md,
        "",
    ]
    os.makedirs(os.path.join(HERE, "results"), exist_ok=True)
    with open(os.path.join(HERE, "results", "cpu.md"), "w") as f:
        f.write("\n".join(meta))


if __name__ == "__main__":
    main()
