"""GPU workloads written once in the Quadrants API; run unchanged under ``import quadrants as qd``
and ``import qd_numba as qd`` (``python bench/gpu_workloads.py qd_numba|quadrants``), plus
hand-written numba-cuda equivalents (``numba``). Prints one JSON line of results.

Measured (host wall time, best of a few repeats, sync before and after):
* ``call_fields_us``: one call of a 1-task kernel on a 1024-element field (launch-bound);
* ``call_ndarrays_us``: the same with two ndarray arguments (device arrays);
* ``saxpy_ms`` / ``copy_ms``: y = a*x + y over 2^26 float32, and a device-to-device copy of the
  same bytes in the same process (bandwidth reference);
* ``loops8_us``: one call of a kernel of 8 back-to-back loops of 4096 elements each.
"""

import json
import sys
import time

import numpy as np

N_SMALL = 1024
N_SAXPY = 1 << 26
N_LOOP = 4096


def _best(fn, reps, repeats=5, sync=None):
    best = float("inf")
    for _ in range(repeats):
        sync()
        t0 = time.perf_counter()
        for _ in range(reps):
            fn()
        sync()
        best = min(best, (time.perf_counter() - t0) / reps)
    return best


def run_quadrants_api(qd, name):
    qd.init(arch=qd.cuda)
    x = qd.field(qd.f32, shape=(N_SMALL,))

    @qd.kernel
    def inc_field():
        for i in x:
            x[i] += 1.0

    @qd.kernel
    def copy_nd(a: qd.types.ndarray(dtype=qd.f32, ndim=1), b: qd.types.ndarray(dtype=qd.f32, ndim=1)):
        for i in range(a.shape[0]):
            b[i] = a[i] + 1.0

    @qd.kernel
    def saxpy(alpha: qd.f32, a: qd.types.ndarray(dtype=qd.f32, ndim=1), b: qd.types.ndarray(dtype=qd.f32, ndim=1)):
        for i in range(a.shape[0]):
            b[i] = alpha * a[i] + b[i]

    fs = [qd.field(qd.f32, shape=(N_LOOP,)) for _ in range(3)]

    def loops8_body():
        for i in fs[0]:
            fs[0][i] = 0.0
        for i in fs[1]:
            fs[1][i] = fs[1][i] * 0.5
        for i in fs[2]:
            fs[2][i] = fs[2][i] + 1.0
        for i in fs[0]:
            fs[0][i] += fs[1][i]
        for i in fs[1]:
            fs[1][i] -= fs[2][i]
        for i in fs[2]:
            fs[2][i] = fs[2][i] * 0.25
        for i in fs[0]:
            fs[0][i] = fs[0][i] * 2.0
        for i in fs[1]:
            fs[1][i] += 3.0

    loops8 = qd.kernel(loops8_body)
    sync = qd.sync
    out = {"framework": name}
    inc_field()
    out["call_fields_us"] = _best(inc_field, 20000, sync=sync) * 1e6
    a = qd.ndarray(qd.f32, shape=(N_SMALL,))
    b = qd.ndarray(qd.f32, shape=(N_SMALL,))
    copy_nd(a, b)
    out["call_ndarrays_us"] = _best(lambda: copy_nd(a, b), 20000, sync=sync) * 1e6
    big_a = qd.ndarray(qd.f32, shape=(N_SAXPY,))
    big_b = qd.ndarray(qd.f32, shape=(N_SAXPY,))
    big_a.fill(1.5)
    big_b.fill(0.5)
    saxpy(2.0, big_a, big_b)
    out["saxpy_ms"] = _best(lambda: saxpy(2.0, big_a, big_b), 20, sync=sync) * 1e3
    loops8()
    out["loops8_us"] = _best(loops8, 5000, sync=sync) * 1e6
    _check_loops8(fs, loops8)
    if name == "qd_numba":  # the same kernel with task fusion on (issue 4)
        loops8_fused = qd.kernel(fuse=True)(loops8_body)
        loops8_fused()
        out["loops8_fused_us"] = _best(loops8_fused, 5000, sync=sync) * 1e6
        out["loops8_fused_tasks"] = len(loops8_fused.tasks())
        _check_loops8(fs, loops8_fused)
    # correctness of the timed kernels (a wrong fast kernel is no result)
    ra = np.zeros(N_SMALL, np.float32)
    a.from_numpy(ra + 2.0)
    copy_nd(a, b)
    assert np.allclose(b.to_numpy(), 3.0)
    big_b.fill(0.5)
    saxpy(2.0, big_a, big_b)
    probe = big_b.to_numpy()[:: 1 << 16]
    assert np.allclose(probe, 3.5), probe[:4]
    out["copy_ms"] = _copy_ms()
    return out


def _check_loops8(fs, kernel):
    init = [np.random.default_rng(k).uniform(-1, 1, N_LOOP).astype(np.float32) for k in range(3)]
    for f, d in zip(fs, init):
        f.from_numpy(d)
    kernel()
    a, b, c = (d.astype(np.float64) for d in init)
    a = np.zeros_like(a)
    b = b * 0.5
    c = c + 1.0
    a = a + b
    b = b - c
    c = c * 0.25
    a = a * 2.0
    b = b + 3.0
    for f, ref in zip(fs, (a, b, c)):
        assert np.allclose(f.to_numpy(), ref, rtol=1e-5, atol=1e-5)


def _copy_ms():
    import torch

    src = torch.ones(N_SAXPY, dtype=torch.float32, device="cuda")
    dst = torch.empty_like(src)
    dst.copy_(src)
    return _best(lambda: dst.copy_(src), 20, sync=torch.cuda.synchronize) * 1e3


def run_numba():
    from numba import cuda

    @cuda.jit
    def inc(x):
        i = cuda.grid(1)
        if i < x.size:
            x[i] += 1.0

    @cuda.jit
    def copy_nd(a, b):
        i = cuda.grid(1)
        if i < a.size:
            b[i] = a[i] + 1.0

    @cuda.jit
    def saxpy(alpha, a, b):
        i = cuda.grid(1)
        stride = cuda.gridsize(1)
        while i < a.size:
            b[i] = alpha * a[i] + b[i]
            i += stride

    x = cuda.to_device(np.zeros(N_SMALL, np.float32))
    a = cuda.to_device(np.zeros(N_SMALL, np.float32))
    b = cuda.to_device(np.zeros(N_SMALL, np.float32))
    sync = cuda.synchronize
    out = {"framework": "numba-cuda"}
    grid = (N_SMALL + 255) // 256
    inc[grid, 256](x)
    out["call_fields_us"] = _best(lambda: inc[grid, 256](x), 20000, sync=sync) * 1e6
    copy_nd[grid, 256](a, b)
    out["call_ndarrays_us"] = _best(lambda: copy_nd[grid, 256](a, b), 20000, sync=sync) * 1e6
    big_a = cuda.to_device(np.full(N_SAXPY, 1.5, np.float32))
    big_b = cuda.to_device(np.full(N_SAXPY, 0.5, np.float32))
    sm = cuda.get_current_device().MULTIPROCESSOR_COUNT
    saxpy[sm * 8, 256](np.float32(2.0), big_a, big_b)
    out["saxpy_ms"] = _best(lambda: saxpy[sm * 8, 256](np.float32(2.0), big_a, big_b), 20, sync=sync) * 1e3
    fs = [cuda.to_device(np.zeros(N_LOOP, np.float32)) for _ in range(3)]
    g = N_LOOP // 256

    def loops8():
        for k in range(8):
            inc[g, 256](fs[k % 3])

    loops8()
    out["loops8_us"] = _best(loops8, 5000, sync=sync) * 1e6
    out["copy_ms"] = _copy_ms()
    return out


if __name__ == "__main__":
    which = sys.argv[1]
    if which == "numba":
        result = run_numba()
    elif which == "quadrants":
        import quadrants

        version = getattr(quadrants, "__version__", "?")
        version = ".".join(map(str, version)) if isinstance(version, tuple) else str(version)
        result = run_quadrants_api(quadrants, "quadrants " + version)
    else:
        import qd_numba

        result = run_quadrants_api(qd_numba, "qd_numba")
        from qd_numba.targets.cuda.runtime import CudaRuntime

        result["plan_builds"] = CudaRuntime.get().plan_builds
    print("RESULT " + json.dumps(result))
