"""ResolveGlobals: fold compile-time attribute/item access; fields become hidden arguments.

* ``getattr`` / ``static_getitem`` on a compile-time Python object (a global, a free
  variable, a bound template value) is evaluated now: ``self.x`` -> the field ``x``,
  ``x.shape`` -> a constant tuple, ``qd.sin`` -> the function.
* Every reference to a ``Field`` (or ``Ndarray``) object becomes a read of a hidden kernel
  argument ``__qd_field_k`` (appended after the runtime parameters). Numba never sees the
  Python object: it would freeze the buffer as a constant, and with a parallel backend dead-
  code-eliminate writes to it.
* Referencing a ``@qd.kernel`` inside a kernel is an error (kernels cannot be nested).

Never touches control flow.
"""

from __future__ import annotations

import types as pytypes

from ..errors import QuadrantsSyntaxError
from ..field import ArrayData
from ..matrix import Matrix
from .base import MISSING, try_static


def _foldable(value) -> bool:
    """Values whose attributes are safe to evaluate at compile time."""
    from ..kernel import QdFunc

    if isinstance(value, (Matrix, type(Matrix))):  # Numba types these (typing/matrix.py), methods too
        return False
    if isinstance(value, (ArrayData, pytypes.ModuleType, QdFunc)):
        return True
    if isinstance(value, (int, float, bool, str, tuple, list, dict, type(None))):
        return True
    # instances of user classes (data-oriented objects, template values), not Numba values
    return not type(value).__module__.startswith(("numba", "numpy", "builtins", "llvmlite"))


class ResolveGlobals:
    name = "resolve_globals"

    def run(self, state) -> bool:
        ir = state.ir
        from ..kernel import Kernel

        changed = False
        self._new_args = []
        state.refresh_definitions()
        for block in state.func_ir.blocks.values():
            for k, stmt in enumerate(block.body):
                if not isinstance(stmt, ir.Assign):
                    continue
                value = stmt.value
                if isinstance(value, ir.Expr) and value.op in ("getattr", "static_getitem", "getitem"):
                    base = try_static(state, value.value)
                    if base is MISSING or not _foldable(base) or isinstance(base, ArrayData):
                        continue
                    if value.op == "getitem":  # x[0] with a constant index (Python >= 3.12 bytecode)
                        index = try_static(state, value.index)
                        if index is MISSING or not isinstance(base, (tuple, list, dict)):
                            continue
                    try:
                        folded = getattr(base, value.attr) if value.op == "getattr" else \
                            base[value.index] if value.op == "static_getitem" else base[index]
                    except (AttributeError, IndexError, KeyError, TypeError):
                        continue
                    value = ir.Global(f"{stmt.target.name}", folded, stmt.loc)
                    block.body[k] = stmt = ir.Assign(value, stmt.target, stmt.loc)
                    changed = True
                if isinstance(value, (ir.Global, ir.FreeVar)):
                    obj = value.value
                    if isinstance(obj, Kernel):
                        raise state.error(QuadrantsSyntaxError,
                                          f"cannot call kernel '{obj.name}' from a kernel; use @qd.func for helpers",
                                          stmt.loc)
                    if isinstance(obj, ArrayData):
                        hidden = self._hidden_var(state, obj, stmt.loc)
                        block.body[k] = ir.Assign(hidden, stmt.target, stmt.loc)
                        changed = True
        if self._new_args:
            entry = state.func_ir.blocks[min(state.func_ir.blocks)]
            entry.body[:0] = self._new_args
        if changed:
            state.refresh_definitions()
        return changed

    def _hidden_var(self, state, obj, loc):
        ir = state.ir
        entry = state.func_ir.blocks[min(state.func_ir.blocks)]
        scope = entry.scope
        key = id(obj)
        if key not in state.hidden_vars:
            index = len(state.runtime_params) + len(state.hidden)
            name = f"__qd_field_{len(state.hidden)}"
            state.hidden.append(obj)
            scope.get_or_define(name, loc)
            state.hidden_vars[key] = name
            self._new_args.append(ir.Assign(ir.Arg(name, index, loc), ir.Var(scope, name, loc), loc))
        return ir.Var(scope, state.hidden_vars[key], loc)
