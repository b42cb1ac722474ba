"""``qd.init``, architectures, and process-wide runtime state.

``qd.init(arch=...)`` selects the backend for kernels compiled afterwards. ``qd.cpu`` (the
default) always works; ``qd.x64``/``qd.x86_64``/``qd.arm64`` name it on a host of that kind.
``qd.cuda`` needs an NVIDIA GPU and numba-cuda; ``qd.amdgpu`` an AMD GPU, ROCm and hip-python
(docs/amdgpu.md); ``qd.gpu`` is the first of the two found; when they are missing, ``qd.init``
raises QuadrantsRuntimeError saying what is missing instead of falling back silently. Quadrants'
other backends (``qd.metal``, ``qd.vulkan``) are not backends of qd_numba: naming one is an error too.

``qd.init`` also resets the state of ``qd.random`` (random_state.py) and drops every kernel's
compiled code (kernel.py registers that with :func:`on_init`: the runtime knows no kernel). It
reaches a target only through the registry of targets/base.py.
"""

from __future__ import annotations

import os
import platform
import warnings

import numba

from . import config, profiler, random_state, snode
from .errors import QuadrantsRuntimeError, QuadrantsWarning
from .targets.base import target_for

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


_on_init: list = []    # what the layers above do at each qd.init (kernel.py: drop compiled code)


def on_init(callback) -> None:
    """Call ``callback()`` at every ``qd.init``, after the new configuration is in place."""
    _on_init.append(callback)


def init(arch=None, default_fp=None, default_ip=None, _test_mode=False, enable_fallback=None, *, debug=None,
         print_ir=None, random_seed=None, cpu_max_num_threads=None, **options) -> None:
    """Configure qd_numba; options override the ``QD_*`` environment variables (docs/configuration.md).

    Every option Quadrants documents is accepted; those without effect here are kept for
    ``qd.cfg`` and documented as ignored. ``enable_fallback``: with ``arch=qd.gpu`` (unset, or
    True) and no usable GPU, run on the CPU with a warning; True also lets ``qd.cuda`` fall back;
    False makes ``qd.gpu`` an error too."""
    overrides = {k: v for k, v in dict(debug=debug, print_ir=print_ir, default_fp=default_fp,
                                       default_ip=default_ip, random_seed=random_seed,
                                       cpu_max_num_threads=cpu_max_num_threads).items() if v is not None}
    where = "qd.init(arch=...)"
    if not arch and os.environ.get("QD_ARCH", "").strip():
        arch, where = os.environ["QD_ARCH"].strip().lower(), "QD_ARCH"
    arch = arch or cpu
    if isinstance(arch, (list, tuple)):
        arch = arch[0]
    if arch in (x64, arm64):
        arch = _host_arch(arch)
    if arch in _OTHER_BACKENDS:
        raise QuadrantsRuntimeError(f"qd.init(arch=qd.{arch}): {_OTHER_BACKENDS[arch]} is a Quadrants backend but not "
                                    f"a backend of qd_numba; its backends are {_BACKENDS}")
    if arch not in _ARCHES:
        raise QuadrantsRuntimeError(f"{where}: unsupported arch {arch!r}; qd_numba's backends are {_BACKENDS}")
    new_config = config.config_from_env(arch=arch, **overrides, **options)
    if arch == amdgpu:
        target_for(amdgpu).open(new_config)
    if arch in (cuda, gpu):
        new_config.arch = _open_gpu(arch, enable_fallback, new_config)
    _install(new_config)
    target_for(new_config.arch).configure(new_config)


def _install(new_config: config.Config) -> None:
    """Make ``new_config`` the configuration in force: a new runtime (fields of the old one are
    released, compiled kernels dropped, ``qd.random`` restarted)."""
    config.current = new_config
    for callback in _on_init:
        callback()
    profiler.apply_log_level(config.current.log_level)
    profiler.kernel_profiler.clear()   # records of the dropped kernels
    _apply_thread_limit(config.current.cpu_max_num_threads)
    random_state.reset()
    snode.start_new_root()


def _open_gpu(arch: str, enable_fallback: bool | None, cfg: config.Config) -> str:
    """The GPU target opened now (a missing GPU is an error of ``qd.init``): ``cuda`` (its device
    ``cfg.device_id`` and context) for ``qd.cuda``; for ``qd.gpu`` the first of ``cuda``,
    ``amdgpu`` that opens; or ``cpu`` where ``enable_fallback`` allows it, with a warning."""
    errors = []
    for candidate in (cuda, amdgpu) if arch == gpu else (cuda,):
        try:
            target_for(candidate).open(cfg)
            return candidate
        except QuadrantsRuntimeError as e:
            errors.append(e)
    if not (enable_fallback if enable_fallback is not None else arch == gpu):
        if len(errors) == 1:
            raise errors[0]
        raise QuadrantsRuntimeError(f"qd.init(arch=qd.{arch}): no usable GPU: " + "; ".join(map(str, errors)))
    warnings.warn(f"qd.init(arch=qd.{arch}): no usable GPU, falling back to qd.cpu ({'; '.join(map(str, errors))})",
                  QuadrantsWarning, stacklevel=3)
    return cpu


def set_default_types(default_fp=None, default_ip=None) -> None:
    """Change ``default_fp``/``default_ip`` of the configuration in force (Quadrants'
    ``get_runtime().set_default_fp/ip``): kernels recompile; fields stay valid."""
    cfg = config.current
    if default_fp is not None:
        cfg.default_fp = config.checked_default_type("default_fp", default_fp)
    if default_ip is not None:
        cfg.default_ip = config.checked_default_type("default_ip", default_ip)
    for callback in _on_init:
        callback()


_thread_limit = 0   # the cpu_max_num_threads in force (0: none, all of Numba's threads)


def _apply_thread_limit(limit: int) -> None:
    """Limit the threads of parallel tasks to ``limit``, or lift an earlier limit (0): the
    option lasts until the next ``qd.init``, as every other option does."""
    global _thread_limit
    if limit == _thread_limit:
        return
    numba.set_num_threads(min(limit, numba.config.NUMBA_NUM_THREADS) if limit else numba.config.NUMBA_NUM_THREADS)
    _thread_limit = limit


def sync() -> None:
    """Wait for every launched kernel (CPU kernels finish before they return; CUDA: all work of
    the device context, every stream included), then report what gradient launches found
    asynchronously (adstack overflows on CUDA)."""
    target_for(config.current.arch).synchronize()
    from .field import host_sync_checks, run_host_sync_checks

    if host_sync_checks:
        run_host_sync_checks()


def reset() -> None:
    """Back to the configuration of a program that never called ``qd.init`` (the CPU): fields
    created before are released and kernels recompile, as after ``qd.init``."""
    _install(config.config_from_env())
