"""The first call of a 1-loop kernel on CUDA, cold (it compiles) and warm (a later process finds
it in the offline cache): the two K = 1 goals of docs/compile_time.md. Needs a GPU.

    python3 bench/first_call.py [--processes 3] [--kernels 8] [--warm-processes 10] [--out F.json]

Cold: each process compiles a warm-up kernel first (Numba's and numba-cuda's one-time set-up,
which bench/process_start.py measures), then ``--kernels`` fresh 1-loop kernels, each on its own
pair of 2^16-element fields, each timed from the call to the end of a sync, with the compile
record's stages. Every process gets an empty CUDA JIT cache (``CUDA_CACHE_PATH``) and the
offline cache off. Warm: one process compiles a kernel into an offline cache; each of
``--warm-processes`` new processes times its first call of it (a hit: nothing compiles).
Prints medians and writes every sample as JSON.
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
import time

_CHILD = textwrap.dedent('''
    import json, sys, time
    import numpy as np
    import qd_numba as qd
    from qd_numba import profiler

    mode, kernels, cache = sys.argv[1], int(sys.argv[2]), sys.argv[3]
    if mode == "cold":
        qd.init(arch=qd.cuda, offline_cache=False)
    else:
        qd.init(arch=qd.cuda, offline_cache=True, offline_cache_file_path=cache)
    N = 1 << 16
    rng = np.random.default_rng(0)

    def make(name, scale):
        a, b = qd.field(qd.f32, shape=N), qd.field(qd.f32, shape=N)
        ns = {"qd": qd, "a": a, "b": b}
        source = f"def {name}():\\n    for i in a:\\n        b[i] = a[i] * {scale} + 0.25\\n"
        exec(compile(source, f"<{name}>", "exec"), ns)
        data = rng.random(N, dtype=np.float32)
        a.from_numpy(data)
        return qd.kernel(ns[name]), b, data * np.float32(scale) + np.float32(0.25)

    def first_call(kernel):
        qd.sync()
        records = len(profiler._compile_records)
        t = time.perf_counter()
        kernel()
        qd.sync()
        ms = (time.perf_counter() - t) * 1e3
        stages = {}
        if len(profiler._compile_records) > records:
            stages = {k: v * 1e3 for k, v in profiler._compile_records[records].stages.items()}
        return ms, stages

    out = []
    names = ["warm_up"] + [f"loop_{k}" for k in range(kernels)] if mode == "cold" else ["cached_loop"]
    for k, name in enumerate(names):
        kernel, b, expected = make(name, 1.5 + k)
        ms, stages = first_call(kernel)
        assert np.allclose(b.to_numpy(), expected, rtol=1e-6), f"{name}: wrong result"
        out.append({"kernel": name, "first_ms": ms, "stages": stages})
    print("RESULT " + json.dumps(out))
''')


def _run(mode: str, kernels: int, cache: str, jit_cache: str) -> list:
    env = dict(os.environ, CUDA_CACHE_PATH=jit_cache)
    env.pop("CUDA_CACHE_DISABLE", None)
    proc = subprocess.run([sys.executable, "-c", _CHILD, mode, str(kernels), cache], capture_output=True,
                          text=True, timeout=900, env=env)
    for line in proc.stdout.splitlines():
        if line.startswith("RESULT "):
            return json.loads(line[7:])
    raise RuntimeError(f"{mode} process failed:\n{proc.stderr[-3000:]}")


def _median(values) -> float:
    return statistics.median(values) if values else float("nan")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--processes", type=int, default=3)
    parser.add_argument("--kernels", type=int, default=8)
    parser.add_argument("--warm-processes", type=int, default=10)
    parser.add_argument("--out", default="")
    args = parser.parse_args()
    result = {"date": time.strftime("%Y-%m-%d"), "python": sys.version.split()[0], "cold": [], "warm": [],
              "warm_up": []}
    with tempfile.TemporaryDirectory() as tmp:
        for p in range(args.processes):
            samples = _run("cold", args.kernels, "", os.path.join(tmp, f"jit{p}"))
            result["warm_up"].append(samples[0])
            result["cold"].extend(samples[1:])
        cache, jit = os.path.join(tmp, "offline"), os.path.join(tmp, "jit-warm")
        _run("warm", 0, cache, jit)                  # writes the entry (and the driver's JIT cache)
        for _ in range(args.warm_processes):
            result["warm"].extend(_run("warm", 0, cache, jit))
    cold = [s["first_ms"] for s in result["cold"]]
    warm = [s["first_ms"] for s in result["warm"]]
    stages = sorted({k for s in result["cold"] for k in s["stages"]})
    warm_ups = [round(s["first_ms"]) for s in result["warm_up"]]
    print(f"cold K = 1 first call: median {_median(cold):.1f} ms over {len(cold)} kernels "
          f"(min {min(cold):.1f}, max {max(cold):.1f}); warm-up kernels {warm_ups} ms")
    for stage in stages:
        print(f"    {stage:22s} {_median([s['stages'].get(stage, 0.0) for s in result['cold']]):7.2f} ms")
    print(f"warm K = 1 first call (offline-cache hit): median {_median(warm):.2f} ms over {len(warm)} processes "
          f"(min {min(warm):.2f}, max {max(warm):.2f})")
    result["summary"] = {"cold_median_ms": _median(cold), "warm_median_ms": _median(warm)}
    if args.out:
        with open(args.out, "w") as f:
            json.dump(result, f, indent=1)


if __name__ == "__main__":
    main()
