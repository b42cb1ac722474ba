"""``qd.types``: annotation and element-type constructors."""

from __future__ import annotations

from .dtypes import (  # noqa: F401
    f16,
    f32,
    f64,
    float16,
    float32,
    float64,
    i8,
    i16,
    i32,
    i64,
    int8,
    int16,
    int32,
    int64,
    u1,
    u8,
    u16,
    u32,
    u64,
    uint8,
    uint16,
    uint32,
    uint64,
)
from .frontend.args import NDArray, NdarraySpec, Template
from .matrix import matrix, vector  # noqa: F401


def ndarray(dtype=None, ndim=None) -> NdarraySpec:
    """Annotation of an ndarray kernel parameter (``dtype`` may be a vector/matrix type)."""
    return NdarraySpec(dtype, ndim)


template = Template
__all__ = ["ndarray", "NDArray", "template", "vector", "matrix"]
