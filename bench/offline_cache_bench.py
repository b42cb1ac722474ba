"""Offline cache benchmark: a kernel's first call in a cold process and in a warm one.

    python bench/offline_cache_bench.py [cpu] [cuda]

The kernel has K top-level loops, each a few float ops on its own pair of fields (issue 12's
workload). Per K, with an empty cache directory: one process compiles (and writes the entry),
then three processes load it. Each process reports the set-up any program pays once (CPU: the
start of Numba's thread pool and NRT; CUDA: the context and runtime), cached or not, and the time to
make the kernel ready (compile or load: the CPU instance or CUDA launch plan, ready to launch;
then one checked call). Without arguments: the CPU, and CUDA when a GPU is present.
Writes bench/results/offline_cache.md (CPU) and bench/results/offline_cache_cuda.md.
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


SETUP = {  # per arch: qd.init, the set-up every process pays, the call that makes the kernel ready
    "cpu": ("qd.cpu", "from qd_numba.targets.cpu import start_runtime\nstart_runtime()",
            "k.backend()._instance(())"),
    "cuda": ("qd.cuda", "from qd_numba.targets.cuda.runtime import CudaRuntime\nCudaRuntime.get()",
             "k.backend().plan_for(())"),
}


def source(loops: int, arch: str) -> str:
    init, setup, ready = SETUP[arch]
    fields = "\n".join(f"a{k} = qd.field(qd.f32, shape=N)\nb{k} = qd.field(qd.f32, shape=N)" for k in range(loops))
    body = "\n".join(f"    for i in a{k}:\n        b{k}[i] = a{k}[i] * 2.0 + {k}.0 * a{k}[i]" for k in range(loops))
    return textwrap.dedent(f"""
import sys, time
import numpy as np
import qd_numba as qd
from qd_numba import offline_cache

qd.init(arch={init}, offline_cache_file_path=sys.argv[1])
N = 256
""") + fields + "\n\n@qd.kernel\ndef k():\n" + body + "\n\nt0 = time.perf_counter()\n" + setup + textwrap.dedent(f"""
t1 = time.perf_counter()
{ready}   # compile or load: ready to launch
t2 = time.perf_counter()
a{loops - 1}.from_numpy(np.arange(N, dtype=np.float32))
k()
assert np.allclose(b{loops - 1}.to_numpy(), np.arange(N) * (2.0 + {loops - 1}.0))
print(t1 - t0, t2 - t1, offline_cache.stats.hits)
""")


def one_process(src: str, cache: str) -> tuple:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([REPO, *filter(None, [os.environ.get("PYTHONPATH")])]),
               QD_CUDA_COMPILE_CHECK="0")
    out = subprocess.run([sys.executable, "-c", src, cache], capture_output=True, text=True, env=env, timeout=600)
    if out.returncode != 0:
        raise RuntimeError(out.stderr[-2000:])
    setup, ready, hits = out.stdout.split()
    return float(setup), float(ready), int(hits)


def measure(arch: str) -> list:
    rows = []
    for loops in (1, 8, 32):
        src = source(loops, arch)
        with tempfile.TemporaryDirectory() as cache:
            cold = one_process(src, cache)
            warm = [one_process(src, cache) for _ in range(3)]
        assert cold[2] == 0 and all(w[2] == 1 for w in warm), (cold, warm)
        ready = statistics.median(w[1] for w in warm)
        rows.append((loops, cold[1] * 1e3, ready * 1e3, statistics.median(w[0] for w in warm) * 1e3))
    return rows


def report(arch: str, rows: list) -> str:
    if arch == "cuda":
        from numba import cuda

        name = cuda.get_current_device().name
        machine = name.decode() if isinstance(name, bytes) else name
        title, setup = "CUDA", "CUDA context and runtime (any process)"
    else:
        machine = f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores (shared)"
        title, setup = "CPU", "thread pool and NRT start (any process)"
    lines = [f"# Offline cache, {title}", "",
             f"{datetime.date.today()}, {machine}, `python bench/offline_cache_bench.py {arch}`.", "",
             "Compile-to-ready: argument types to a launchable "
             + ("launch plan" if arch == "cuda" else "instance") + "; warm: median of 3 processes.", "",
             f"| K loops | cold process: compile | warm process: load | {setup} |",
             "| --- | --- | --- | --- |"]
    lines += [f"| {k} | {cold:,.0f} ms | {warm:,.1f} ms | {other:,.0f} ms |" for k, cold, warm, other in rows]
    return "\n".join(lines) + "\n"


def main():
    from qd_numba.targets.cuda.compile import cuda_available

    arches = sys.argv[1:] or ["cpu"] + (["cuda"] if cuda_available() else [])
    for arch in arches:
        text = report(arch, measure(arch))
        print(text)
        name = "offline_cache.md" if arch == "cpu" else f"offline_cache_{arch}.md"
        with open(os.path.join(HERE, "results", name), "w") as f:
            f.write(text)


if __name__ == "__main__":
    main()
