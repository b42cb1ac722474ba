"""Scalar data types: ``qd.i32``-style names, their numpy and Numba forms.

A qd dtype *is* the Numba scalar type (``qd.f32 is numba.float32``), so it can be used in
annotations, in ``qd.cast`` and in typing code without conversion.
"""

from __future__ import annotations

import numpy as np
from numba.core import types
from numba.np.numpy_support import from_dtype

from . import config

i8, i16, i32, i64 = types.int8, types.int16, types.int32, types.int64
u8, u16, u32, u64 = types.uint8, types.uint16, types.uint32, types.uint64
f16, f32, f64 = types.float16, types.float32, types.float64
u1 = types.boolean

int8, int16, int32, int64 = i8, i16, i32, i64
uint8, uint16, uint32, uint64 = u8, u16, u32, u64
float16, float32, float64 = f16, f32, f64

SCALAR_TYPES = (i8, i16, i32, i64, u8, u16, u32, u64, f16, f32, f64, u1)


def to_numba(dtype) -> types.Type:
    """The Numba scalar type for a qd dtype, numpy dtype, or Python ``int``/``float``/``bool``;
    ``int`` and ``float`` are ``qd.init(default_ip=/default_fp=)`` in force at the call."""
    if isinstance(dtype, types.Type):
        return dtype
    if dtype is int:
        return config.current.default_ip
    if dtype is float:
        return config.current.default_fp
    if dtype is bool:
        return u1
    try:
        return from_dtype(np.dtype(dtype))
    except (TypeError, NotImplementedError) as e:
        raise TypeError(f"not a qd dtype: {dtype!r}") from e


def to_numpy(dtype) -> np.dtype:
    """The numpy dtype of a qd dtype."""
    nb = to_numba(dtype)
    return np.dtype(np.bool_) if nb is u1 else np.dtype(str(nb))


def is_real(dtype) -> bool:
    return isinstance(to_numba(dtype), types.Float)


def is_integral(dtype) -> bool:
    return isinstance(to_numba(dtype), types.Integer)
