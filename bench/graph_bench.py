"""Host time per call of multi-task kernels, plain vs ``@qd.kernel(graph=True)``, side by side with
Quadrants (each implementation in a fresh process; run on a GPU machine):

    python bench/graph_bench.py [--impls qd_numba,quadrants] [--ks 1,2,8] [--n 1024] [--out FILE.json]

(``--arch cpu`` runs the same script on the CPU, where graph=True changes nothing: a smoke test.)

Kernels: K top-level loops of a few float ops over n elements (small loops: the GPU work of a
task is a few microseconds), in two forms: on fields (no arguments) and on two ndarrays and a
scalar (``args``). For each implementation, K, form and mode (plain, graph):

* ``host_us``: the host time of one call: a batch of calls after a sync, timed up to the
  last call's return (the GPU may still run; the batch is short enough not to fill the launch queue);
* ``wall_us``: a batch timed up to a sync after it (the GPU's time when it is the slower side);
* ``args`` form, ``swap_host_us``: calls alternating between two sets of ndarrays and two
  scalar values (a graph kernel patches its nodes on every call).

Medians of 9 repeats. The ratios printed are plain/graph (> 1: the graph replay is faster). The
results decide whether graph replay should be the default for multi-task kernels (docs/graphs.md).
"""

import argparse
import importlib.util
import json
import os
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))


def kernel_source(k: int) -> str:
    """A module defining ``fields_plain/fields_graph`` and ``args_plain/args_graph`` of k loops."""
    lines = ["import qd_numba as qd" if os.environ.get("QD_BENCH_IMPL") != "quadrants" else "import quadrants as qd",
             "N = int(__import__('os').environ['QD_BENCH_N'])",
             "x = qd.field(qd.f32, shape=(N,))",
             "y = qd.field(qd.f32, shape=(N,))",
             "A = qd.types.ndarray(dtype=qd.f32, ndim=1)"]
    for graph in (False, True):
        suffix = "graph" if graph else "plain"
        deco = "@qd.kernel(graph=True)" if graph else "@qd.kernel"
        lines += [deco, f"def fields_{suffix}():"]
        for j in range(k):
            src, dst = ("x", "y") if j % 2 == 0 else ("y", "x")
            lines += ["    for i in range(N):", f"        {dst}[i] = {src}[i] * 0.5 + {j + 1}.0"]
        lines += [deco, f"def args_{suffix}(a: A, b: A, s: qd.f32):"]
        for j in range(k):
            src, dst = ("a", "b") if j % 2 == 0 else ("b", "a")
            lines += [f"    for i in range({src}.shape[0]):", f"        {dst}[i] = {src}[i] * s + {j + 1}.0"]
    return "\n".join(lines) + "\n"


def _median(samples):
    samples = sorted(samples)
    return samples[len(samples) // 2]


def _time(fn, sync, batch, repeats=9):
    """(host µs, wall µs) per call of ``fn`` (see the module docstring)."""
    for _ in range(3):
        fn()
    sync()
    host, wall = [], []
    for _ in range(repeats):
        sync()
        t0 = time.perf_counter()
        for _ in range(batch):
            fn()
        t1 = time.perf_counter()
        sync()
        t2 = time.perf_counter()
        host.append((t1 - t0) / batch * 1e6)
        wall.append((t2 - t0) / batch * 1e6)
    return _median(host), _median(wall)


def child(args) -> None:
    os.environ["QD_BENCH_IMPL"] = args.impl
    os.environ["QD_BENCH_N"] = str(args.n)
    if args.impl == "quadrants":
        import quadrants as qd
    else:
        import qd_numba as qd
    qd.init(arch=getattr(qd, args.arch), offline_cache=False)
    import numpy as np

    out = {}
    with tempfile.TemporaryDirectory() as tmp:
        for k in map(int, args.ks.split(",")):
            path = os.path.join(tmp, f"graph_bench_k{k}.py")
            with open(path, "w") as f:
                f.write(kernel_source(k))
            spec = importlib.util.spec_from_file_location(f"graph_bench_k{k}", path)
            mod = importlib.util.module_from_spec(spec)
            spec.loader.exec_module(mod)
            a = [qd.ndarray(qd.f32, shape=(args.n,)) for _ in range(4)]
            for arr in a:
                arr.from_numpy(np.random.default_rng(k).uniform(-1, 1, args.n).astype(np.float32))
            res = out[f"K{k}"] = {}
            batch = max(20, 400 // k)
            for mode in ("plain", "graph"):
                fields_k, args_k = getattr(mod, f"fields_{mode}"), getattr(mod, f"args_{mode}")
                host, wall = _time(fields_k, qd.sync, batch)
                res[f"fields_{mode}"] = {"host_us": host, "wall_us": wall}
                host, wall = _time(lambda: args_k(a[0], a[1], 0.5), qd.sync, batch)
                flip = [0]

                def swap():
                    flip[0] ^= 1
                    args_k(a[2 * flip[0]], a[2 * flip[0] + 1], 0.5 + 0.25 * flip[0])

                swap_host, _ = _time(swap, qd.sync, batch)
                res[f"args_{mode}"] = {"host_us": host, "wall_us": wall, "swap_host_us": swap_host}
            # the graph kernel's results equal the plain kernel's (the benchmark measures what is correct)
            for arr in a:
                arr.from_numpy(np.random.default_rng(1).uniform(-1, 1, args.n).astype(np.float32))
            mod.args_plain(a[0], a[1], 0.75)
            mod.args_graph(a[2], a[3], 0.75)
            res["graph_equals_plain"] = bool(np.array_equal(a[0].to_numpy(), a[2].to_numpy())
                                             and np.array_equal(a[1].to_numpy(), a[3].to_numpy()))
    print("RESULT " + json.dumps(out))


def run_child(impl, args) -> dict:
    cmd = [sys.executable, os.path.abspath(__file__), "--child", "--impl", impl, "--ks", args.ks, "--n", str(args.n),
           "--arch", args.arch]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([os.path.dirname(HERE), os.environ.get("PYTHONPATH", "")]))
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
    ap.add_argument("--ks", default="1,2,8")
    ap.add_argument("--n", type=int, default=1024)
    ap.add_argument("--arch", default="cuda")
    ap.add_argument("--out", default="")
    args = ap.parse_args()
    if args.child:
        child(args)
        return
    results = {"date": time.strftime("%Y-%m-%d"), "python": sys.version.split()[0], "n": args.n, "arch": args.arch}
    for impl in args.impls.split(","):
        results[impl] = run_child(impl, args)
    if args.out:
        with open(args.out, "w") as f:
            f.write(json.dumps(results, indent=1) + "\n")
    print(json.dumps(results, indent=1))
    nan = float("nan")
    print(f"{'impl':10s} {'K':>3s} {'form':7s} {'plain host':>11s} {'graph host':>11s} {'ratio':>6s} "
          f"{'plain wall':>11s} {'graph wall':>11s} {'swap plain':>11s} {'swap graph':>11s}")
    for impl in args.impls.split(","):
        r = results[impl]
        if "error" in r:
            print(f"{impl:10s} error: {r['error']}")
            continue
        for key, res in r.items():
            for form in ("fields", "args"):
                p, g = res.get(f"{form}_plain", {}), res.get(f"{form}_graph", {})
                ph, gh = p.get("host_us", nan), g.get("host_us", nan)
                print(f"{impl:10s} {key[1:]:>3s} {form:7s} {ph:11.2f} {gh:11.2f} {ph / gh:6.2f} "
                      f"{p.get('wall_us', nan):11.2f} {g.get('wall_us', nan):11.2f} "
                      f"{p.get('swap_host_us', nan):11.2f} {g.get('swap_host_us', nan):11.2f}")
            if not res.get("graph_equals_plain", False):
                print(f"{impl:10s} K={key[1:]}: graph results differ from plain")
    if all("error" not in results[i] for i in args.impls.split(",")) and len(args.impls.split(",")) > 1:
        first, *others = args.impls.split(",")
        for other in others:
            for key in results[first]:
                a = results[first][key].get("args_graph", {}).get("host_us", nan)
                b = results[other].get(key, {}).get("args_graph", {}).get("host_us", nan)
                print(f"graph=True host time, {key}: {first} {a:.2f} us, {other} {b:.2f} us, ratio {b / a:.2f}")


if __name__ == "__main__":
    main()
