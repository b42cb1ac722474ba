"""Where the host time of one qd_numba CUDA kernel call goes (run on a GPU machine):
``python3 bench/gpu_overhead.py``. Prints µs per call for each layer of the launch path,
from the bare driver call up to ``kernel(...)``."""

import ctypes
import json
import time

import numpy as np

import qd_numba as qd


def per_call_us(fn, reps=20000):
    from numba import cuda

    best = float("inf")
    for _ in range(5):
        cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(reps):
            fn()
        cuda.synchronize()
        best = min(best, (time.perf_counter() - t0) / reps)
    return best * 1e6


def main():
    from cuda.bindings import driver

    from qd_numba.targets.cuda.runtime import CudaRuntime

    qd.init(arch=qd.cuda)
    x = qd.field(qd.f32, shape=(1024,))

    @qd.kernel
    def inc():
        for i in x:
            x[i] += 1.0

    @qd.kernel
    def copy_nd(a: qd.types.ndarray(dtype=qd.f32, ndim=1), b: qd.types.ndarray(dtype=qd.f32, ndim=1)):
        for i in range(a.shape[0]):
            b[i] = a[i] + 1.0

    inc()
    a = qd.ndarray(qd.f32, shape=(1024,))
    b = qd.ndarray(qd.f32, shape=(1024,))
    copy_nd(a, b)
    plan = inc.backend().plan_for(())
    launch = plan.launches[0]
    out = {}
    out["cuda_bindings_cuLaunchKernel"] = per_call_us(
        lambda: driver.cuLaunchKernel(launch.fn, int(plan.packed[3]), 1, 1, 256, 1, 1, 0, 0, launch.argv, 0))
    out["native launch_all() (builtin call + driver)"] = per_call_us(plan.launch_all)
    libcuda = ctypes.CDLL("libcuda.so.1")
    f = libcuda.cuLaunchKernel
    f.argtypes = [ctypes.c_uint64] + [ctypes.c_uint32] * 7 + [ctypes.c_uint64] * 3
    f.restype = ctypes.c_int32
    fn_int, grid, argv = int(launch.fn), int(plan.packed[3]), launch.argv
    out["ctypes cuLaunchKernel"] = per_call_us(lambda: f(fn_int, grid, 1, 1, 256, 1, 1, 0, 0, argv, 0))
    # the same native launch on other streams: legacy default (0), per-thread default (2),
    # a created blocking stream, a created non-blocking stream
    saved = int(plan.packed[1])
    for label, flags in (("legacy default stream", None), ("per-thread default stream", "ptds"),
                         ("created blocking stream", 0), ("created non-blocking stream", 1)):
        if flags is None:
            handle = 0
        elif flags == "ptds":
            handle = 2
        else:
            err, stream = driver.cuStreamCreate(flags)
            handle = int(stream)
        plan.packed[1] = handle
        out[f"native launch_all on {label}"] = per_call_us(plan.launch_all)
    plan.packed[1] = saved
    out["plan.run"] = per_call_us(plan.run)
    out["inc() full call"] = per_call_us(inc)
    gpu = copy_nd.backend()
    nd_plan = gpu.plan_for((a, b))
    va, vb = a._cuda_view, b._cuda_view
    out["copy_nd plan.run"] = per_call_us(lambda: nd_plan.run(a, b, va, vb))
    out["copy_nd(a, b) full call"] = per_call_us(lambda: copy_nd(a, b))
    out["plan_builds"] = CudaRuntime.get().plan_builds
    print("RESULT " + json.dumps(out))
    assert np.all(x.to_numpy() > 0)


if __name__ == "__main__":
    main()
