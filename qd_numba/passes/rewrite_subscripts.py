"""RewriteSubscripts: Quadrants' meaning of subscript updates, atomics and division.

Rewrites, per statement pattern (global data = a field or an ndarray argument):

==========================================  =============================================
``G[I] op= V`` (op in + - & | ^)            ``atomic_update(G, I, V, op)``: atomic RMW
``G[I][J] op= V`` (vector field component)  ``nested_atomic(G, I, J, V, op)``
``qd.atomic_<op>(G[I], V)``                 ``atomic_update(G, I, V, op)``: returns old
``qd.atomic_<op>(L, V)`` (local scalar)     ``old = L; L = L op V``
``L[I] = V`` (local vector/matrix)          ``L = subscript_store(L, I, V)``: value update
``L.x = V`` (component xyzw, rgba, stpq)    as ``L[0] = V``; ``L.x`` is ``L[0]`` in all of these
``G[I][J] = V``                             ``T = G[I]; T[J] = V; G[I] = T`` (value types)
``a / b``                                   ``true_divide(a, b)``: ints give ``default_fp``
==========================================  =============================================

Other ``op=`` (``*=``, ``/=`` ...) stay plain read-modify-writes, as in Quadrants.
"""

from __future__ import annotations

import operator

from ..lang import ATOMIC_FUNCTIONS
from ..lowering import subscripts as impl
from ..typing.matrix import SWIZZLE
from .base import MISSING, is_global_data, try_static

_AUG_OPS = {operator.iadd: "add", operator.isub: "sub", operator.iand: "and",
            operator.ior: "or", operator.ixor: "xor"}


def _subscript(state, var):
    """(base, index var or None, const index) if ``var`` is defined by ``base[index]``."""
    d = state.definition(var)
    ir = state.ir
    if isinstance(d, ir.Expr) and d.op == "getitem":
        return d.value, d.index, None
    if isinstance(d, ir.Expr) and d.op == "static_getitem":
        return d.value, d.index_var, d.index
    if isinstance(d, ir.Expr) and d.op == "getattr" and d.attr in SWIZZLE:  # v.x is v[0]
        return d.value, None, SWIZZLE[d.attr]
    return None


class RewriteSubscripts:
    name = "rewrite_subscripts"

    def run(self, state) -> bool:
        changed = False
        state.refresh_definitions()
        for block in state.func_ir.blocks.values():
            new_body = []
            for stmt in block.body:
                out = self._rewrite(state, block, stmt)
                if out is None:
                    new_body.append(stmt)
                else:
                    new_body.extend(out)
                    changed = True
            block.body = new_body
        if changed:
            state.refresh_definitions()
        return changed

    def _global(self, state, obj, loc, name):
        return state.ir.Global(name, obj, loc)

    def _call(self, state, block, fn, args, target, loc):
        """[``$f = global(fn)``, ``target = call $f(*args)``]."""
        ir = state.ir
        fvar = block.scope.redefine(f"$qd_{fn.__name__}", loc)
        return [ir.Assign(ir.Global(fn.__name__, fn, loc), fvar, loc),
                ir.Assign(ir.Expr.call(fvar, list(args), (), loc), target, loc)]

    def _const(self, state, block, value, loc):
        ir = state.ir
        var = block.scope.redefine("$qd_const", loc)
        return var, ir.Assign(ir.Const(value, loc), var, loc)

    def _index_var(self, state, block, index_var, const_index, loc):
        """A variable holding the index (static_getitem/StaticSetItem may only have a constant)."""
        if index_var is not None:
            return index_var, []
        var, stmt = self._const(state, block, const_index, loc)
        return var, [stmt]

    def _rewrite(self, state, block, stmt):
        ir = state.ir
        loc = stmt.loc
        # -- stores: G[I] op= V, G[I] = V, L[I] = V, L.x = V -----------------------------------
        if isinstance(stmt, (ir.SetItem, ir.StaticSetItem)) or (isinstance(stmt, ir.SetAttr)
                                                               and stmt.attr in SWIZZLE):
            target, value = stmt.target, stmt.value
            if isinstance(stmt, ir.SetAttr):
                index, pre = self._index_var(state, block, None, SWIZZLE[stmt.attr], loc)
            elif isinstance(stmt, ir.SetItem):
                index, pre = stmt.index, []
            else:
                index, pre = self._index_var(state, block, stmt.index_var, stmt.index, loc)
            vdef = state.definition(value)
            aug = (isinstance(vdef, ir.Expr) and vdef.op == "inplace_binop" and vdef.fn in _AUG_OPS)
            if aug:
                loaded = _subscript(state, vdef.lhs)
                aug = loaded is not None and loaded[0].name == target.name
            if aug:
                op_var, op_stmt = self._const(state, block, _AUG_OPS[vdef.fn], loc)
                tmp = block.scope.redefine("$qd_old", loc)
                if is_global_data(state, target):
                    return pre + [op_stmt] + self._call(state, block, impl.atomic_update,
                                                        [target, index, vdef.rhs, op_var], tmp, loc)
                outer = _subscript(state, target)
                if outer is not None and is_global_data(state, outer[0]):
                    oindex, opre = self._index_var(state, block, outer[1], outer[2], loc)
                    return pre + opre + [op_stmt] + self._call(
                        state, block, impl.nested_atomic, [outer[0], oindex, index, vdef.rhs, op_var], tmp, loc)
            if is_global_data(state, target):
                return None if not pre else None
            # a local value (vector/matrix) or an element of global data: value update
            out = pre + self._call(state, block, impl.subscript_store, [target, index, value], target, loc)
            outer = _subscript(state, target)
            if outer is not None and is_global_data(state, outer[0]):
                oindex, opre = self._index_var(state, block, outer[1], outer[2], loc)
                wb = block.scope.redefine("$qd_wb", loc)
                out += opre + self._call(state, block, impl.write_back, [outer[0], oindex, target], wb, loc)
            return out
        if not (isinstance(stmt, ir.Assign) and isinstance(stmt.value, ir.Expr)):
            return None
        expr = stmt.value
        # -- qd.atomic_<op>(x, v) ---------------------------------------------------------------
        if expr.op == "call":
            fn = try_static(state, expr.func)
            if fn is MISSING or not callable(fn) or fn not in ATOMIC_FUNCTIONS:
                return None
            if len(expr.args) != 2 or expr.kws:
                raise state.error(TypeError, f"qd.atomic_{ATOMIC_FUNCTIONS[fn]}(target, value) takes 2 arguments",
                                  loc)
            dest, value = expr.args
            op_var, op_stmt = self._const(state, block, ATOMIC_FUNCTIONS[fn], loc)
            # ``qd.atomic_add(x[i], v)`` passes a temporary loaded from x[i]: the target is x[i].
            # ``s = x[i]; qd.atomic_add(s, v)`` targets the local s.
            sub = _subscript(state, dest) if state.is_temp(dest) else None
            if sub is not None:
                base, idx_var, const_idx = sub
                index, pre = self._index_var(state, block, idx_var, const_idx, loc)
                if is_global_data(state, base):
                    return pre + [op_stmt] + self._call(state, block, impl.atomic_update,
                                                        [base, index, value, op_var], stmt.target, loc)
                outer = _subscript(state, base)
                if outer is not None and is_global_data(state, outer[0]):
                    oindex, opre = self._index_var(state, block, outer[1], outer[2], loc)
                    return pre + opre + [op_stmt] + self._call(
                        state, block, impl.nested_atomic, [outer[0], oindex, index, value, op_var],
                        stmt.target, loc)
                # element of a local vector: old value, then a value update
                new = block.scope.redefine("$qd_new", loc)
                return pre + [op_stmt, ir.Assign(dest, stmt.target, loc)] + self._call(
                    state, block, impl.apply_op, [dest, value, op_var], new, loc) + self._call(
                    state, block, impl.subscript_store, [base, index, new], base, loc)
            new = block.scope.redefine("$qd_new", loc)
            return [op_stmt, ir.Assign(dest, stmt.target, loc)] + self._call(
                state, block, impl.apply_op, [dest, value, op_var], new, loc) + [ir.Assign(new, dest, loc)]
        # -- a / b ----------------------------------------------------------------------------
        if expr.op == "binop" and expr.fn is operator.truediv:
            return self._call(state, block, impl.true_divide, [expr.lhs, expr.rhs], stmt.target, loc)
        return None
