"""Compile time, disk cache, reductions and autodiff, side by side: the same source run under
``import qd_numba as qd`` and ``import quadrants as qd`` (each workload in a fresh process).

    python bench/side_by_side.py [--arch cuda|cpu] [--impls qd_numba,quadrants] [--out FILE.json]

Workloads (each in its own process, so nothing is warm that should not be):

* ``compile K=1/8/32``: a kernel of K top-level loops, each a few float ops on its own pair of
  fields (2^16 elements). ``cold_ms``: the first call (compile + launch) minus a later call, with
  an empty offline-cache directory; ``warm_ms``: the same in a second process that finds the
  cache of the first. Both processes of a pair share a CUDA JIT cache directory
  (``CUDA_CACHE_PATH``) that starts empty: the driver's PTX cache (``~/.nv/ComputeCache``, which
  also serves numba-cuda's link step on some installs) must not make a "cold" compile warm, and a
  warm process finds what its cold one left there, as on a user's machine.
* ``sum``: ``s[None] += x[i]`` over 2^20 float32 (one address for every thread).
* ``anchor``: N = 2^16 threads each running ``v = x[i]; for j in range(n[None]): v = qd.sin(v)
  * 1.01; loss[None] += v`` with n = 32 -- forward call and ``kernel.grad()`` call.

Times are host wall time per call (median of 7 repeats of a batch, synchronised before and after).
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile
import textwrap
import time

HERE = os.path.dirname(os.path.abspath(__file__))


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


def _compile_module(impl: str, k: int) -> str:
    """Source of a module defining a K-loop kernel (fields created at import, after qd.init)."""
    lines = [f"import {impl} as qd", "import os", "N = 1 << 16"]
    lines.append(f"fa = [qd.field(qd.f32, shape=N) for _ in range({k})]")
    lines.append(f"fb = [qd.field(qd.f32, shape=N) for _ in range({k})]")
    for j in range(k):
        lines.append(f"a{j} = fa[{j}]\nb{j} = fb[{j}]")
    lines.append("@qd.kernel\ndef k_loops():")
    for j in range(k):
        lines.append(f"    for i in a{j}:\n        b{j}[i] = a{j}[i] * 1.5 + qd.sin(a{j}[i]) - 0.25")
    return "\n".join(lines) + "\n"


def child_compile(qd, k: int, workdir: str) -> dict:
    import importlib

    import numpy as np

    sys.path.insert(0, workdir)
    path = os.path.join(workdir, f"loops{k}.py")
    if not os.path.exists(path):
        with open(path, "w") as f:
            f.write(_compile_module(qd.__name__, k))
    mod = importlib.import_module(f"loops{k}")
    rng = np.random.default_rng(1)
    for f in mod.fa:
        f.from_numpy(rng.random(1 << 16, dtype=np.float32))
    qd.sync()
    t0 = time.perf_counter()
    mod.k_loops()
    qd.sync()
    first = time.perf_counter() - t0
    later = _median_call(mod.k_loops, qd.sync, 3, repeats=3)
    a, b = mod.fa[-1].to_numpy(), mod.fb[-1].to_numpy()
    err = float(np.max(np.abs(b - (a * 1.5 + np.sin(a) - 0.25))))
    return {"first_ms": first * 1e3, "call_ms": later * 1e3, "compile_ms": (first - later) * 1e3, "max_err": err}


def child_sum(qd) -> dict:
    import numpy as np

    n = 1 << 20
    x = qd.field(qd.f32, shape=n)
    s = qd.field(qd.f32, shape=())

    @qd.kernel
    def total():
        for i in x:
            s[None] += x[i]

    data = np.random.default_rng(2).random(n, dtype=np.float32)
    x.from_numpy(data)
    s[None] = 0.0
    total()
    qd.sync()
    rel = abs(float(s[None]) - float(data.astype(np.float64).sum())) / float(data.sum())
    return {"sum_ms": _median_call(total, qd.sync, 50) * 1e3, "rel_err": rel}


def child_anchor(qd) -> dict:
    import numpy as np

    n_threads, depth = 1 << 16, 32
    x = qd.field(qd.f32, shape=n_threads, needs_grad=True)
    n = qd.field(qd.i32, shape=())
    loss = qd.field(qd.f32, shape=(), needs_grad=True)

    @qd.kernel
    def forward():
        for i in x:
            v = x[i]
            for _ in range(n[None]):
                v = qd.sin(v) * 1.01
            loss[None] += v

    data = np.random.default_rng(3).random(n_threads, dtype=np.float32)
    x.from_numpy(data)
    n[None] = depth
    out = {"forward_ms": _median_call(forward, qd.sync, 50) * 1e3}
    loss.grad[None] = 1.0
    x.grad.fill(0.0)
    forward.grad()
    qd.sync()
    v64, d64 = data.astype(np.float64), np.ones(n_threads)
    for _ in range(depth):
        d64 = d64 * np.cos(v64) * 1.01
        v64 = np.sin(v64) * 1.01
    g = x.grad.to_numpy()
    out["grad_rel_err"] = float(np.linalg.norm(g - d64) / np.linalg.norm(d64))
    out["backward_ms"] = _median_call(forward.grad, qd.sync, 50) * 1e3
    return out


def child(args) -> None:
    if args.impl == "quadrants":
        import quadrants as qd
    else:
        import qd_numba as qd
    init = {"arch": getattr(qd, args.arch)}
    if args.workload == "compile":
        init.update(offline_cache=True, offline_cache_file_path=args.cache_dir)
    else:
        init["offline_cache"] = False
    if args.impl == "quadrants" and args.workload == "anchor":
        # Quadrants refuses a dynamic inner range in reverse mode without it
        init["ad_stack_experimental_enabled"] = True
    qd.init(**init)
    if args.workload == "compile":
        res = child_compile(qd, args.k, args.workdir)
    elif args.workload == "sum":
        res = child_sum(qd)
    else:
        res = child_anchor(qd)
    print("RESULT " + json.dumps(res))


def run_child(impl, workload, arch, env=None, **kw) -> dict:
    cmd = [sys.executable, os.path.abspath(__file__), "--child", "--impl", impl, "--workload", workload, "--arch", arch]
    for key, val in kw.items():
        cmd += [f"--{key.replace('_', '-')}", str(val)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=900, env=env)
    for line in proc.stdout.splitlines():
        if line.startswith("RESULT "):
            return json.loads(line[7:])
    tail = (proc.stdout + proc.stderr).strip().splitlines()[-6:]
    return {"error": " | ".join(tail)}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--child", action="store_true")
    ap.add_argument("--impl", default="qd_numba")
    ap.add_argument("--impls", default="qd_numba,quadrants")
    ap.add_argument("--workload", default="compile")
    ap.add_argument("--arch", default="cuda")
    ap.add_argument("--k", type=int, default=1)
    ap.add_argument("--ks", default="1,8,32")
    ap.add_argument("--cache-dir", default="")
    ap.add_argument("--workdir", default="")
    ap.add_argument("--out", default="")
    args = ap.parse_args()
    if args.child:
        child(args)
        return
    results = {"arch": args.arch, "python": sys.version.split()[0], "date": time.strftime("%Y-%m-%d")}
    for impl in args.impls.split(","):
        res = results[impl] = {}
        for k in map(int, args.ks.split(",")):
            with tempfile.TemporaryDirectory() as tmp:
                cache, work = os.path.join(tmp, "cache"), os.path.join(tmp, "src")
                os.makedirs(work)
                env = dict(os.environ, CUDA_CACHE_PATH=os.path.join(tmp, "cuda_jit_cache"))
                env.pop("CUDA_CACHE_DISABLE", None)
                cold = run_child(impl, "compile", args.arch, env, k=k, cache_dir=cache, workdir=work)
                warm = run_child(impl, "compile", args.arch, env, k=k, cache_dir=cache, workdir=work)
            res[f"compile_K{k}"] = {"cold": cold, "warm": warm}
        res["sum"] = run_child(impl, "sum", args.arch)
        res["anchor"] = run_child(impl, "anchor", args.arch)
    text = json.dumps(results, indent=1)
    if args.out:
        with open(args.out, "w") as f:
            f.write(text + "\n")
    print(textwrap.shorten(text, 100000))
    nan = float("nan")
    for impl in args.impls.split(","):
        r = results[impl]
        row = [f"{impl:10s}"]
        for k in map(int, args.ks.split(",")):
            cold, warm = (r[f"compile_K{k}"][w].get("compile_ms", nan) for w in ("cold", "warm"))
            row.append(f"K{k} cold {cold:.0f} warm {warm:.1f} ms")
        row.append(f"sum {r['sum'].get('sum_ms', nan):.4f} ms")
        anchor = r["anchor"]
        row.append(f"fwd {anchor.get('forward_ms', nan):.4f} bwd {anchor.get('backward_ms', nan):.4f} ms")
        print(" | ".join(row))


if __name__ == "__main__":
    main()
