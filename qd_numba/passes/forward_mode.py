"""ForwardMode: the forward-mode twin of a kernel (``kernel.forward_mode``, run by ``qd.ad.FwdMode``).

Runs only in a compile with ``state.autodiff_mode == "forward"``, after PlanTasks. Every
assignment ``t = expr`` of the kernel keeps its place and is followed by its tangent,
``$fd_t = sum_k d expr / d arg_k * $fd_arg_k`` — each partial derivative traced from the same
rule table as reverse mode (``ops/math_ops.py``: a rule's contribution to argument k with a unit
adjoint is the partial derivative). Reads of a field with a ``.dual`` read the dual too; stores
and atomic adds to such a field store/add the tangent into its ``.dual``. Tangents are plain
variables next to the values, so loops, branches and serial code need nothing more (no stacks:
forward mode runs forward). Vector/matrix constructors are linear: the tangent is the same
constructor over the tangents of their elements. Integer casts, comparisons, ``qd.stop_grad``
and ndarray reads carry a zero tangent; calls without a rule are rejected naming the line.
"""

from __future__ import annotations

import operator

from numba.core import types

from .. import math as qd_math
from ..errors import QuadrantsSyntaxError
from ..lowering import autodiff as ad_helpers
from ..lowering import subscripts
from ..ops.math_ops import MATH_OPS, OPERATOR_ADJOINTS
from .autodiff import (
    _ARRAY_LOADS,
    _ARRAY_STORES,
    _COMPONENTS,
    _FLOAT_CASTS,
    _MATH_CALLEES,
    _clean,
    _Emitter,
    _is_constant_matrix,
    _is_constructor,
    _is_no_gradient,
    trace_rule,
)
from .base import MISSING, hidden_argument, is_global_data, try_static
from .plan_tasks import PlanTasks

_LINEAR_METHODS = ("transpose", "sum", "trace", "dot")     # vector/matrix methods with a tangent here
_PLUMBING = ("getiter", "iternext", "pair_first", "pair_second", "exhaust_iter")


class ForwardMode:
    name = "forward_mode"

    def run(self, state) -> bool:
        if getattr(state, "autodiff_mode", None) != "forward":
            return False
        if state.returns_value:
            raise state.error(QuadrantsSyntaxError, "qd.ad.FwdMode: a kernel that returns a value cannot be "
                              "differentiated")
        _Tangents(state).run()
        state.refresh_definitions()
        PlanTasks().run(state)
        return True


class _Tangents:
    def __init__(self, state):
        self.state, self.ir = state, state.ir
        self.untangled = self._untangled()

    def _untangled(self) -> set:
        """Variables without a tangent: the parallel loops' plumbing, iterators and what they
        yield (indices), and copies of those."""
        ir = self.ir
        out = {s.target.name for lp in self.state.loops for s in lp.plumbing if isinstance(s, ir.Assign)}
        changed = True
        assigns = [s for b in self.state.func_ir.blocks.values() for s in b.body if isinstance(s, ir.Assign)]
        while changed:
            changed = False
            for stmt in assigns:
                value = stmt.value
                plumbing = isinstance(value, ir.Expr) and value.op in _PLUMBING or \
                    isinstance(value, ir.Var) and value.name in out
                if plumbing and stmt.target.name not in out:
                    out.add(stmt.target.name)
                    changed = True
        return out

    def tangent(self, var, e=None):
        """The tangent variable of ``var`` (one per variable name, assigned next to it); for a
        variable without one, a zero constant (``e`` emits it)."""
        if var.name in self.untangled:
            return e.const(0.0)
        scope = var.scope
        name = f"$fd_{_clean(var.name)}"
        scope.get_or_define(name, var.loc)
        return self.ir.Var(scope, name, var.loc)

    def run(self):
        ir = self.ir
        for block in list(self.state.func_ir.blocks.values()):
            out = []
            for stmt in block.body:
                out.append(stmt)
                e = _Emitter(self.state, block.scope, stmt.loc, out)
                if isinstance(stmt, ir.Assign):
                    if stmt.target.name in self.untangled:
                        continue
                    value = self._assign(e, stmt)
                    if value is not None:
                        out.append(ir.Assign(value, self.tangent(stmt.target), stmt.loc))
                elif isinstance(stmt, (ir.SetItem, ir.StaticSetItem)) and is_global_data(self.state, stmt.target):
                    dual = self._dual_field(stmt.target, stmt.loc)
                    if dual is not None:
                        index = stmt.index if isinstance(stmt, ir.SetItem) else e.const(stmt.index)
                        out.append(ir.SetItem(dual, index, self.tangent(stmt.value, e), stmt.loc))
            block.body = out

    def _zero(self, e, target):
        return e.ir.Expr.call(e.assign(e.ir.Global("zero_like", ad_helpers.zero_like, e.loc), "$fd_fn"),
                              [target], (), e.loc)

    def _dual_field(self, base, loc):
        field = try_static(self.state, base)
        dual = getattr(field, "dual", None)
        return None if dual is None else hidden_argument(self.state, dual, loc)

    def _assign(self, e, stmt):
        """The tangent of ``stmt.target`` (an IR value) after the statements it needs."""
        ir, state = self.ir, self.state
        value = stmt.value
        if isinstance(value, ir.Var):
            return self.tangent(value, e)
        if not isinstance(value, ir.Expr):
            return self._zero(e, stmt.target)       # constants, globals, arguments
        op = value.op
        if op in ("binop", "inplace_binop", "unary"):
            fn = value.fn if op != "inplace_binop" else value.immutable_fn
            rule = OPERATOR_ADJOINTS.get(fn)
            if rule is None:
                return self._zero(e, stmt.target)   # comparisons, //, %
            if fn is operator.matmul:       # d(a @ b) = da @ b + a @ db
                left = e.binop(operator.matmul, self.tangent(value.lhs, e), value.rhs)
                right = e.binop(operator.matmul, value.lhs, self.tangent(value.rhs, e))
                return e.ir.Expr.binop(operator.add, left, right, e.loc)
            args = [value.lhs, value.rhs] if op != "unary" else [value.value]
            return self._jvp(e, rule, args, stmt.target)
        if op in ("getitem", "static_getitem"):
            index = value.index if op == "getitem" else e.const(value.index)
            if is_global_data(state, value.value):
                dual = self._dual_field(value.value, stmt.loc)
                return self._zero(e, stmt.target) if dual is None else ir.Expr.getitem(dual, index, stmt.loc)
            return self._item(e, value.value, index, stmt.target)
        if op == "getattr" and value.attr in _COMPONENTS:
            return self._item(e, value.value, e.const(_COMPONENTS[value.attr]), stmt.target)
        if op == "call":
            return self._call(e, stmt)
        return self._zero(e, stmt.target)           # iterators, tuples, attributes

    def _item(self, e, base, index, target):
        return e.ir.Expr.call(e.assign(e.ir.Global("fwd_item", ad_helpers.fwd_item, e.loc), "$fd_fn"),
                              [self.tangent(base, e), index, target], (), e.loc)

    def _jvp(self, e, rule, args, target):
        one = e.const(1.0)
        partials = trace_rule(e, rule, args, target, one)
        total = e.assign(self._zero(e, target), "$fd")
        for arg, partial in zip(args, partials):
            term = e.binop(operator.mul, partial, self.tangent(arg, e))
            total = e.call(ad_helpers.ad_acc, [total, term], "$fd")
        return total

    def _call(self, e, stmt):
        state = self.state
        callee = try_static(state, stmt.value.func)
        args = stmt.value.args
        if callee is subscripts.atomic_update:
            base, index, operand = args[0], args[1], args[2]
            op = try_static(state, args[3])
            dual = self._dual_field(base, stmt.loc) if is_global_data(state, base) else None
            if dual is not None:
                if op not in ("add", "sub"):
                    raise state.error(QuadrantsSyntaxError, f"qd.ad.FwdMode: atomic '{op}' on a field with a dual "
                                      "cannot be differentiated", stmt.loc)
                e.call(subscripts.atomic_update, [dual, index, self.tangent(operand, e), args[3]])
            return self._zero(e, stmt.target)
        method = state.definition(stmt.value.func)
        if isinstance(method, self.ir.Expr) and method.op == "getattr" and method.attr in _LINEAR_METHODS:
            return self._method_tangent(e, method.value, method.attr, args)
        if callee in _MATH_CALLEES:
            name = _MATH_CALLEES[callee]
            if len(args) != MATH_OPS[name].arity:
                raise state.error(QuadrantsSyntaxError, f"qd.ad.FwdMode: {name} with {len(args)} arguments "
                                  "cannot be differentiated", stmt.loc)
            return self._jvp(e, MATH_OPS[name].adjoint, args, stmt.target)
        if callee is subscripts.true_divide:
            return self._jvp(e, OPERATOR_ADJOINTS[operator.truediv], args, stmt.target)
        if callee is qd_math.cast:
            dtype = try_static(state, args[1])
            floating = isinstance(dtype, types.Float) or dtype in _FLOAT_CASTS
            return self._cast(e, args[0], stmt.target) if floating else self._zero(e, stmt.target)
        if callee in _FLOAT_CASTS or isinstance(callee, types.Float):
            return self._cast(e, args[0], stmt.target)
        if callee in _ARRAY_LOADS or callee in _ARRAY_STORES:
            return self._zero(e, stmt.target)
        if callee is not MISSING and _is_constant_matrix(callee):
            return self._zero(e, stmt.target)
        if callee is not MISSING and _is_constructor(callee):    # linear: the constructor of the tangents
            return e.ir.Expr.call(stmt.value.func, [self._literal_tangent(e, a) for a in args], stmt.value.kws, e.loc)
        if callee is not MISSING and _is_no_gradient(callee):
            return self._zero(e, stmt.target)
        what = getattr(callee, "__name__", None) or "this function"
        raise state.error(QuadrantsSyntaxError,
                          f"qd.ad.FwdMode: a call to {what} cannot be differentiated (use a qd.func, a qd math "
                          "function, or qd.stop_grad)", stmt.loc)

    def _literal_tangent(self, e, var):
        """A constructor's argument with each element replaced by its tangent (a literal list or
        tuple, nested for matrix rows, keeps its form)."""
        value = self.state.definition(var)
        if isinstance(value, self.ir.Expr) and value.op in ("build_list", "build_tuple"):
            items = [self._literal_tangent(e, item) for item in value.items]
            build = self.ir.Expr.build_list if value.op == "build_list" else self.ir.Expr.build_tuple
            return e.assign(build(items, e.loc), "$fd")
        return self.tangent(var, e)

    def _method_tangent(self, e, base, name, args):
        """The tangent of a linear method (``transpose``, ``sum``, ``trace``: the method of the
        tangent) or of ``a.dot(b)`` (``ta.dot(b) + a.dot(tb)``)."""
        def call(obj, *call_args):
            method = e.assign(e.ir.Expr.getattr(obj, name, e.loc), "$fd_method")
            return e.ir.Expr.call(method, list(call_args), (), e.loc)

        if name != "dot":
            return call(self.tangent(base, e))
        left = e.assign(call(self.tangent(base, e), args[0]), "$fd")
        right = e.assign(call(base, self.tangent(args[0], e)), "$fd")
        return e.ir.Expr.binop(operator.add, left, right, e.loc)

    def _cast(self, e, arg, target):
        """A float cast: the tangent, in the target's float type."""
        fvar = e.assign(e.ir.Global("ad_acc", ad_helpers.ad_acc, e.loc), "$fd_fn")
        return e.ir.Expr.call(fvar, [e.assign(self._zero(e, target), "$fd"), self.tangent(arg, e)], (), e.loc)
