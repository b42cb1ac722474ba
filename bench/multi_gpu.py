"""Several GPUs: weak and strong scaling of examples/distributed_jacobi.py, and its halo-exchange
time per step (issue 18, docs/multi_gpu.md).

    python bench/multi_gpu.py --gpus 2 [--out bench/results/multi_gpu_h200x2.json]
    python bench/multi_gpu.py --gpus 2 --arch cpu --rows 256 --cols 256 --steps 5   # smoke run (gloo)

The driver starts ``torchrun --standalone --nproc-per-node k`` for k = 1 and k = --gpus, each rank
on its own GPU (``qd.init(device_id=LOCAL_RANK)``, NCCL), and prints, side by side:

* weak scaling: the same slab per GPU (``--rows`` x ``--cols`` float32 cells) on 1 and N GPUs;
  throughput (cell updates per second) on N GPUs over 1 GPU (goal: >= 1.8 on 2);
* halo exchange: the time of one exchange of edge rows (``batch_isend_irecv`` of DLPack views),
  alone, per step;
* strong scaling: one grid of ``--rows`` x ``--cols`` split over N GPUs; speedup over 1 GPU.

Times are medians over ``--repeats`` batches of ``--steps`` steps, each batch ended by a device
synchronisation and a barrier, the slowest rank's; the first batch (compiling) is not timed.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "examples"))


# -- one rank (started by torchrun) ---------------------------------------------------------------

def worker(args) -> None:
    import numpy as np
    import torch
    import torch.distributed as dist
    from distributed_jacobi import Slab, slab_rows

    import qd_numba as qd

    rank, world, local = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"]), int(os.environ["LOCAL_RANK"])
    qd.init(arch=args.arch, device_id=local)
    on_gpu = args.arch == "cuda"
    if on_gpu:
        torch.cuda.set_device(local)
    dist.init_process_group("nccl" if on_gpu else "gloo")
    rows = args.rows if args.mode == "weak" else None
    ny = args.rows * world if args.mode == "weak" else args.rows
    start, stop = (rank * rows, (rank + 1) * rows) if rows else slab_rows(ny, rank, world)
    grid = np.random.default_rng(rank).uniform(-1, 1, (stop - start, args.cols)).astype(np.float32)
    slab = Slab(grid, start, ny, dist, rank, world)

    def sync():
        if on_gpu:
            torch.cuda.synchronize()
        dist.barrier()

    def batches(body):
        body()   # first batch: compiles, warms up NCCL
        sync()
        samples = []
        for _ in range(args.repeats):
            t0 = time.perf_counter()
            for _ in range(args.steps):
                body()
            sync()
            samples.append((time.perf_counter() - t0) / args.steps)
        slowest = torch.tensor([statistics.median(samples)], dtype=torch.float64,
                               device="cuda" if on_gpu else "cpu")
        dist.all_reduce(slowest, op=dist.ReduceOp.MAX)
        return float(slowest.item())

    step = batches(slab.step)
    halo = batches(slab.exchange) if world > 1 else 0.0
    kernel = batches(lambda: qd_step(slab))
    dist.destroy_process_group()
    if rank == 0:
        with open(args.result, "w") as f:
            json.dump({"world": world, "ny": ny, "nx": args.cols, "step_s": step, "halo_s": halo,
                       "kernel_s": kernel, "cells_per_s": ny * args.cols / step}, f)


def qd_step(slab) -> None:
    """The step's kernel alone (no exchange): what the step costs without communication."""
    from distributed_jacobi import jacobi_step

    jacobi_step(slab.u, slab.v, slab.row0, slab.ny)


# -- the driver -------------------------------------------------------------------------------------

def run(args, world: int, mode: str) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        result = os.path.join(tmp, "rank0.json")
        cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(world),
               os.path.abspath(__file__), "--worker", "--mode", mode, "--result", result, "--arch", args.arch,
               "--rows", str(args.rows), "--cols", str(args.cols), "--steps", str(args.steps),
               "--repeats", str(args.repeats)]
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=args.timeout)
        if out.returncode != 0:
            raise SystemExit(f"{' '.join(cmd)} failed:\n{out.stdout[-3000:]}\n{out.stderr[-6000:]}")
        with open(result) as f:
            return json.load(f)


def device_name(arch: str) -> str:
    if arch != "cuda":
        return platform.processor() or platform.machine()
    import torch

    return f"{torch.cuda.device_count()} x {torch.cuda.get_device_name(0)}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gpus", type=int, default=2, help="N, the ranks of the multi-GPU runs")
    parser.add_argument("--arch", default="cuda", choices=("cuda", "cpu"))
    parser.add_argument("--rows", type=int, default=16384, help="rows per GPU (weak) or of the grid (strong)")
    parser.add_argument("--cols", type=int, default=16384)
    parser.add_argument("--steps", type=int, default=50)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--timeout", type=int, default=540)
    parser.add_argument("--out", help="write the results as JSON")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--mode", choices=("weak", "strong"), help=argparse.SUPPRESS)
    parser.add_argument("--result", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        worker(args)
        return
    n = args.gpus
    weak1, weak_n = run(args, 1, "weak"), run(args, n, "weak")
    strong1, strong_n = run(args, 1, "strong"), run(args, n, "strong")
    weak_ratio = weak_n["cells_per_s"] / weak1["cells_per_s"]
    strong_speedup = strong1["step_s"] / strong_n["step_s"]
    print(f"device: {device_name(args.arch)}; float32 Jacobi, {args.steps} steps x {args.repeats} batches")
    print(f"weak   ({args.rows} x {args.cols} per GPU): 1 GPU {weak1['step_s'] * 1e3:8.3f} ms/step, "
          f"{n} GPUs {weak_n['step_s'] * 1e3:8.3f} ms/step; throughput {n} / 1 = {weak_ratio:.2f}x "
          f"(goal >= {0.9 * n:.1f}x)")
    print(f"halo exchange on {n} GPUs: {weak_n['halo_s'] * 1e6:8.1f} us/step (kernel alone "
          f"{weak_n['kernel_s'] * 1e6:8.1f} us/step)")
    print(f"strong ({args.rows} x {args.cols} in all): 1 GPU {strong1['step_s'] * 1e3:8.3f} ms/step, "
          f"{n} GPUs {strong_n['step_s'] * 1e3:8.3f} ms/step; speedup {strong_speedup:.2f}x")
    if args.out:
        import numpy
        import torch

        import qd_numba

        record = {"date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
                  "command": " ".join([os.path.basename(sys.executable)] + sys.argv),
                  "device": device_name(args.arch), "arch": args.arch, "gpus": n,
                  "versions": {"python": platform.python_version(), "torch": torch.__version__,
                               "numpy": numpy.__version__, "qd_numba": getattr(qd_numba, "__version__", "?"),
                               "nccl": ".".join(map(str, torch.cuda.nccl.version())) if args.arch == "cuda" else None},
                  "weak": {"1": weak1, str(n): weak_n, "throughput_ratio": weak_ratio},
                  "strong": {"1": strong1, str(n): strong_n, "speedup": strong_speedup},
                  "halo_s_per_step": weak_n["halo_s"]}
        with open(args.out, "w") as f:
            json.dump(record, f, indent=1)
        print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
