"""``return_value(value, annotation)``: a kernel's returned value converted to its return
annotation (passes/return_rules.py puts it before each ``return``), as Quadrants casts a
returned scalar (``-> qd.i32`` returning 3.7 gives 3). A value of another shape (a vector where
``-> qd.f32`` is annotated, a scalar where a vector is) is a :class:`QuadrantsTypeError` at
typing, naming the kernel and the line of the ``return``.
"""

from __future__ import annotations

from numba.core import types
from numba.extending import overload

from .. import math as qd_math
from ..errors import QuadrantsTypeError, typing_error
from ..typing.matrix import MatrixType


def return_value(value, annotation):
    raise NotImplementedError("compiled code only")


def _describe(ty) -> str:
    if isinstance(ty, MatrixType):
        return f"a {'vector' if ty.is_vector else 'matrix'} {ty}"
    return f"a value of type {ty}"


@overload(return_value)
def _return_value(value, annotation):
    wanted = annotation.instance_type if isinstance(annotation, (types.NumberClass, types.TypeRef)) else annotation
    value = types.unliteral(value)
    if isinstance(wanted, MatrixType):
        fits = isinstance(value, MatrixType) and (value.n, value.m, value.ndim) == (wanted.n, wanted.m, wanted.ndim)
    else:
        fits = isinstance(value, (types.Number, types.Boolean))
    if not fits:
        raise typing_error(QuadrantsTypeError(
            f"the returned value is {_describe(value)} but the return annotation is {wanted}"))
    dtype = wanted.dtype if isinstance(wanted, MatrixType) else wanted
    return lambda value, annotation: qd_math.cast(value, dtype)
