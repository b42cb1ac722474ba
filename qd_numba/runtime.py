"""``qd.init``, architectures, and process-wide runtime state.

``qd.init(arch=...)`` selects the backend for kernels compiled afterwards. ``qd.cpu`` (the
default) always works. ``qd.cuda``/``qd.gpu`` need an NVIDIA GPU and numba-cuda; ``qd.amdgpu``
needs numba-hip and ROCm; when they are missing, ``qd.init`` raises QuadrantsRuntimeError
saying what is missing instead of falling back silently.
"""

from __future__ import annotations

import os

from . import config, profiler
from .errors import QuadrantsRuntimeError

cpu = "cpu"
cuda = "cuda"
gpu = "gpu"
amdgpu = "amdgpu"
x64 = "cpu"
arm64 = "cpu"
vulkan = "vulkan"
metal = "metal"

_ARCHES = {cpu, cuda, gpu, amdgpu}


def _cuda_ready() -> bool:
    try:
        from .targets.cuda_compile import cuda_available
    except ImportError:
        return False
    return cuda_available()


def init(arch=None, *, debug=None, print_ir=None, default_fp=None, default_ip=None, random_seed=None,
         cpu_max_num_threads=None, **options) -> None:
    """Configure qd_numba; options override the ``QD_*`` environment variables (docs/configuration.md)."""
    overrides = {k: v for k, v in dict(debug=debug, print_ir=print_ir, default_fp=default_fp,
                                       default_ip=default_ip, random_seed=random_seed,
                                       cpu_max_num_threads=cpu_max_num_threads).items() if v is not None}
    arch = arch or os.environ.get("QD_ARCH", "").strip().lower() or cpu
    if isinstance(arch, (list, tuple)):
        arch = arch[0]
    if arch not in _ARCHES:
        raise QuadrantsRuntimeError(f"qd.init: unsupported arch {arch!r}; qd_numba supports cpu, cuda, gpu, amdgpu")
    if arch in (cuda, gpu):
        if not _cuda_ready():
            raise QuadrantsRuntimeError(
                f"qd.init(arch={arch}): no usable NVIDIA GPU (needs a CUDA driver, a device, and "
                "`pip install qd_numba[cuda]`); use qd.cpu")
        from .targets.cuda import CudaRuntime

        CudaRuntime.get()
        arch = cuda
    if arch == amdgpu:
        raise QuadrantsRuntimeError("qd.init(arch=amdgpu): needs numba-hip and a ROCm installation; "
                                    "neither is available here")
    options.pop("offline_cache", None)
    config.current = config.config_from_env(arch=arch, **overrides, **options)
    from .kernel import forget_compiled

    forget_compiled()
    profiler.apply_log_level(config.current.log_level)
    profiler.kernel_profiler.clear()   # records of the dropped kernels
    if config.current.cpu_max_num_threads:
        import numba

        numba.set_num_threads(min(config.current.cpu_max_num_threads, numba.config.NUMBA_NUM_THREADS))
    if config.current.random_seed is not None:
        _seed(config.current.random_seed)


def _seed(seed: int) -> None:
    import numba
    import numpy as np

    @numba.njit
    def seed_compiled(s):
        np.random.seed(s)

    seed_compiled(seed)
    np.random.seed(seed)


def sync() -> None:
    """Wait for every launched kernel (CPU kernels finish before they return)."""
    if config.current.arch == cuda:
        from numba import cuda as numba_cuda

        numba_cuda.synchronize()


def reset() -> None:
    config.current = config.config_from_env()
    profiler.apply_log_level(config.current.log_level)
