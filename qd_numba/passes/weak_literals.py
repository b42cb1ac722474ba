"""WeakFloatLiterals: a float literal takes the float type of the value it meets.

Python types ``2.0`` as a float64, so in Numba ``x[i] * 2.0 + 1.0`` on an ``f32`` field computes
in f64 (on a GPU: double-precision instructions, half or 1/64 of the f32 rate). Quadrants types
a literal as ``default_fp``; numpy 2 treats a Python scalar as *weak* (``f32_array * 0.1`` is
f32). This pass does the latter, the way that never loses precision: in a binary operation,
a comparison or a math function of several arguments (``qd.max(x, 0.0)``, ``qd.clamp(v, 0.0,
1.0)``) whose other operands are known floats, the widest of type ``P``, a literal becomes a
constant of ``P`` — or of ``default_fp`` where that is wider (an ``f16`` value meets an ``f32``
literal, as in Quadrants). An ``f64`` operand keeps the exact f64 literal.

Input: the kernel IR after RewriteSubscripts and DirectArrayAccess (``a / b`` is a
``true_divide`` call by then; its operands count too). What "known" means, from single
definitions only: a float runtime parameter, an element load of a scalar float field or of a
float ndarray parameter, a component of a vector loaded from a float vector field (``v[i].x``,
``v[i][1]``), and arithmetic, negation, division and the math functions
(``ops/math_ops.MATH_OPS``, which keep their arguments' float type) of known floats and
literals. Anything else (a local assigned in several places, another call's result, an
integer) leaves the literal as Python's float64: the pass only ever narrows a literal to the
type its partners have.

Each narrowed literal is a new ``$weak_const`` constant assigned right before its use (the
original may have other uses). Never touches control flow or any other statement.
"""

from __future__ import annotations

import operator

import numpy as np
from numba.core import types
from numba.np import numpy_support

from ..lowering import array_access
from ..lowering import subscripts as sub_impl
from ..ops.math_ops import MATH_OPS
from .autodiff import _MATH_CALLEES
from .base import argument_of

_OPS = frozenset({operator.add, operator.sub, operator.mul, operator.truediv, operator.floordiv, operator.mod,
                  operator.pow, operator.lt, operator.le, operator.gt, operator.ge, operator.eq, operator.ne,
                  operator.iadd, operator.isub, operator.imul, operator.itruediv, operator.ifloordiv,
                  operator.imod, operator.ipow})
_ARITHMETIC = _OPS - {operator.lt, operator.le, operator.gt, operator.ge, operator.eq, operator.ne}
_NUMPY = {16: np.float16, 32: np.float32}
_ARRAY_LOADS = (array_access.array_load, array_access.checked_array_load)
_MAX_DEPTH = 32
_COMPONENTS = frozenset({"x", "y", "z", "w"})
# math functions whose result has the float type of their arguments (f32 in, f32 out), by name
_FLOAT_PRESERVING = frozenset(MATH_OPS) - {"select"}


def _literal(state, var):
    """The Python float ``var`` is a literal of, or None."""
    d = state.definition(var)
    if isinstance(d, state.ir.Const) and type(d.value) is float:
        return d.value
    return None


class WeakFloatLiterals:
    name = "weak_float_literals"

    def run(self, state) -> bool:
        state.refresh_definitions()
        self.state, self.known = state, {}
        ir = state.ir
        changed = False
        for block in state.func_ir.blocks.values():
            new_body = []
            for stmt in block.body:
                for slot, literal_var, narrowed in self._literals(stmt):
                    value = _NUMPY[narrowed.bitwidth](_literal(state, literal_var))
                    const = ir.Var(block.scope, block.scope.redefine("$weak_const", stmt.loc).name, stmt.loc)
                    new_body.append(ir.Assign(ir.Const(value, stmt.loc), const, stmt.loc))
                    state.func_ir._definitions[const.name] = [new_body[-1].value]
                    slot(const)
                    changed = True
                new_body.append(stmt)
            block.body = new_body
        if changed:
            state.refresh_definitions()
        return changed

    def _literal_type(self, partner: types.Float) -> types.Float:
        """The type a literal takes next to a ``partner`` float: the wider of it and
        ``default_fp`` (float64: the literal stays as Python typed it)."""
        fp = self.state.config.default_fp
        width = max(partner.bitwidth, fp.bitwidth if isinstance(fp, types.Float) else 64)
        return types.float64 if width >= 64 else types.float32 if width == 32 else types.float16

    def _literals(self, stmt) -> list:
        """(setter, literal variable, its narrowed type) for each literal operand of ``stmt``
        that meets known floats: in a binary operation or comparison, a ``true_divide`` call, or
        a math function of two or more arguments (``qd.max(x, 0.0)``, ``qd.clamp(x, 0.0, 1.0)``)."""
        operands = self._operands(stmt)
        if not operands:
            return []
        literal = [(slot, var) for var, slot in operands if _literal(self.state, var) is not None]
        others = [var for var, _ in operands if _literal(self.state, var) is None]
        if not literal or not others:
            return []
        # a vector of a float field counts as its element type (its arithmetic with a scalar
        # casts the scalar to it anyway)
        partner = self._wider([self._float_type(var, 0) or self._vector_element(var, 0) for var in others])
        narrowed = self._literal_type(partner) if partner is not None else types.float64
        if narrowed == types.float64:
            return []
        return [(slot, var, narrowed) for slot, var in literal]

    def _operands(self, stmt) -> list:
        """(variable, setter) of each operand of ``stmt`` whose literals may be narrowed."""
        ir = self.state.ir
        value = stmt.value if isinstance(stmt, ir.Assign) else None
        if not isinstance(value, ir.Expr):
            return []
        if value.op in ("binop", "inplace_binop") and value.fn in _OPS:
            return [(value.lhs, lambda v, e=value: setattr(e, "lhs", v)),
                    (value.rhs, lambda v, e=value: setattr(e, "rhs", v))]
        if value.op == "call" and not value.kws and value.vararg is None:
            fn = self._callee(value.func)
            if fn is sub_impl.true_divide and len(value.args) == 3:
                args = value.args[:2]
            elif _MATH_CALLEES.get(fn) in _FLOAT_PRESERVING and len(value.args) >= 2:
                args = value.args
            else:
                return []
            return [(var, lambda v, e=value, k=k: e.args.__setitem__(k, v)) for k, var in enumerate(args)]
        return []

    def _callee(self, func):
        d = self.state.definition(func)
        return d.value if isinstance(d, (self.state.ir.Global, self.state.ir.FreeVar)) else None

    @staticmethod
    def _wider(found: list):
        """The widest of known float types; None if one is not known."""
        if not found or any(t is None for t in found):
            return None
        return max(found, key=lambda t: t.bitwidth)

    def _float_type(self, var, depth: int):
        """The float type ``var`` is known to have (module docstring), or None."""
        if depth > _MAX_DEPTH:
            return None
        name = var.name
        if name in self.known:
            return self.known[name]
        self.known[name] = None         # a cycle through phis stays unknown
        found = self._infer(var, depth)
        self.known[name] = found
        return found

    def _infer(self, var, depth):
        state, ir = self.state, self.state.ir
        d = state.definition(var)
        if isinstance(d, ir.Var):
            return self._float_type(d, depth + 1)
        if isinstance(d, ir.Const) and isinstance(d.value, (np.float16, np.float32, np.float64)):  # narrowed before
            return numpy_support.from_dtype(d.value.dtype)
        if isinstance(d, ir.Arg):
            ty = state.param_types.get(d.name)
            return ty if isinstance(ty, types.Float) else None
        if not isinstance(d, ir.Expr):
            return None
        if d.op in ("getitem", "static_getitem"):
            field = self._field(d.value)
            if field is not None:
                return field.dtype if field.element_shape == () and isinstance(field.dtype, types.Float) else None
            index = d.index if d.op == "static_getitem" else getattr(state.definition(d.index), "value", None)
            if isinstance(index, int) and not isinstance(index, bool):      # a component of a vector
                return self._vector_element(d.value, depth)
            return None
        if d.op == "getattr" and d.attr in _COMPONENTS:
            return self._vector_element(d.value, depth)
        if d.op == "unary" and d.fn in (operator.neg, operator.pos, "-", "+"):
            return self._float_type(d.value, depth + 1)
        if d.op in ("binop", "inplace_binop") and d.fn in _ARITHMETIC:
            return self._combined([d.lhs, d.rhs], depth)
        if d.op == "call":
            fn = self._callee(d.func)
            if fn is sub_impl.true_divide and len(d.args) == 3:
                return self._combined(d.args[:2], depth)
            if _MATH_CALLEES.get(fn) in _FLOAT_PRESERVING and d.args and not d.kws:
                return self._combined(d.args, depth)
            if fn in _ARRAY_LOADS and d.args:
                arg = argument_of(state, d.args[0])
                ty = state.param_types.get(arg.name) if arg is not None else None
                return ty.dtype if isinstance(ty, types.Array) and isinstance(ty.dtype, types.Float) else None
        return None

    def _field(self, var):
        """The field ``var`` is (a hidden argument), or None."""
        arg = argument_of(self.state, var)
        field = self.state.hidden_by_arg_index(arg.index) if arg is not None else None
        return field if hasattr(field, "element_shape") and hasattr(field, "dtype") else None

    def _vector_element(self, var, depth):
        """The float element type of ``var`` when it is a vector loaded from a float vector field
        (``v[i]``, or a local holding one), else None."""
        for _ in range(_MAX_DEPTH - depth):
            d = self.state.definition(var)
            if not isinstance(d, self.state.ir.Var):
                break
            var = d
        if not (isinstance(d, self.state.ir.Expr) and d.op in ("getitem", "static_getitem")):
            return None
        field = self._field(d.value)
        if field is None or len(field.element_shape) != 1 or not isinstance(field.dtype, types.Float):
            return None
        return field.dtype

    def _combined(self, operands: list, depth):
        """The float type of arithmetic or a math function on ``operands``: the widest of the
        known floats among them and of the type a literal next to them takes; None if one
        operand is neither a literal nor a known float, or none is known."""
        known = [self._float_type(var, depth + 1) for var in operands if _literal(self.state, var) is None]
        widest = self._wider(known)
        if widest is None:
            return None
        if len(known) < len(operands):
            return self._wider([widest, self._literal_type(widest)])
        return widest
