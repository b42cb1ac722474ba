"""2-D Jacobi iterations decomposed in slabs of rows over N ranks with torch.distributed.

    python examples/distributed_jacobi.py                                   # one process: checked against numpy
    torchrun --nproc-per-node 2 examples/distributed_jacobi.py              # 2 ranks on the CPU (gloo)
    QD_ARCH=cuda torchrun --nproc-per-node 2 examples/distributed_jacobi.py # one GPU per rank (NCCL)

Each rank holds its rows of the ``ny x nx`` grid plus one ghost row above and below, in two
qd.ndarrays (old and new values). Before every step the ranks swap their edge rows with their
neighbours: ``torch.from_dlpack`` gives zero-copy torch views of the ndarrays (made once), whose
rows go straight to ``send``/``recv`` (``batch_isend_irecv``): no copy on either side. Each rank
runs on its own GPU (``qd.init(device_id=LOCAL_RANK)``, NCCL) or on the CPU (gloo).

Ordering on the GPU: qd_numba launches on the legacy default stream, which is also torch's
current stream here; NCCL's stream waits for the current stream when an exchange starts, and
``wait()`` makes the current stream wait for NCCL, so the next step's kernel reads the received
rows (no host synchronisation; docs/multi_gpu.md).

Rank 0 gathers the slabs and checks that they equal the single-process run of the same steps
(the same arithmetic per point, so bit for bit), prints ``OK`` and exits non-zero otherwise. The
grid's outer rows and columns keep their initial values.
"""

from __future__ import annotations

import argparse
import os
import sys

import numpy as np

import qd_numba as qd


@qd.kernel
def jacobi_step(u: qd.types.ndarray(ndim=2), v: qd.types.ndarray(ndim=2), row0: qd.i32, ny: qd.i32):
    """One Jacobi step on a slab: rows 1..n-2 of ``u`` (0 and n-1 are ghost rows) are global rows
    ``row0 ..``; the grid's outer rows and columns are copied unchanged."""
    for i, j in qd.ndrange((1, u.shape[0] - 1), u.shape[1]):
        g = row0 + i - 1
        if g == 0 or g == ny - 1 or j == 0 or j == u.shape[1] - 1:
            v[i, j] = u[i, j]
        else:
            v[i, j] = 0.25 * (u[i - 1, j] + u[i + 1, j] + u[i, j - 1] + u[i, j + 1])


def slab_rows(ny: int, rank: int, world: int) -> tuple[int, int]:
    """The global rows [start, stop) of ``rank``: ``ny`` rows split as evenly as they go."""
    base, extra = divmod(ny, world)
    start = rank * base + min(rank, extra)
    return start, start + base + (1 if rank < extra else 0)


def initial_grid(ny: int, nx: int, seed: int, dtype) -> np.ndarray:
    return np.random.default_rng(seed).uniform(-1.0, 1.0, (ny, nx)).astype(dtype)


class Slab:
    """One rank's rows with ghost rows: two qd.ndarrays and their torch views (``views``, when
    ``dist`` is given: made once, zero-copy)."""

    def __init__(self, grid_rows: np.ndarray, row0: int, ny: int, dist=None, rank: int = 0, world: int = 1):
        rows, nx = grid_rows.shape
        dtype = qd.f64 if grid_rows.dtype == np.float64 else qd.f32
        self.u, self.v = qd.ndarray(dtype, (rows + 2, nx)), qd.ndarray(dtype, (rows + 2, nx))
        padded = np.zeros((rows + 2, nx), grid_rows.dtype)
        padded[1:-1] = grid_rows
        self.u.from_numpy(padded)
        self.v.from_numpy(padded)
        self.row0, self.ny, self.dist, self.rank, self.world = row0, ny, dist, rank, world
        if dist is not None:
            import torch

            self.tu, self.tv = torch.from_dlpack(self.u), torch.from_dlpack(self.v)

    def exchange(self) -> None:
        """Swap edge rows with the neighbours: this rank's first and last own rows go out, the
        neighbours' land in the ghost rows (torch views of the qd.ndarray, no copies)."""
        if self.dist is None or self.world == 1:
            return
        dist, t, last = self.dist, self.tu, self.tu.shape[0] - 1
        ops = []
        if self.rank > 0:
            ops += [dist.P2POp(dist.isend, t[1], self.rank - 1), dist.P2POp(dist.irecv, t[0], self.rank - 1)]
        if self.rank < self.world - 1:
            ops += [dist.P2POp(dist.isend, t[last - 1], self.rank + 1), dist.P2POp(dist.irecv, t[last], self.rank + 1)]
        for request in dist.batch_isend_irecv(ops):
            request.wait()

    def step(self) -> None:
        self.exchange()
        jacobi_step(self.u, self.v, self.row0, self.ny)
        self.u, self.v = self.v, self.u
        if self.dist is not None:
            self.tu, self.tv = self.tv, self.tu

    def own_rows(self) -> np.ndarray:
        return self.u.to_numpy()[1:-1]


def single_process(grid: np.ndarray, steps: int) -> np.ndarray:
    slab = Slab(grid, 0, grid.shape[0])
    for _ in range(steps):
        slab.step()
    return slab.own_rows()


def numpy_jacobi(grid: np.ndarray, steps: int) -> np.ndarray:
    u = grid.copy()
    for _ in range(steps):
        v = u.copy()
        v[1:-1, 1:-1] = u.dtype.type(0.25) * (u[:-2, 1:-1] + u[2:, 1:-1] + u[1:-1, :-2] + u[1:-1, 2:])
        u = v
    return u


def gather(slab: Slab, ny: int, torch, dist) -> np.ndarray | None:
    """Rank 0: the whole grid from every rank's own rows (point-to-point, any backend)."""
    own = slab.tu[1:-1]
    if slab.rank != 0:
        dist.send(own.contiguous(), 0)
        return None
    parts = [own.cpu().numpy().copy()]
    for r in range(1, slab.world):
        start, stop = slab_rows(ny, r, slab.world)
        buf = torch.empty((stop - start, own.shape[1]), dtype=own.dtype, device=own.device)
        dist.recv(buf, r)
        parts.append(buf.cpu().numpy())
    return np.concatenate(parts)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ny", type=int, default=96)
    parser.add_argument("--nx", type=int, default=80)
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--f32", action="store_true", help="float32 values (default float64)")
    args = parser.parse_args()
    dtype = np.float32 if args.f32 else np.float64
    grid = initial_grid(args.ny, args.nx, args.seed, dtype)
    world = int(os.environ.get("WORLD_SIZE", "1"))

    if world == 1:
        qd.init()   # the arch from QD_ARCH (default: cpu)
        got, ref = single_process(grid, args.steps), numpy_jacobi(grid, args.steps)
        err = float(np.max(np.abs(got - ref)))
        print(f"1 process, {args.ny}x{args.nx}, {args.steps} steps: max |qd - numpy| = {err:.3g}")
        if err > (1e-5 if args.f32 else 1e-12):
            print("FAILED")
            return 1
        print("OK")
        return 0

    import torch
    import torch.distributed as dist

    rank, local_rank = int(os.environ["RANK"]), int(os.environ.get("LOCAL_RANK", "0"))
    qd.init(device_id=local_rank)   # the arch from QD_ARCH; on a GPU arch, this rank's device
    on_gpu = qd.cfg.arch == qd.cuda
    if on_gpu:
        torch.cuda.set_device(local_rank)
    dist.init_process_group("nccl" if on_gpu else "gloo")
    try:
        start, stop = slab_rows(args.ny, rank, world)
        slab = Slab(grid[start:stop], start, args.ny, dist, rank, world)
        for _ in range(args.steps):
            slab.step()
        whole = gather(slab, args.ny, torch, dist)
    finally:
        dist.destroy_process_group()
    if rank != 0:
        return 0
    ref = single_process(grid, args.steps)
    same = np.array_equal(whole, ref)
    print(f"{world} ranks ({'nccl' if on_gpu else 'gloo'}), {args.ny}x{args.nx}, {args.steps} steps: "
          f"equal to the single-process run: {same} (max diff {float(np.max(np.abs(whole - ref))):.3g})")
    print("OK" if same else "FAILED")
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
