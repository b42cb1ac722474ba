"""Time of one call of a ``qd.graph.do_while`` kernel of N passes: qd_numba's device-side loop
(one CUDA graph with a conditional WHILE node) vs its host-side loop (a graph replay and a flag
read per pass), side by side with Quadrants' ``qd.graph.do_while`` (each implementation in a
fresh process; run on a GPU machine):

    python bench/do_while_bench.py [--impls qd_numba,quadrants] [--passes 1,10,100,1000] [--n 4096]
                                   [--out FILE.json]

The kernel: the counter (a 0-d i32 ndarray) set to N by a statement before the loop, then a body
of two small loops over n elements and a counter decrement, repeated while the counter is
non-zero; so a call needs no host copy. ``call_us``: one call, a batch of calls timed up to a
sync after it (medians of 9 batches); ``per_pass_us``: the same over N; ``host_us``: a batch timed
up to the last call's return (the host's time: a device-side loop returns before the GPU ends).
The ratios printed are host-side / device-side and Quadrants / qd_numba device-side (> 1:
qd_numba's device loop is faster).
"""

import argparse
import importlib.util
import json
import os
import subprocess
import sys
import tempfile
import time

SOURCE = """
IMPL = __import__("os").environ["QD_BENCH_IMPL"]
if IMPL == "quadrants":
    import quadrants as qd
else:
    import qd_numba as qd

A = qd.types.ndarray(dtype=qd.f32, ndim=1)
C = qd.types.ndarray(dtype=qd.i32, ndim=0)


@qd.kernel(graph=True)
def relax(x: A, y: A, counter: C, passes: qd.i32):
    counter[()] = passes
    while qd.graph.do_while(counter):
        for i in range(x.shape[0]):
            y[i] = x[i] * 0.5 + 1.0
        for i in range(x.shape[0]):
            x[i] = y[i] * 0.5
        counter[()] = counter[()] - 1
"""


def _median(samples):
    samples = sorted(samples)
    return samples[len(samples) // 2]


def child(impl: str, passes: list, n: int) -> dict:
    """Run in a fresh process: the timings of one implementation (qd_numba: both loops)."""
    import numpy as np

    os.environ["QD_BENCH_IMPL"] = impl
    path = os.path.join(tempfile.mkdtemp(), "do_while_kernels.py")     # read again when Quadrants compiles
    with open(path, "w") as f:
        f.write(SOURCE)
    spec = importlib.util.spec_from_file_location("do_while_kernels", path)
    mod = importlib.util.module_from_spec(spec)
    qd = __import__("quadrants" if impl == "quadrants" else "qd_numba")
    qd.init(arch=qd.cuda)
    spec.loader.exec_module(mod)
    x, y = qd.ndarray(qd.f32, shape=(n,)), qd.ndarray(qd.f32, shape=(n,))
    counter = qd.ndarray(qd.i32, shape=())
    x.from_numpy(np.ones(n, np.float32))
    modes = ["device", "host"] if impl == "qd_numba" else ["quadrants"]
    out = {}
    for mode in modes:
        if impl == "qd_numba":
            from qd_numba.targets.cuda.do_while import DeviceLoop, unavailable

            DeviceLoop.enabled = mode == "device"
            out["device_unavailable"] = unavailable()
        for count in passes:
            mod.relax(x, y, counter, count)
            qd.sync()
            assert int(counter.to_numpy()) == 0
            batch = max(1, min(50, 2000 // count))
            samples, host = [], []
            for _ in range(9):
                qd.sync()
                t0 = time.perf_counter()
                for _ in range(batch):
                    mod.relax(x, y, counter, count)
                t1 = time.perf_counter()
                qd.sync()
                samples.append((time.perf_counter() - t0) / batch * 1e6)
                host.append((t1 - t0) / batch * 1e6)
            us = _median(samples)
            out[f"{mode}/{count}"] = {"call_us": us, "per_pass_us": us / count, "host_us": _median(host)}
    if impl == "qd_numba":
        from qd_numba.targets.cuda.do_while import DeviceLoop

        DeviceLoop.enabled = True
        loop = mod.relax._first().backend()._device_loop
        out["device_graph"] = {"builds": loop.builds, "launches": loop.launches,
                               "rebuild_on_change": loop.rebuild_on_change}
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--impls", default="qd_numba,quadrants")
    ap.add_argument("--passes", default="1,10,100,1000")
    ap.add_argument("--n", type=int, default=4096)
    ap.add_argument("--out")
    ap.add_argument("--child")
    args = ap.parse_args()
    passes = [int(p) for p in args.passes.split(",")]
    if args.child:
        print(json.dumps(child(args.child, passes, args.n)))
        return
    results = {}
    for impl in args.impls.split(","):
        if impl == "quadrants" and importlib.util.find_spec("quadrants") is None:
            print("quadrants: not importable, skipped")
            continue
        proc = subprocess.run([sys.executable, __file__, "--child", impl, "--passes", args.passes, "--n", str(args.n)],
                              capture_output=True, text=True)
        if proc.returncode:
            print(f"{impl}: failed\n{proc.stderr[-3000:]}")
            continue
        results[impl] = json.loads(proc.stdout.strip().splitlines()[-1])
    qn, qa = results.get("qd_numba", {}), results.get("quadrants", {})
    if qn:
        print(f"qd_numba device loop unavailable: {qn.get('device_unavailable')}; graph: {qn.get('device_graph')}")
    print(f"{'passes':>7} {'device us':>10} {'host us':>10} {'quadrants us':>13} {'host/device':>12} "
          f"{'quadrants/device':>17} {'device host-side us':>20}")
    for count in passes:
        d = qn.get(f"device/{count}", {}).get("call_us")
        h = qn.get(f"host/{count}", {}).get("call_us")
        q = qa.get(f"quadrants/{count}", {}).get("call_us")

        def fmt(v, width, digits=1):
            return f"{v:{width}.{digits}f}" if v is not None else f"{'-':>{width}}"

        print(f"{count:>7} {fmt(d, 10)} {fmt(h, 10)} {fmt(q, 13)} "
              f"{fmt(h / d if d and h else None, 12, 2)} {fmt(q / d if d and q else None, 17, 2)} "
              f"{fmt(qn.get(f'device/{count}', {}).get('host_us'), 20)}")
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"n": args.n, "passes": passes, "results": results}, f, indent=1)


if __name__ == "__main__":
    main()
