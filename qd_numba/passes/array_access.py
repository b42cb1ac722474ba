"""DirectArrayAccess: kernel reads and writes of ndarray arguments skip negative-index wraparound.

Input: the kernel IR after RewriteSubscripts and CheckReadonlyWrites. Every ``a[i]`` read
(``getitem``/``static_getitem``) and ``a[i] = v`` store (``SetItem``/``StaticSetItem``) whose
base is a plain-array runtime parameter (``types.Array`` in ``state.param_types``) becomes a
call of ``array_load``/``array_store`` (lowering/array_access.py), which compute the element
address directly when the index selects one element and fall back to ``a[i]`` otherwise.
Fields and ndarrays of vectors already use their own accessors. With ``debug=True`` the
accesses become ``checked_array_load``/``checked_array_store``, which add a bounds check per
axis (the only bounds checks ndarray arguments get on CUDA). Never touches control flow.
"""

from __future__ import annotations

from numba.core import types

from ..lowering import array_access
from .base import argument_of


def _array_param(state, var) -> bool:
    arg = argument_of(state, var)
    return arg is not None and isinstance(state.param_types.get(arg.name), types.Array)


class DirectArrayAccess:
    name = "direct_array_access"

    def run(self, state) -> bool:
        if not any(isinstance(t, types.Array) for t in state.param_types.values()):
            return False
        checked = state.config.debug
        self.load = array_access.checked_array_load if checked else array_access.array_load
        self.store = array_access.checked_array_store if checked else array_access.array_store
        state.refresh_definitions()
        changed = False
        for block in state.func_ir.blocks.values():
            new_body = []
            for stmt in block.body:
                out = self._rewrite(state, block, stmt)
                new_body.extend(out if out is not None else [stmt])
                changed |= out is not None
            block.body = new_body
        if changed:
            state.refresh_definitions()
        return changed

    def _rewrite(self, state, block, stmt):
        ir = state.ir
        loc = stmt.loc
        if isinstance(stmt, (ir.SetItem, ir.StaticSetItem)):
            if not _array_param(state, stmt.target):
                return None
            pre, index = self._index(state, block, stmt, loc)
            out = block.scope.redefine("$qd_stored", loc)
            return pre + self._call(state, block, self.store, [stmt.target, index, stmt.value], out, loc)
        if isinstance(stmt, ir.Assign) and isinstance(stmt.value, ir.Expr) \
                and stmt.value.op in ("getitem", "static_getitem"):
            expr = stmt.value
            if not _array_param(state, expr.value):
                return None
            pre, index = self._index(state, block, expr, loc)
            return pre + self._call(state, block, self.load, [expr.value, index], stmt.target, loc)
        return None

    @staticmethod
    def _index(state, block, node, loc):
        """([statements], index var): static indices (``a[0]``) get a constant variable."""
        ir = state.ir
        if isinstance(node, ir.SetItem) or getattr(node, "op", None) == "getitem":
            return [], node.index
        if node.index_var is not None:
            return [], node.index_var
        var = block.scope.redefine("$qd_const", loc)
        return [ir.Assign(ir.Const(node.index, loc), var, loc)], var

    @staticmethod
    def _call(state, block, fn, args, target, loc):
        ir = state.ir
        fvar = block.scope.redefine(f"$qd_{fn.__name__}", loc)
        return [ir.Assign(ir.Global(fn.__name__, fn, loc), fvar, loc),
                ir.Assign(ir.Expr.call(fvar, list(args), (), loc), target, loc)]
