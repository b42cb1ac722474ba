"""Offline cache benchmark (CPU): a kernel's first call in a cold process and in a warm one.

    python bench/offline_cache_bench.py

The kernel has K top-level loops, each a few float ops on its own pair of fields (issue 12's
workload). Per K, with an empty cache directory: one process compiles (and writes the entry),
then three processes load it. Each process reports the start of Numba's thread pool (paid once
per process by every CPU program, cached or not) and the time to make the kernel ready (compile or
load: the compiled instance ready to launch; then one checked call).
Writes bench/results/offline_cache.md.
"""

import datetime
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import textwrap

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)


def source(loops: int) -> str:
    fields = "\n".join(f"a{k} = qd.field(qd.f32, shape=N)\nb{k} = qd.field(qd.f32, shape=N)" for k in range(loops))
    body = "\n".join(f"    for i in a{k}:\n        b{k}[i] = a{k}[i] * 2.0 + {k}.0 * a{k}[i]" for k in range(loops))
    return textwrap.dedent("""
import sys, time
import numpy as np
import qd_numba as qd
from qd_numba import offline_cache
from qd_numba.targets.cpu import ensure_threading_layer

qd.init(arch=qd.cpu, offline_cache_file_path=sys.argv[1])
N = 256
""") + fields + "\n\n@qd.kernel\ndef k():\n" + body + textwrap.dedent(f"""

t0 = time.perf_counter()
ensure_threading_layer()
t1 = time.perf_counter()
backend = k.backend()
backend._instance(())   # compile or load: the instance, ready to launch
t2 = time.perf_counter()
a{loops - 1}.from_numpy(np.arange(N, dtype=np.float32))
k()
assert np.allclose(b{loops - 1}.to_numpy(), np.arange(N) * (2.0 + {loops - 1}.0))
print(t1 - t0, t2 - t1, offline_cache.stats.hits)
""")


def one_process(src: str, cache: str) -> tuple:
    env = dict(os.environ, PYTHONPATH=REPO, QD_CUDA_COMPILE_CHECK="0")
    out = subprocess.run([sys.executable, "-c", src, cache], capture_output=True, text=True, env=env, timeout=600)
    if out.returncode != 0:
        raise RuntimeError(out.stderr[-2000:])
    threads, ready, hits = out.stdout.split()
    return float(threads), float(ready), int(hits)


def main():
    rows = []
    for loops in (1, 8, 32):
        src = source(loops)
        with tempfile.TemporaryDirectory() as cache:
            cold = one_process(src, cache)
            warm = [one_process(src, cache) for _ in range(3)]
        assert cold[2] == 0 and all(w[2] == 1 for w in warm), (cold, warm)
        ready = statistics.median(w[1] for w in warm)
        rows.append((loops, cold[1] * 1e3, ready * 1e3, statistics.median(w[0] for w in warm) * 1e3))
    lines = ["# Offline cache, CPU", "",
             f"{datetime.date.today()}, {platform.processor() or platform.machine()}, {os.cpu_count()} cores "
             "(shared), `python bench/offline_cache_bench.py`.", "",
             "Compile-to-ready: argument types to a launchable instance; warm: median of 3 processes.", "",
             "| K loops | cold process: compile | warm process: load | thread pool start (any process) |",
             "| --- | --- | --- | --- |"]
    lines += [f"| {k} | {cold:,.0f} ms | {warm:,.1f} ms | {threads:,.0f} ms |" for k, cold, warm, threads in rows]
    text = "\n".join(lines) + "\n"
    print(text)
    with open(os.path.join(HERE, "results", "offline_cache.md"), "w") as f:
        f.write(text)


if __name__ == "__main__":
    main()
