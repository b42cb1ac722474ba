"""``qd.lang.util``: the dtype and scope helpers of Quadrants' ``quadrants.lang.util`` that user
code calls. A qd dtype is a Numba type (dtypes.py), so the conversions are short.

Python code never runs inside a qd_numba kernel (Numba compiles the kernel), so
``in_python_scope()`` is always true where it can be called.
"""

from __future__ import annotations

import functools
import importlib.util
import traceback
import warnings

import numpy as np
from numba.np.numpy_support import from_dtype

from .. import dtypes


def has_pytorch() -> bool:
    """Whether torch can be imported."""
    return importlib.util.find_spec("torch") is not None


def cook_dtype(dtype):
    """The qd dtype of ``dtype``: ``float``/``int`` are ``default_fp``/``default_ip`` now."""
    return dtypes.to_numba(dtype)


def to_numpy_type(dt):
    """The numpy scalar type of a qd dtype (``qd.f32`` -> ``np.float32``)."""
    return dtypes.to_numpy(dt).type


def to_pytorch_type(dt):
    """The torch dtype of a qd dtype."""
    import torch

    return getattr(torch, dtypes.to_numpy(dt).name if dtypes.to_numba(dt) is not dtypes.u1 else "bool")


def to_quadrants_type(dt):
    """The qd dtype of a qd, numpy or torch dtype."""
    if type(dt).__module__.startswith("torch"):
        dt = str(dt).removeprefix("torch.")
    return dtypes.to_numba(dt) if not isinstance(dt, (str, np.dtype)) else from_dtype(np.dtype(dt))


def in_python_scope() -> bool:
    return True


def in_quadrants_scope() -> bool:
    return False


def python_scope(func):
    """Mark ``func`` as Python-scope only (every call from Python is)."""
    return func


def quadrants_scope(func):
    """Mark ``func`` as callable from kernels only: a call from Python raises."""
    @functools.wraps(func)
    def wrapped(*args, **kwargs):
        raise RuntimeError(f"{func.__name__} cannot be called in Python-scope")

    return wrapped


def get_traceback(stacklevel: int = 1) -> str:
    return "".join(traceback.format_list(traceback.extract_stack()[: -1 - stacklevel]))


def warning(msg, warning_type=UserWarning, stacklevel=1, print_stack=True) -> None:
    """Warn with ``msg`` (and the caller's stack)."""
    warnings.warn(f"{msg}\n{get_traceback(stacklevel)}" if print_stack else msg, warning_type, stacklevel + 1)


__all__: list = []
