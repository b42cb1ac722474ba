"""Cold compile time of a kernel of K top-level loops, K = 1, 2, 4, ..., 128, per compile stage,
next to the same loops written for Numba by hand.

    python bench/compile_time.py [--arch cpu|cuda|cuda-compile|all] [--max-k 128] [--repeat 1]
                                 [--out bench/results] [--note "what else ran on the machine"]

Kernel: loop j is ``b_j[i] = a_j[i] * 2 + 1`` over its own pair of 4096-f32 fields. Each
measurement is a fresh process that first compiles and runs a 1-loop kernel (one-time imports
and set-up are not compile time of the K-loop kernel), then times the first call of the K-loop
kernel; the stages come from its compile record (qd_numba/profiler.py). Every process gets an
empty CUDA JIT cache directory (``CUDA_CACHE_PATH``): the driver caches PTX it compiled in
``~/.nv/ComputeCache`` across processes, and on installs where numba-cuda links through the
driver's linker that cache turns the link step of a kernel compiled before into a 0.7 ms lookup
(measured on an H100 host: 15-24 ms uncached), which a cold compile must not get. References:

- cpu: one hand-written ``numba.njit`` function holding the K loops (serial; Numba's cache off);
- cuda (needs a GPU): qd_numba as configured (worker processes lower the tasks) and with
  ``compile_processes=1``; K hand-written ``numba.cuda.jit`` kernels, each compiled and launched once;
- cuda-compile (no GPU needed): qd_numba's CUDA compile down to cubins (the suite's compile
  check), once with ``compile_threads=1`` and once with the default pool.

``--repeat R`` measures every series R times per K, the series alternating within each round (a
host whose speed drifts affects them alike), and reports the median.

Results: ``compile_time.json`` (every measurement, the machine, the load average before and
after each one) and ``compile_time.svg`` (log-log plot of the median seconds against K), both in
``--out``.
Timings, not operation counts: tests/test_compile_growth.py checks the growth without timing.
"""

from __future__ import annotations

import argparse
import datetime
import json
import math
import os
import platform
import subprocess
import sys
import tempfile
import textwrap

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
N = 4096

_WORKER = textwrap.dedent('''
    import json, sys, time
    import numpy as np
    impl, K, N = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])

    def qd_kernel(qd, k, name):
        fields = {}
        src = [f"def {name}():"]
        for j in range(k):
            fields[f"a{j}"] = qd.field(qd.f32, shape=(N,))
            fields[f"b{j}"] = qd.field(qd.f32, shape=(N,))
            src += [f"    for i in range({N}):", f"        b{j}[i] = a{j}[i] * 2.0 + 1.0"]
        ns = dict(fields)
        exec(compile("\\n".join(src) + "\\n", f"<{name}>", "exec"), ns)
        return qd.kernel(ns[name]), fields

    def njit_function(k, name):
        args = ", ".join(f"a{j}, b{j}" for j in range(k))
        src = [f"def {name}({args}):"]
        for j in range(k):
            src += [f"    for i in range(a{j}.shape[0]):", f"        b{j}[i] = a{j}[i] * 2.0 + 1.0"]
        ns = {}
        exec("\\n".join(src) + "\\n", ns)
        return ns[name]

    def cuda_kernels(cuda, k, tag):
        out = []
        for j in range(k):
            ns = {"cuda": cuda}
            exec(f"def loop_{tag}_{j}(a, b):\\n"
                 "    for i in range(cuda.grid(1), a.shape[0], cuda.gridsize(1)):\\n"
                 "        b[i] = a[i] * 2.0 + 1.0\\n", ns)
            out.append(cuda.jit(ns[f"loop_{tag}_{j}"]))
        return out

    result = {}
    if impl.startswith("qd"):
        import qd_numba as qd
        arch = impl.split("-", 1)[1]
        # no offline cache: the warm-up kernel must compile here, or the K-loop kernel pays the
        # one-time set-up (Numba's and numba-cuda's typing registries) it is there to exclude
        if arch == "cpu":
            qd.init(arch=qd.cpu, offline_cache=False)
        elif arch == "cuda":
            qd.init(arch=qd.cuda, offline_cache=False)
        elif arch == "cudaserial":      # every task lowered in the compiling process (no workers)
            qd.init(arch=qd.cuda, offline_cache=False, compile_processes=1)
            arch = "cuda"
        else:
            threads = int(arch.rsplit("threads", 1)[1])
            qd.init(arch=qd.cpu, compile_threads=threads, offline_cache=False)
        warm, _ = qd_kernel(qd, 1, "warm_up")
        if arch.startswith("compile"):
            from qd_numba.targets.cuda.plan import compile_check
            compile_check(warm, {}, {})
            kernel, fields = qd_kernel(qd, K, f"loops_{K}")
            t0 = time.perf_counter()
            compile_check(kernel, {}, {})
            result["seconds"] = time.perf_counter() - t0
            target = "cuda (compile check)"
        else:
            warm()
            kernel, fields = qd_kernel(qd, K, f"loops_{K}")
            x = np.random.default_rng(K).uniform(-1, 1, N).astype(np.float32)
            fields[f"a{K - 1}"].from_numpy(x)
            t0 = time.perf_counter()
            kernel()
            qd.sync()
            result["seconds"] = time.perf_counter() - t0
            assert np.allclose(fields[f"b{K - 1}"].to_numpy(), x * 2 + 1, rtol=1e-6)
            target = arch
        (record,) = qd.profiler.query_compile_info(kernel.qualname, target).records
        result["compile_seconds"] = record.seconds
        result["stages"] = record.stages
        result["threads"] = record.threads
    elif impl == "njit-cpu":
        import numba
        numba.njit(njit_function(1, "warm_up"))(np.zeros(4, np.float32), np.zeros(4, np.float32))
        fn = numba.njit(njit_function(K, f"loops_{K}"))
        arrays = [np.random.default_rng(j).uniform(-1, 1, N).astype(np.float32) for j in range(2 * K)]
        t0 = time.perf_counter()
        fn(*arrays)
        result["seconds"] = time.perf_counter() - t0
        assert np.allclose(arrays[-1], arrays[-2] * 2 + 1, rtol=1e-6)
    elif impl == "numba-cuda":
        from numba import cuda
        a, b = cuda.to_device(np.ones(N, np.float32)), cuda.device_array(N, np.float32)
        cuda_kernels(cuda, 1, "warm")[0][32, 128](a, b)
        cuda.synchronize()
        kernels = cuda_kernels(cuda, K, "k")
        t0 = time.perf_counter()
        for kern in kernels:
            kern[32, 128](a, b)
        cuda.synchronize()
        result["seconds"] = time.perf_counter() - t0
        assert np.allclose(b.copy_to_host(), 3.0)
    print("RESULT " + json.dumps(result))
''')

SERIES = {   # arch -> (series name, worker impl)
    "cpu": [("qd_numba cpu", "qd-cpu"), ("numba.njit, one function (cpu)", "njit-cpu")],
    "cuda": [("qd_numba cuda", "qd-cuda"), ("qd_numba cuda, one process (compile_processes=1)", "qd-cudaserial"),
             ("numba-cuda, K kernels", "numba-cuda")],
    "cuda-compile": [("qd_numba cuda compile-only, 1 thread", "qd-compilethreads1"),
                     ("qd_numba cuda compile-only, default threads", "qd-compilethreads0")],
}


def measure(impl: str, k: int) -> dict:
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    env.pop("QD_CUDA_COMPILE_CHECK", None)
    env.pop("CUDA_CACHE_DISABLE", None)
    before = os.getloadavg()[0]
    with tempfile.TemporaryDirectory(prefix="qd_cuda_jit_cache_") as jit_cache:
        env["CUDA_CACHE_PATH"] = jit_cache
        proc = subprocess.run([sys.executable, "-c", _WORKER, impl, str(k), str(N)], env=env, capture_output=True,
                              text=True, check=False)
    line = next((ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")), None)
    if proc.returncode != 0 or line is None:
        raise RuntimeError(f"{impl} K={k} failed:\n{proc.stdout}\n{proc.stderr}")
    return dict(json.loads(line[len("RESULT "):]), load_before=before, load_after=os.getloadavg()[0])


def gpu_present() -> bool:
    try:
        from numba import cuda

        return cuda.is_available() and len(cuda.gpus) > 0
    except Exception:
        return False


def run(archs, ks, note: str, repeat: int = 1) -> dict:
    rows = []
    for arch in archs:
        for k in ks:
            for sample in range(repeat):
                for name, impl in SERIES[arch]:
                    r = measure(impl, k)
                    rows.append(dict(r, series=name, arch=arch, K=k, sample=sample))
                    stages = ", ".join(f"{s} {v:.3f}" for s, v in r.get("stages", {}).items())
                    print(f"{name:48s} K={k:4d} {r['seconds']:8.3f} s  load {r['load_before']:.1f}  {stages}",
                          flush=True)
            if repeat > 1:
                for name, _impl in SERIES[arch]:
                    seconds = [r["seconds"] for r in rows if r["series"] == name and r["K"] == k and r["arch"] == arch]
                    print(f"{name:48s} K={k:4d} median {median(seconds):8.3f} s of {len(seconds)}", flush=True)
    return {"date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "command": "python bench/compile_time.py " + " ".join(sys.argv[1:]),
            "repeat": repeat,
            "machine": {"cpus": os.cpu_count(), "processor": platform.processor() or platform.machine(),
                        "python": platform.python_version(), "versions": _versions()},
            "kernel": f"K top-level loops, loop j: b_j[i] = a_j[i] * 2 + 1 over {N} f32",
            "note": note,
            "results": rows}


def _versions() -> dict:
    import numba

    out = {"numba": numba.__version__}
    try:
        from importlib.metadata import version

        out["numba-cuda"] = version("numba-cuda")
    except Exception:
        pass
    return out


# -- the plot: SVG written directly (no matplotlib) -------------------------------------------------------

_COLOURS = ["#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b"]


def median(values) -> float:
    ordered = sorted(values)
    mid = len(ordered) // 2
    return ordered[mid] if len(ordered) % 2 else (ordered[mid - 1] + ordered[mid]) / 2


def svg_plot(data: dict) -> str:
    width, height, left, right, top, bottom = 760, 480, 70, 280, 40, 50
    samples: dict[str, dict[int, list[float]]] = {}
    for r in data["results"]:
        samples.setdefault(r["series"], {}).setdefault(r["K"], []).append(r["seconds"])
    series = {name: [(k, median(v)) for k, v in by_k.items()] for name, by_k in samples.items()}
    ks = [k for pts in series.values() for k, _ in pts]
    secs = [s for pts in series.values() for _, s in pts]
    x0, x1 = math.log2(min(ks)), math.log2(max(ks))
    y0, y1 = math.floor(math.log10(min(secs))), math.ceil(math.log10(max(secs)))
    x1 = max(x1, x0 + 1)
    y1 = max(y1, y0 + 1)

    def px(k):
        return left + (math.log2(k) - x0) / (x1 - x0) * (width - left - right)

    def py(s):
        return top + (y1 - math.log10(s)) / (y1 - y0) * (height - top - bottom)

    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" font-family="sans-serif" '
           'font-size="12">',
           f'<rect width="{width}" height="{height}" fill="white"/>',
           f'<text x="{left}" y="22" font-size="14">Cold compile time, K top-level loops (log-log), '
           f'{data["date"][:10]}</text>']
    for e in range(int(y0), int(y1) + 1):
        y = py(10.0 ** e)
        out.append(f'<line x1="{left}" y1="{y:.1f}" x2="{width - right}" y2="{y:.1f}" stroke="#ddd"/>')
        out.append(f'<text x="{left - 6}" y="{y + 4:.1f}" text-anchor="end">{10.0 ** e:g} s</text>')
    for k in sorted(set(ks)):
        x = px(k)
        out.append(f'<line x1="{x:.1f}" y1="{top}" x2="{x:.1f}" y2="{height - bottom}" stroke="#eee"/>')
        out.append(f'<text x="{x:.1f}" y="{height - bottom + 16}" text-anchor="middle">{k}</text>')
    out.append(f'<text x="{(left + width - right) / 2:.0f}" y="{height - 12}" text-anchor="middle">K '
               '(top-level loops)</text>')
    ref = min(series.values(), key=lambda pts: -len(pts))   # slope-1 guide through the first series' start
    k_ref, s_ref = min(ref)
    out.append(f'<line x1="{px(k_ref):.1f}" y1="{py(s_ref):.1f}" x2="{px(max(ks)):.1f}" '
               f'y2="{py(s_ref * max(ks) / k_ref):.1f}" stroke="#999" stroke-dasharray="4 4"/>')
    for n, (name, pts) in enumerate(series.items()):
        colour = _COLOURS[n % len(_COLOURS)]
        pts = sorted(pts)
        path = " ".join(f"{px(k):.1f},{py(s):.1f}" for k, s in pts)
        out.append(f'<polyline points="{path}" fill="none" stroke="{colour}" stroke-width="2"/>')
        out += [f'<circle cx="{px(k):.1f}" cy="{py(s):.1f}" r="3" fill="{colour}"/>' for k, s in pts]
        ly = top + 20 + 20 * n
        out.append(f'<line x1="{width - right + 15}" y1="{ly}" x2="{width - right + 40}" y2="{ly}" '
                   f'stroke="{colour}" stroke-width="2"/>')
        out.append(f'<text x="{width - right + 45}" y="{ly + 4}">{_escape(name)}</text>')
    ly = top + 20 + 20 * len(series)
    out.append(f'<line x1="{width - right + 15}" y1="{ly}" x2="{width - right + 40}" y2="{ly}" stroke="#999" '
               'stroke-dasharray="4 4"/>')
    out.append(f'<text x="{width - right + 45}" y="{ly + 4}">linear growth</text>')
    out.append("</svg>")
    return "\n".join(out) + "\n"


def _escape(text: str) -> str:
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--arch", default="all", choices=["cpu", "cuda", "cuda-compile", "all"])
    parser.add_argument("--max-k", type=int, default=128)
    parser.add_argument("--repeat", type=int, default=1, help="measurements per series and K (median reported)")
    parser.add_argument("--out", default=os.path.join(HERE, "results"))
    parser.add_argument("--note", default="", help="stored in the JSON: the load from other jobs, say")
    args = parser.parse_args()
    archs = ["cpu", "cuda" if gpu_present() else "cuda-compile"] if args.arch == "all" else [args.arch]
    ks = [1 << p for p in range(args.max_k.bit_length()) if 1 << p <= args.max_k]
    data = run(archs, ks, args.note, max(1, args.repeat))
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "compile_time.json"), "w") as f:
        json.dump(data, f, indent=1)
    with open(os.path.join(args.out, "compile_time.svg"), "w") as f:
        f.write(svg_plot(data))


if __name__ == "__main__":
    main()
