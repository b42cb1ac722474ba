"""``qd.types``: annotation and element-type constructors."""

from __future__ import annotations

from numba.core import types

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
    to_numba,
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
from .errors import QuadrantsTypeError
from .frontend.args import NDArray, NdarraySpec, Template
from .matrix import matrix, vector  # noqa: F401
from .struct import struct  # noqa: F401
from .typing.matrix import MatrixType


def ndarray(dtype=None, ndim=None) -> NdarraySpec:
    """Annotation of an ndarray kernel parameter (``dtype`` may be a vector/matrix type)."""
    return NdarraySpec(dtype, ndim)


def is_integral(dtype) -> bool:
    """Whether ``dtype`` is an integer type (``u1``, the boolean, counts as one, as in Quadrants)."""
    return isinstance(_scalar(dtype), (types.Integer, types.Boolean))


def is_real(dtype) -> bool:
    """Whether ``dtype`` is a floating-point type."""
    return isinstance(_scalar(dtype), types.Float)


def is_signed(dtype) -> bool:
    """Whether the integer type ``dtype`` is signed (a ``QuadrantsTypeError`` for other types)."""
    t = _scalar(dtype)
    if not is_integral(t):
        raise QuadrantsTypeError(f"qd.types.is_signed takes an integer type, got {dtype!r}")
    return isinstance(t, types.Integer) and t.signed


def is_unsigned(dtype) -> bool:
    """Whether the integer type ``dtype`` is unsigned (``u1`` included)."""
    return not is_signed(dtype)


def is_tensor(dtype) -> bool:
    """Whether ``dtype`` is a vector or matrix type (``qd.types.vector(3, qd.f32)``)."""
    return isinstance(dtype, MatrixType)


def _scalar(dtype) -> types.Type:
    if isinstance(dtype, MatrixType):
        return dtype
    try:
        return to_numba(dtype)
    except TypeError:
        raise QuadrantsTypeError(f"not a qd dtype: {dtype!r}") from None


class sparse_matrix_builder(Template):
    """``qd.types.sparse_matrix_builder()``: a ``qd.linalg.SparseMatrixBuilder`` parameter, filled
    with ``A[i, j] += v`` (passed as a template: one compiled instance per builder)."""

    def __repr__(self):
        return "qd.types.sparse_matrix_builder()"

    @staticmethod
    def check_argument(where: str, value) -> None:
        if not hasattr(type(value), "qd_subscript_updates"):
            raise QuadrantsTypeError(f"{where}: a qd.types.sparse_matrix_builder() parameter takes a "
                                     f"qd.linalg.SparseMatrixBuilder, got {type(value).__name__}")


template = Template
__all__ = ["ndarray", "sparse_matrix_builder",
           "NDArray", "template", "vector", "matrix", "struct", "is_integral", "is_real", "is_signed",
           "is_unsigned", "is_tensor"]
