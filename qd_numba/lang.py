"""Language constructs that kernels use by name: ``qd.ndrange``, ``qd.grouped``, ``qd.static``,
``qd.static_print``, ``qd.static_assert``, ``qd.atomic_*``, ``qd.random``, ``qd.loop_config``.

Inside kernels most of these are compile-time markers: the passes recognise the objects
defined here (by identity) and rewrite them — ``qd.static`` is folded, ``ndrange``/``grouped``
become iteration spaces, ``atomic_*`` become atomic read-modify-writes. Their Python
bodies give the same meaning in Python scope, where that makes sense.
"""

from __future__ import annotations

import itertools

import numpy as np
from numba.core import types
from numba.extending import overload

from . import config
from .errors import QuadrantsCompilationError


def ndrange(*dims):
    """Python scope: iterate over a multi-dimensional range (ints or ``(start, end)`` pairs)."""
    ranges = [range(d) if isinstance(d, (int, np.integer)) else range(d[0], d[1]) for d in dims]
    return itertools.product(*ranges)


def grouped(iterable):
    """In a kernel: iterate with one vector index ``I`` instead of separate indices."""
    from .field import ArrayData

    if isinstance(iterable, ArrayData):
        return ndrange(*iterable.shape)
    return iterable


def static(value, *more):
    """Evaluate at compile time (``if qd.static(cond)``, ``for i in qd.static(range(3))``)."""
    return (value, *more) if more else value


def static_print(*args, sep=" ", end="\n"):
    """Print at compile time: in a kernel, once per compiled instance, with the values known at
    compile time (runtime values print as ``<runtime name>``)."""
    print(*args, sep=sep, end=end)


def static_assert(cond, msg=None):
    """Check ``cond`` at compile time: in a kernel, a false or non-static condition is a
    ``QuadrantsCompilationError`` naming the kernel and the line."""
    if not cond:
        raise QuadrantsCompilationError(f"static assertion failed: {msg}" if msg is not None
                                        else "static assertion failed")


def loop_config(*, serialize: bool = False, block_dim: int | None = None, parallelize: int | None = None):
    """Options for the next top-level loop (``serialize=True`` runs it on one thread)."""


def _atomic_python(op):
    def atomic(target, value):
        raise RuntimeError(f"qd.atomic_{op} can only be used inside a kernel or func")

    atomic.__name__ = f"atomic_{op}"
    atomic.__qualname__ = atomic.__name__
    atomic.qd_atomic_op = op
    return atomic


atomic_add = _atomic_python("add")
atomic_sub = _atomic_python("sub")
atomic_min = _atomic_python("min")
atomic_max = _atomic_python("max")
atomic_and = _atomic_python("and")
atomic_or = _atomic_python("or")
atomic_xor = _atomic_python("xor")
ATOMIC_FUNCTIONS = {f: f.qd_atomic_op for f in (atomic_add, atomic_sub, atomic_min, atomic_max,
                                                 atomic_and, atomic_or, atomic_xor)}


def random(dtype=None):
    """A uniform random number: float in [0, 1), or an integer over the dtype's range."""
    dt = config.current.default_fp if dtype is None else dtype
    if isinstance(dt, types.Integer) or dt is int:
        return int(np.random.randint(-(2**31), 2**31))
    return float(np.random.random())


@overload(random, target="cpu")
def _random(dtype=None):
    if dtype is None or isinstance(dtype, (types.NoneType, types.Omitted)):
        fp = config.current.default_fp

        def impl(dtype=None):
            return fp(np.random.random())
        return impl
    if isinstance(dtype, types.NumberClass):
        inner = dtype.instance_type
        if isinstance(inner, types.Integer):
            def impl_int(dtype=None):
                return dtype(np.random.randint(-(2**31), 2**31))
            return impl_int

        def impl_float(dtype=None):
            return dtype(np.random.random())
        return impl_float
    return None


def _cuda_uniform(fp):
    """An implementation of a uniform float in [0, 1) of type ``fp`` on CUDA (24 or 53 bits)."""
    from .lowering.device import cuda_rng_u32

    if fp.bitwidth <= 32:
        def uniform32():
            return fp(np.float32(cuda_rng_u32() >> np.uint32(8)) * np.float32(1.0 / 16777216.0))
        return uniform32

    def uniform64():
        hi = np.uint64(cuda_rng_u32()) >> np.uint64(5)      # 27 bits
        lo = np.uint64(cuda_rng_u32()) >> np.uint64(6)      # 26 bits
        return fp(np.float64(hi * np.uint64(67108864) + lo) * (1.0 / 9007199254740992.0))
    return uniform64


@overload(random, target="cuda")
def _random_cuda(dtype=None):
    from numba import njit

    from .lowering.device import cuda_rng_u32

    if dtype is None or isinstance(dtype, (types.NoneType, types.Omitted)):
        uniform = njit(_cuda_uniform(config.current.default_fp))
        return lambda dtype=None: uniform()
    if isinstance(dtype, types.NumberClass):
        inner = dtype.instance_type
        if isinstance(inner, types.Integer):
            def impl_int(dtype=None):
                return dtype(np.int32(cuda_rng_u32()))
            return impl_int
        uniform = njit(_cuda_uniform(inner))
        return lambda dtype=None: uniform()
    return None


def sync() -> None:
    """Wait for all launched work (kernels on CPU return when done)."""
    from . import runtime

    runtime.sync()
