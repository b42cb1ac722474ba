"""``qd.lang.misc``: arches, extensions and ``init`` as Quadrants' ``quadrants.lang.misc`` has them.

:class:`Extension` (``qd.extension``) names Quadrants' optional features; :data:`SUPPORTED_EXTENSIONS`
says honestly which ones qd_numba has on each arch: 64-bit data types, the autodiff stack
(loops of runtime length in gradient kernels), kernel assertions (``debug=True``) and sparse
SNodes (stored densely, snode.py). It has no quantised types, meshes, block-local storage or
external functions.
"""

from __future__ import annotations

import enum

from .. import config
from ..runtime import amdgpu, arm64, cpu, cuda, gpu, init, metal, reset, vulkan, x64, x86_64  # noqa: F401
from . import loop_config  # noqa: F401
from .impl import current_cfg


class Extension(enum.IntEnum):
    """Quadrants' extensions (same names and values)."""

    sparse = 0
    quant = 1
    mesh = 2
    quant_basic = 3
    data64 = 4
    adstack = 5
    bls = 6
    assertion = 7
    extfunc = 8


extension = Extension
_HOST_FEATURES = frozenset({Extension.data64, Extension.adstack, Extension.assertion, Extension.sparse})
SUPPORTED_EXTENSIONS = {cpu: _HOST_FEATURES, x64: _HOST_FEATURES, arm64: _HOST_FEATURES, cuda: _HOST_FEATURES,
                        gpu: _HOST_FEATURES}
"""arch -> the extensions qd_numba has there (Quadrants' other backends: none)."""


def is_extension_supported(arch, ext) -> bool:
    """Whether qd_numba has extension ``ext`` on ``arch`` (on any machine)."""
    return Extension(ext) in SUPPORTED_EXTENSIONS.get(arch, frozenset())


def is_extension_enabled(arch_or_ext, ext=None) -> bool:
    """``is_extension_enabled(ext)`` (Quadrants: on the arch in force) or
    ``is_extension_enabled(arch, ext)``."""
    if ext is None:
        return is_extension_supported(config.current.arch, arch_or_ext)
    return is_extension_supported(arch_or_ext, ext)


def is_arch_supported(arch) -> bool:
    """Whether ``qd.init(arch=arch)`` can run on this machine."""
    if arch in (cpu, x64, arm64):
        return True
    if arch in (cuda, gpu):
        from ..targets.cuda.compile import cuda_available

        return cuda_available()
    return False


def get_host_arch_list() -> list:
    """The arches of this host's CPU: ``[qd.cpu]``."""
    return [cpu]


def dump_compile_config() -> None:
    """Print every option of the configuration in force, one ``name=value`` a line."""
    cfg = current_cfg()
    print("\n".join(f"{name}={getattr(cfg, name)}" for name in dir(cfg)))


__all__ = ["x86_64", "x64", "arm64", "cpu", "cuda", "amdgpu", "gpu", "metal", "vulkan", "extension",
           "loop_config", "dump_compile_config", "init", "reset", "is_extension_enabled"]
