"""Float literals of a kernel: constants of ``default_fp`` that stay exact next to wider floats.

In Quadrants a Python float in a kernel (``0.9``) is a constant of ``default_fp``, so
``v_f32 * 0.9 + 0.1`` is f32 arithmetic; Numba types every Python float as ``float64``, which
made such code silently run in f64. passes/float_literals.py wraps each float constant of a
kernel in a :class:`FloatLiteralValue`, typed here as a :class:`FloatLiteral`:

* a ``types.Literal`` whose ``literal_type`` is ``default_fp``: every template that takes
  non-literal arguments (Numba's arithmetic and math, ``@overload``, njit callees, qd's own
  templates) sees a ``default_fp`` value, so ``f32 op literal`` is f32 and ``qd.sin(0.5)``
  computes in ``default_fp``;
* the type remembers the Python value: a cast to a wider float emits the exact constant
  (lowering/literals.py), so ``x_f64 * 0.1`` multiplies by the f64 ``0.1``, as numpy does;
* :class:`LiteralArithmetic`: an integer (or bool) with a float literal computes in
  ``default_fp`` (Numba would promote ``int64`` with a float to ``float64``); it is registered
  per target so that it is tried before Numba's generic templates (``order_by_target_specificity``);
* templates that see literal types (``prefer_literal``) keep a literal exact where they know the
  wider float it meets: matrix operators, matrix methods (:func:`literal_argument`) and the
  ``qd.Vector``/``qd.Matrix`` constructors (typing/matrix.py, ops/matrix_methods.py);
* unification follows Numba: a variable assigned a literal and an f64 value is f64.
"""

from __future__ import annotations

import operator

from numba.core import types
from numba.core.typeconv import Conversion
from numba.core.typing.templates import AbstractTemplate, infer_global, signature
from numba.core.typing.typeof import typeof_impl


class FloatLiteralValue:
    """A Python float of a kernel together with the ``default_fp`` it is typed as."""

    __slots__ = ("value", "fp")

    def __init__(self, value: float, fp: types.Float):
        self.value, self.fp = value, fp

    def __repr__(self) -> str:
        return f"{self.value!r}:{self.fp}"


class FloatLiteral(types.Literal, types.Float):
    """The type of a float literal: a ``default_fp`` (``fp``) constant holding its value."""

    def __init__(self, value: float, fp: types.Float):
        self._literal_init(value)
        self._literal_type_cache = fp
        types.Number.__init__(self, name=f"Literal[float]({value!r}, {fp})")
        self.bitwidth = fp.bitwidth

    def can_convert_to(self, typingctx, other):
        conv = typingctx.can_convert(self.literal_type, other)
        if conv is not None:
            return max(conv, Conversion.promote)
        return None


@typeof_impl.register(FloatLiteralValue)
def _typeof_float_literal(val, c):
    return FloatLiteral(val.value, val.fp)


_ARITHMETIC = (operator.add, operator.sub, operator.mul, operator.truediv, operator.floordiv, operator.mod,
               operator.pow, operator.iadd, operator.isub, operator.imul, operator.itruediv, operator.ifloordiv,
               operator.imod, operator.ipow)
_COMPARISONS = (operator.lt, operator.le, operator.gt, operator.ge, operator.eq, operator.ne)


def literal_operand_type(args):
    """``default_fp`` when ``args`` are a float literal and an integer, a bool or another
    literal; None otherwise (Numba's own rules then apply, with the literal as ``default_fp``)."""
    if len(args) != 2 or not any(isinstance(a, FloatLiteral) for a in args):
        return None
    if not all(isinstance(a, (FloatLiteral, types.Integer, types.Boolean)) for a in args):
        return None
    fps = [a.literal_type for a in args if isinstance(a, FloatLiteral)]
    return max(fps, key=lambda t: t.bitwidth)


def literal_argument(t, dtype):
    """The type a value of type ``t`` is passed as to an operation on ``dtype`` values: a float
    literal is ``dtype`` when that is a wider float (the literal converts exactly), else
    ``default_fp``; other types are unliteral."""
    if isinstance(t, FloatLiteral) and isinstance(dtype, types.Float) and dtype.bitwidth > t.bitwidth:
        return dtype
    return types.unliteral(t)


class LiteralArithmetic(AbstractTemplate):
    """``int op literal`` (either side): computed in ``default_fp``, as in Quadrants."""

    prefer_literal = True

    def generic(self, args, kws):
        fp = literal_operand_type(args)
        if fp is None or kws:
            return None
        result = types.boolean if self.key in _COMPARISONS else fp
        return signature(result, fp, fp)


def _register(target: str) -> None:
    for op in _ARITHMETIC + _COMPARISONS:
        cls = type(f"LiteralArithmetic_{op.__name__}_{target}", (LiteralArithmetic,),
                   {"key": op, "metadata": {"target": target}})
        infer_global(op)(cls)


_register("cpu")
_register("cuda")
