"""``qd.init``, architectures, and process-wide runtime state.

``qd.init(arch=...)`` selects the backend for kernels compiled afterwards. ``qd.cpu`` (the
default) always works; ``qd.x64``/``qd.x86_64``/``qd.arm64`` name it on a host of that kind.
``qd.cuda``/``qd.gpu`` need an NVIDIA GPU and numba-cuda; ``qd.amdgpu`` needs numba-hip and
ROCm; when they are missing, ``qd.init`` raises QuadrantsRuntimeError saying what is missing
instead of falling back silently. Quadrants' other backends (``qd.metal``, ``qd.vulkan``) are
not backends of qd_numba: naming one is an error too.

``qd.init`` also resets the state of ``qd.random`` (see :func:`random_state`).
"""

from __future__ import annotations

import os
import platform
import threading

from . import config, profiler
from .errors import QuadrantsRuntimeError

cpu = "cpu"
cuda = "cuda"
gpu = "gpu"
amdgpu = "amdgpu"
x64 = x86_64 = "x64"
arm64 = "arm64"
vulkan = "vulkan"
metal = "metal"

_ARCHES = {cpu, cuda, gpu, amdgpu}
_HOST_CPUS = {"x86_64": x64, "amd64": x64, "aarch64": arm64, "arm64": arm64}
_OTHER_BACKENDS = {metal: "Apple Metal", vulkan: "Vulkan"}   # Quadrants backends qd_numba does not have
_BACKENDS = "qd.cpu (qd.x64/qd.arm64 on such a host), qd.cuda, qd.gpu (the first GPU found), qd.amdgpu"


def _host_arch(arch: str) -> str:
    """``qd.cpu`` for ``qd.x64``/``qd.arm64`` on a host of that kind, or our error naming the host."""
    machine = platform.machine()
    if _HOST_CPUS.get(machine.lower()) != arch:
        raise QuadrantsRuntimeError(f"qd.init(arch=qd.{arch}): this host's CPU is {machine or 'unknown'}, "
                                    f"not {arch}; use qd.cpu, which is always the host's CPU")
    return cpu


def _cuda_ready() -> bool:
    try:
        from .targets.cuda.compile import cuda_available
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
    if arch in (x64, arm64):
        arch = _host_arch(arch)
    if arch in _OTHER_BACKENDS:
        raise QuadrantsRuntimeError(f"qd.init(arch=qd.{arch}): {_OTHER_BACKENDS[arch]} is a Quadrants backend but not "
                                    f"a backend of qd_numba; its backends are {_BACKENDS}")
    if arch not in _ARCHES:
        raise QuadrantsRuntimeError(f"qd.init: unsupported arch {arch!r}; qd_numba's backends are {_BACKENDS}")
    if arch in (cuda, gpu):
        if not _cuda_ready():
            raise QuadrantsRuntimeError(
                f"qd.init(arch={arch}): no usable NVIDIA GPU (needs a CUDA driver, a device, and "
                "`pip install qd_numba[cuda]`); use qd.cpu")
        from .targets.cuda.runtime import CudaRuntime

        CudaRuntime.get()   # the device and its context now: a missing GPU is an error of qd.init
        arch = cuda
    if arch == amdgpu:
        raise QuadrantsRuntimeError("qd.init(arch=amdgpu): needs numba-hip and a ROCm installation; "
                                    "neither is available here")
    config.current = config.config_from_env(arch=arch, **overrides, **options)
    from .kernel import forget_compiled

    forget_compiled()
    profiler.apply_log_level(config.current.log_level)
    profiler.kernel_profiler.clear()   # records of the dropped kernels
    if config.current.cpu_max_num_threads:
        import numba

        numba.set_num_threads(min(config.current.cpu_max_num_threads, numba.config.NUMBA_NUM_THREADS))
    _reset_random()


# -- qd.random ---------------------------------------------------------------------------------

_random_lock = threading.Lock()
_random_state = None    # the generator state field, made at the first compile that needs it
_python_draws = 0       # qd.random() calls in Python scope since qd.init


def random_state():
    """The state of ``qd.random`` in kernels: a uint64 field ``[seed word, launches]``, passed
    to kernels that call qd.random like any field. Each launch of such a kernel reads its key
    from it and counts itself (lowering/random.py). ``qd.init`` starts a new one from
    ``random_seed`` (default 0), so a seed gives the same numbers in every process."""
    global _random_state
    with _random_lock:
        if _random_state is None:
            import numpy as np

            from .dtypes import u64
            from .field import Field
            from .lowering.random import seed_word

            state = Field(u64, shape=(2,), name="qd.random state")
            state.from_numpy(np.array([seed_word(config.current.random_seed or 0), 0], dtype=np.uint64))
            _random_state = state
        return _random_state


def python_random(dtype):
    """``qd.random(dtype)`` in Python scope: the same generator, on its own stream, one number
    per call (the n-th call since ``qd.init`` is index n)."""
    global _python_draws
    from .lowering.random import PYTHON_STREAM, host_launch_key, host_random

    with _random_lock:
        index, _python_draws = _python_draws, _python_draws + 1
    key = host_launch_key(config.current.random_seed or 0, 0)
    return host_random(key, index, PYTHON_STREAM, 0, dtype).item()


def _reset_random() -> None:
    global _random_state, _python_draws
    with _random_lock:
        _random_state, _python_draws = None, 0


def sync() -> None:
    """Wait for every launched kernel (CPU kernels finish before they return)."""
    from .targets.base import target_for

    target_for(config.current.arch).synchronize()


def reset() -> None:
    config.current = config.config_from_env()
    profiler.apply_log_level(config.current.log_level)
