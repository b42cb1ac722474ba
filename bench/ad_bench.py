"""Reverse-mode autodiff timings: ``python bench/ad_bench.py --arch cpu|cuda [--json out.json]``.

* the anchor of docs/autodiff.md (N = 2^16 threads, ``v = sin(v) * 1.01`` n = 32 times,
  ``loss[None] += v``): forward and backward kernel time;
* three more shapes, gradient vs forward: nested loops, a 4x4 matrix-vector product per
  thread (written with loops over a weight field), a ``while`` loop (needs ``ad_stack_size``);
* the host time of one backward launch with a per-thread bound (``range(n[i])``): sizes cached
  (nothing changed), sized on the host every launch, sized by the device max-reduction kernel
  every launch (on the CPU, the same kernel on the CPU).

Kernel times are the mean over ``--reps`` calls between two synchronisations (best of 5); host
times are the mean time for a call to return, without synchronising. On CUDA the table also
gives the ratio of the forward time to session 7's, session 7's backward time (H200,
bench/results/session7.md) and the ratio to it, and the issue's goal for the anchor (backward
<= 0.06 ms). ``--json``/``--out`` also writes the results, ratios included.
"""

from __future__ import annotations

import argparse
import json
import time

import numpy as np

import qd_numba as qd

# session 7, H200 (bench/results/session7.md): (forward ms, backward ms)
SESSION7_CUDA = {"anchor": (0.0122, 0.1670), "nested loops": (0.0166, 0.1937),
                 "matrix-vector": (0.0113, 4.1379), "while loop": (0.0124, 0.1597)}
GOAL_BACKWARD_MS = {"anchor": 0.06}


def _timed(fn, reps, sync=True):
    best = float("inf")
    for _ in range(5):
        qd.sync()
        t0 = time.perf_counter()
        for _ in range(reps):
            fn()
        if sync:
            qd.sync()
        best = min(best, (time.perf_counter() - t0) / reps)
    return best * 1e3   # ms


def _fields(n_threads):
    x = qd.field(qd.f64, shape=(n_threads,), needs_grad=True)
    loss = qd.field(qd.f64, shape=(), needs_grad=True)
    x.from_numpy(np.random.default_rng(0).uniform(-1, 1, n_threads))
    return x, loss


def _pair(forward, loss, reps):
    forward()
    loss.grad[None] = 1
    forward.grad()
    return {"forward_ms": _timed(forward, reps), "backward_ms": _timed(forward.grad, reps)}


def bench_shapes(arch, n_threads, steps, reps):
    qd.init(arch=arch)
    x, loss = _fields(n_threads)
    n = qd.field(qd.i32, shape=())
    m = qd.field(qd.i32, shape=())
    w = qd.field(qd.f64, shape=(4, 4), needs_grad=True)
    n[None], m[None] = steps, 4
    w.from_numpy(np.random.default_rng(1).uniform(-0.5, 0.5, (4, 4)))

    @qd.kernel
    def anchor():
        for i in x:
            v = x[i]
            for _ in range(n[None]):
                v = qd.sin(v) * 1.01
            loss[None] += v

    @qd.kernel
    def nested():
        for i in x:
            v = x[i]
            for _ in range(n[None] // 4):
                for _ in range(m[None]):
                    v = qd.sin(v) * 1.01 + 0.1 * qd.cos(v)
            loss[None] += v

    @qd.kernel
    def matvec():
        for i in x:
            s = x[i]
            for _ in range(n[None] // 8):
                acc = 0.0
                for c in range(4):
                    acc += w[0, c] * s + w[1, c] * s * s - w[2, c] + w[3, c] * qd.tanh(s)
                s = qd.tanh(acc)
            loss[None] += s

    out = {name: _pair(k, loss, reps) for name, k in
           (("anchor", anchor), ("nested loops", nested), ("matrix-vector", matvec))}

    qd.init(arch=arch, ad_stack_size=3 * (steps + 1))    # a while loop: the sizer cannot bound it
    x, loss = _fields(n_threads)
    n = qd.field(qd.i32, shape=())
    n[None] = steps

    @qd.kernel
    def while_loop():
        for i in x:
            v = x[i]
            k = 0
            while k < n[None]:
                v = qd.sin(v) * 1.01
                k += 1
            loss[None] += v

    out["while loop"] = _pair(while_loop, loss, reps)
    return out


def bench_sizing(arch, n_threads, steps, reps):
    """Host time of a backward launch with a per-thread bound, per sizing path."""
    out = {}
    for label, sizer, refresh in (("cached", "auto", False), ("host eval", "host", True),
                                  ("device reduction", "device", True)):
        qd.init(arch=arch, ad_stack_sizer=sizer)
        x, loss = _fields(n_threads)
        n = qd.field(qd.i32, shape=(n_threads,))
        n.from_numpy(np.random.default_rng(2).integers(0, steps + 1, n_threads).astype(np.int32))

        @qd.kernel
        def per_thread():
            for i in x:
                v = x[i]
                for _ in range(n[i]):
                    v = qd.sin(v) * 1.01
                loss[None] += v

        per_thread()
        loss.grad[None] = 1
        per_thread.grad()
        stack = per_thread.grad.adstacks[0]

        def launch():
            if refresh:
                stack.key = None        # forget the cached size: evaluate it again
            per_thread.grad()

        out[label] = {"host_ms": _timed(launch, reps, sync=False), "kernel_ms": _timed(launch, reps),
                      "evaluations": stack.evaluations, "device_reductions": stack.device_reductions}
    return out


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--arch", choices=("cpu", "cuda"), default="cpu")
    parser.add_argument("--threads", type=int, default=1 << 16)
    parser.add_argument("--steps", type=int, default=32)
    parser.add_argument("--reps", type=int, default=0, help="calls per timing (default: 200 cuda, 10 cpu)")
    parser.add_argument("--json", "--out", dest="json", default="", help="also write the results to this file")
    args = parser.parse_args()
    arch = qd.cuda if args.arch == "cuda" else qd.cpu
    reps = args.reps or (200 if args.arch == "cuda" else 10)
    results = {"arch": args.arch, "threads": args.threads, "steps": args.steps,
               "shapes": bench_shapes(arch, args.threads, args.steps, reps),
               "sizing": bench_sizing(arch, args.threads, args.steps, reps)}
    print(f"arch={args.arch} threads={args.threads} steps={args.steps}")
    cuda = args.arch == "cuda"
    print(f"{'shape':<16} {'forward ms':>11} {'backward ms':>12} {'bwd/fwd':>8}"
          + (f" {'fwd/s7':>7} {'s7 bwd ms':>10} {'bwd/s7':>7} {'goal ms':>8}" if cuda else ""))
    for name, r in results["shapes"].items():
        line = (f"{name:<16} {r['forward_ms']:>11.4f} {r['backward_ms']:>12.4f} "
                f"{r['backward_ms'] / r['forward_ms']:>8.2f}")
        if cuda:
            fwd, before = SESSION7_CUDA[name]
            r["session7_forward_ms"], r["forward_vs_session7"] = fwd, r["forward_ms"] / fwd
            r["session7_backward_ms"], r["backward_vs_session7"] = before, r["backward_ms"] / before
            goal = GOAL_BACKWARD_MS.get(name)
            line += (f" {r['forward_ms'] / fwd:>7.3f} {before:>10.4f} {r['backward_ms'] / before:>7.3f}"
                     f" {goal if goal else '-':>8}")
        print(line)
    print(f"{'backward sizing':<18} {'host ms/call':>12} {'kernel ms':>10}")
    for name, r in results["sizing"].items():
        print(f"{name:<18} {r['host_ms']:>12.4f} {r['kernel_ms']:>10.4f}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
