"""Sparse storage: bytes and struct-for time of a 1% / 10% active grid, dense vs bitmasked vs pointer.

``python bench/sparse_memory.py --arch cpu|cuda [--n 4096] [--block 8] [--out out.json]``

An ``n x n`` f32 grid in ``block x block`` blocks; a share of the blocks (1%, 10%) is activated by
one store each. Printed side by side, per share:

* bytes: a dense field; the bitmasked tree (dense storage plus a state per block); the pointer tree
  (``qd.init(pointer_pool_fraction=2 * share)``: slots and states per block plus the pool), and of
  that pool the bytes of the blocks in use (by the allocator's counter, ``blocks_in_use``);
* the time of one struct-for ``x[i, j] += 1`` over each (ms, best of 5 x ``--reps``), and its
  ratio to the dense loop.
"""

from __future__ import annotations

import argparse
import json
import time

import numpy as np

import qd_numba as qd
from qd_numba.snode import blocks_in_use


def _timed(fn, reps):
    best = float("inf")
    for _ in range(5):
        qd.sync()
        t0 = time.perf_counter()
        for _ in range(reps):
            fn()
        qd.sync()
        best = min(best, (time.perf_counter() - t0) / reps)
    return best * 1e3


def _grid(kind, n, block):
    x = qd.field(qd.f32)
    if kind == "dense":
        qd.root.dense(qd.ij, n // block).dense(qd.ij, block).place(x)
        return x, None
    node = getattr(qd.root, kind)(qd.ij, n // block)
    node.dense(qd.ij, block).place(x)
    return x, node


def measure(arch, n, block, share, reps, seed=0):
    qd.init(arch=arch, pointer_pool_fraction=min(1.0, 2 * share))
    blocks = n // block
    rng = np.random.default_rng(seed)
    chosen = rng.choice(blocks * blocks, max(1, int(round(share * blocks * blocks))), replace=False)
    pts = np.stack([chosen // blocks * block, chosen % blocks * block], -1).astype(np.int32)
    out = {"share": share, "active_blocks": len(chosen)}
    for kind in ("dense", "bitmasked", "pointer"):
        x, node = _grid(kind, n, block)

        @qd.kernel
        def touch(p: qd.types.ndarray()):
            for k in range(p.shape[0]):
                x[p[k, 0], p[k, 1]] = 1.0

        @qd.kernel
        def step():
            for i, j in x:
                x[i, j] += 1.0

        touch(pts)
        step()
        out[f"{kind}_ms"] = _timed(step, reps)
        out[f"{kind}_bytes"] = int(x._tree.base.nbytes)
        if kind == "pointer":
            out["pointer_blocks_in_use"] = blocks_in_use(node)
            out["pointer_bytes_in_use"] = blocks_in_use(node) * block * block * 4
    return out


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--arch", default="cpu", choices=["cpu", "cuda"])
    parser.add_argument("--n", type=int, default=4096)
    parser.add_argument("--block", type=int, default=8)
    parser.add_argument("--reps", type=int, default=10)
    parser.add_argument("--out", help="write the results as JSON here")
    args = parser.parse_args()
    arch = qd.cuda if args.arch == "cuda" else qd.cpu
    rows = [measure(arch, args.n, args.block, share, args.reps) for share in (0.01, 0.10)]
    mib = 1 << 20
    print(f"{args.n}x{args.n} f32 grid, {args.block}x{args.block} blocks, arch={args.arch}")
    print(f"{'active':>7} {'dense MiB':>10} {'bitmasked MiB':>14} {'pointer MiB':>12} {'pointer in use MiB':>19} "
          f"{'dense ms':>9} {'bitmasked ms (x)':>17} {'pointer ms (x)':>15}")
    for r in rows:
        print(f"{r['share']:>7.0%} {r['dense_bytes'] / mib:>10.2f} {r['bitmasked_bytes'] / mib:>14.2f} "
              f"{r['pointer_bytes'] / mib:>12.2f} {r['pointer_bytes_in_use'] / mib:>19.2f} {r['dense_ms']:>9.3f} "
              f"{r['bitmasked_ms']:>8.3f} ({r['bitmasked_ms'] / r['dense_ms']:.3f}) "
              f"{r['pointer_ms']:>7.3f} ({r['pointer_ms'] / r['dense_ms']:.3f})")
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"arch": args.arch, "n": args.n, "block": args.block, "rows": rows}, f, indent=2)


if __name__ == "__main__":
    main()
