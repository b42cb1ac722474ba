"""Language constructs that kernels use by name: ``qd.ndrange``, ``qd.grouped``, ``qd.static``,
``qd.static_print``, ``qd.static_assert``, ``qd.atomic_*``, ``qd.random``, ``qd.loop_config``,
``qd.stream_parallel``.

Inside kernels most of these are compile-time markers: the passes recognise the objects
defined here (by identity) and rewrite them — ``qd.static`` is folded, ``ndrange``/``grouped``
become iteration spaces, ``atomic_*`` become atomic read-modify-writes. Their Python
bodies give the same meaning in Python scope, where that makes sense.

The package mirrors the layout of Quadrants' ``quadrants.lang`` for code that imports from it
(``qd.lang.impl.get_runtime()``, ``from qd_numba.lang.exception import ...``): ``impl`` (the
runtime and its configuration), ``exception`` (error classes), ``misc`` (arches, extensions,
``init``), ``util`` (dtype helpers), ``ops`` (operations). Those modules sit above the runtime
and are imported by ``qd_numba/__init__.py``; this one sits below the passes, which import it,
so it imports none of them.
"""

from __future__ import annotations

import contextlib
import itertools

import numpy as np
from numba.core import types
from numba.extending import overload

from .. import config, dtypes, random_state
from ..errors import QuadrantsCompilationError, QuadrantsSyntaxError, QuadrantsTypeError, typing_error


def ndrange(*dims):
    """Python scope: iterate over a multi-dimensional range (ints or ``(start, end)`` pairs)."""
    ranges = [range(d) if isinstance(d, (int, np.integer)) else range(d[0], d[1]) for d in dims]
    return itertools.product(*ranges)


def grouped(iterable):
    """In a kernel: iterate with one vector index ``I`` instead of separate indices."""
    from ..field import ArrayData

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


@contextlib.contextmanager
def stream_parallel():
    """``with qd.stream_parallel():`` at a kernel's top level: the loops of consecutive blocks run
    concurrently, each block on its own GPU stream (passes/stream_blocks.py, docs/streams.md).
    In Python scope it does nothing."""
    yield


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
    """A uniform random number: a float in [0, 1), or an integer (an int32 value cast to the dtype).

    Reproducible: ``qd.init(random_seed=s)`` fixes every number a program draws, on every
    backend and thread count (lowering/random.py; docs/guide/random.md). In Python scope the
    same generator runs on its own stream."""
    cfg = config.current
    dt = cfg.default_fp if dtype is None or dtype is float else cfg.default_ip if dtype is int \
        else dtypes.to_numba(dtype)
    if not isinstance(dt, (types.Integer, types.Float)):
        raise QuadrantsTypeError(f"qd.random(dtype): dtype must be an integer or float type (qd.f32, qd.i32, ...), "
                                 f"got {dtype!r}")
    return random_state.python_random(dt)


def _random_outside_kernel(dtype=None):
    """Kernels and qd.funcs have their qd.random calls numbered (passes/random_streams.py);
    a call left in compiled code is in a function they call, which cannot be numbered."""
    raise typing_error(QuadrantsSyntaxError(
        "qd.random() can only be called in a kernel or a qd.func, not in a @numba.njit function they call "
        "(its numbers could not be reproducible); draw the number in the kernel and pass it"))


overload(random, target="cpu")(_random_outside_kernel)
overload(random, target="cuda")(_random_outside_kernel)


def __getattr__(name):
    """Quadrants' ``quadrants.lang`` also re-exports the language's public names (``field``,
    ``kernel``, ``Matrix``, ``init``, ...): here they are ``qd_numba``'s own, looked up when asked
    for (this module cannot import them: it sits below the passes)."""
    import qd_numba

    value = getattr(qd_numba, name, None) if not name.startswith("_") else None
    if value is None or isinstance(value, type(itertools)):
        raise AttributeError(f"module 'qd_numba.lang' has no attribute {name!r}")
    return value
