"""Lowering of float literals (typing/literals.py): a ``default_fp`` value in memory; a cast to a
float type emits the Python value as a constant of that type, so a literal next to an f64
operand is the exact f64 constant, not the f64 of its ``default_fp`` rounding."""

from __future__ import annotations

from llvmlite import ir as llir
from numba.core import types
from numba.core.datamodel import models
from numba.core.imputils import lower_cast, lower_constant
from numba.extending import register_model

from ..typing.literals import FloatLiteral


@register_model(FloatLiteral)
class FloatLiteralModel(models.PrimitiveModel):
    def __init__(self, dmm, fe_type):
        be_type = {16: llir.HalfType(), 32: llir.FloatType(), 64: llir.DoubleType()}[fe_type.bitwidth]
        super().__init__(dmm, fe_type, be_type)


@lower_constant(FloatLiteral)
def _constant(context, builder, ty, pyval):
    return context.get_constant(ty.literal_type, ty.literal_value)


@lower_cast(FloatLiteral, types.Float)
def _to_float(context, builder, fromty, toty, val):
    return context.get_constant(toty, fromty.literal_value)


@lower_cast(FloatLiteral, types.Number)
@lower_cast(FloatLiteral, types.Boolean)
def _to_other(context, builder, fromty, toty, val):
    fp = fromty.literal_type
    return context.cast(builder, context.get_constant(fp, fromty.literal_value), fp, toty)
