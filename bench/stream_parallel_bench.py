"""GPU benchmark: ``with qd.stream_parallel():`` against the same kernel without blocks, numba-cuda
with two hand-made streams, and Quadrants (docs/streams.md, issue 16).

    python bench/stream_parallel_bench.py [--impls qd,numba,quadrants] [--out results.json]

Cases, each timed as wall time per call (median of repeats, the GPU synchronised around each
batch of calls), and reported as ratios in one run:

* ``overlap``: two independent heavy loops, 8192 elements x 20,000 ``sin`` steps each. One loop
  alone fills a small part of the GPU, so the two overlap when they run concurrently. Ratio:
  plain / stream_parallel (goal >= 1.95); numba-cuda: one stream / two streams; Quadrants: plain /
  stream_parallel.
* ``no_overlap``: two loops that each fill the GPU (2**21 elements x 200 steps): nothing to
  overlap. Ratio plain / stream_parallel (goal: not below 1).
* ``small``: two tiny loops (256 elements, 1 step): the host cost of the fork/join, in us per call.
"""

import argparse
import json
import math
import platform
import statistics
import time

import numpy as np

CASES = {"overlap": (8192, 20_000), "no_overlap": (1 << 21, 200), "small": (256, 1)}


def _timed(call, sync, repeats, inner):
    call()
    sync()
    samples = []
    for _ in range(repeats):
        start = time.perf_counter()
        for _ in range(inner):
            call()
        sync()
        samples.append((time.perf_counter() - start) / inner)
    return statistics.median(samples)


def _inner(steps):
    return 200 if steps == 1 else 3


def kernels(m, steps):
    """(plain, stream_parallel) kernels of the module ``m`` (qd_numba or quadrants)."""
    arr = m.types.ndarray(dtype=m.f32, ndim=1)

    @m.kernel
    def plain(x: arr, y: arr):
        for i in range(x.shape[0]):
            v = x[i]
            for _ in range(steps):
                v = m.sin(v) * 0.9 + 0.1
            x[i] = v
        for i in range(y.shape[0]):
            v = y[i]
            for _ in range(steps):
                v = m.sin(v) * 0.8 - 0.1
            y[i] = v

    @m.kernel
    def parallel(x: arr, y: arr):
        with m.stream_parallel():
            for i in range(x.shape[0]):
                v = x[i]
                for _ in range(steps):
                    v = m.sin(v) * 0.9 + 0.1
                x[i] = v
        with m.stream_parallel():
            for i in range(y.shape[0]):
                v = y[i]
                for _ in range(steps):
                    v = m.sin(v) * 0.8 - 0.1
                y[i] = v

    return plain, parallel


def bench_kernel_language(m, repeats):
    out = {}
    for case, (n, steps) in CASES.items():
        plain, parallel = kernels(m, steps)
        x, y = m.ndarray(m.f32, n), m.ndarray(m.f32, n)
        rng = np.random.default_rng(0)
        x.from_numpy(rng.uniform(-1, 1, n).astype(np.float32))
        y.from_numpy(rng.uniform(-1, 1, n).astype(np.float32))
        inner = _inner(steps)
        t_plain = _timed(lambda: plain(x, y), m.sync, repeats, inner)
        t_par = _timed(lambda: parallel(x, y), m.sync, repeats, inner)
        out[case] = {"plain_s": t_plain, "stream_parallel_s": t_par, "ratio": t_plain / t_par}
    return out


def bench_numba_cuda(repeats):
    from numba import cuda

    out = {}
    for case, (n, steps) in CASES.items():
        @cuda.jit
        def first(x):
            i = cuda.grid(1)
            if i < x.shape[0]:
                v = x[i]
                for _ in range(steps):
                    v = math.sin(v) * np.float32(0.9) + np.float32(0.1)
                x[i] = v

        @cuda.jit
        def second(y):
            i = cuda.grid(1)
            if i < y.shape[0]:
                v = y[i]
                for _ in range(steps):
                    v = math.sin(v) * np.float32(0.8) - np.float32(0.1)
                y[i] = v

        rng = np.random.default_rng(0)
        x = cuda.to_device(rng.uniform(-1, 1, n).astype(np.float32))
        y = cuda.to_device(rng.uniform(-1, 1, n).astype(np.float32))
        block = 256
        grid = (n + block - 1) // block
        s1, s2 = cuda.stream(), cuda.stream()
        default = cuda.default_stream()

        def one_stream():
            first[grid, block, default](x)
            second[grid, block, default](y)

        def two_streams():
            first[grid, block, s1](x)
            second[grid, block, s2](y)

        inner = _inner(steps)
        t_one = _timed(one_stream, cuda.synchronize, repeats, inner)
        t_two = _timed(two_streams, cuda.synchronize, repeats, inner)
        out[case] = {"plain_s": t_one, "stream_parallel_s": t_two, "ratio": t_one / t_two}
    return out


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--impls", default="qd,numba,quadrants")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--out")
    args = parser.parse_args()
    results = {"machine": platform.node(), "cases": {k: {"n": n, "steps": s} for k, (n, s) in CASES.items()}}
    impls = args.impls.split(",")
    if "qd" in impls:
        import qd_numba as qd

        qd.init(arch=qd.cuda)
        results["qd_numba"] = bench_kernel_language(qd, args.repeats)
    if "numba" in impls:
        results["numba_cuda"] = bench_numba_cuda(args.repeats)
    if "quadrants" in impls:
        try:
            import quadrants as qq
        except ImportError as exc:
            results["quadrants"] = f"not importable: {exc}"
        else:
            qq.init(arch=qq.cuda)
            results["quadrants"] = bench_kernel_language(qq, args.repeats)
    try:
        from cuda.bindings import runtime as cudart

        err, props = cudart.cudaGetDeviceProperties(0)
        results["gpu"] = props.name.decode(errors="replace").strip("\x00")
    except Exception as exc:  # noqa: BLE001 - the name is informative only
        results["gpu"] = f"unknown ({exc})"
    print(f"GPU: {results['gpu']}")
    print(f"{'case':<12}" + "".join(f"{impl:>34}" for impl in ("qd_numba", "numba_cuda", "quadrants")))
    for case in CASES:
        cells = []
        for impl in ("qd_numba", "numba_cuda", "quadrants"):
            r = results.get(impl)
            if isinstance(r, dict):
                c = r[case]
                unit, scale = ("us", 1e6) if case == "small" else ("ms", 1e3)
                cells.append(f"{c['plain_s'] * scale:9.2f} -> {c['stream_parallel_s'] * scale:9.2f} {unit} "
                             f"x{c['ratio']:5.2f}")
            else:
                cells.append("-")
        print(f"{case:<12}" + "".join(f"{c:>34}" for c in cells))
    print("(plain / one stream -> stream_parallel / two streams, ratio plain/parallel: > 1 is faster)")
    if args.out:
        with open(args.out, "w") as f:
            json.dump(results, f, indent=2)


if __name__ == "__main__":
    main()
