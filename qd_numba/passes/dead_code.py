"""RemoveDeadPure: drop side-effect-free assignments nobody reads.

Folding and inlining leave behind the loads they made redundant: ``$g = global(twice)``
after ``twice(x)`` was inlined, ``$a = getattr(qd, 'static')`` after ``qd.static(c)`` was
folded, ``range(n)`` after a loop was canonicalised. Such values have no Numba type (a
``QdFunc``, a module, a Python function), so they must be gone before typing.

Only statements whose value is pure are removed: constants, globals, free variables, copies,
``getattr``/``static_getitem``/``build_tuple`` and calls of a few pure builtins. Assignments
to user-named variables are removed too when dead (Numba would drop them anyway), so a
folded ``qd.static`` condition never reaches typing.
"""

from __future__ import annotations

from .base import MISSING, try_static
from .ir_builder import op_traits


def _pure_calls():
    from ..lang import grouped, ndrange, static

    return (range, ndrange, grouped, static, len)


def _is_pure(state, value) -> bool:
    ir = state.ir
    if isinstance(value, (ir.Const, ir.Global, ir.FreeVar, ir.Var)):
        return True
    if isinstance(value, ir.Expr):
        if op_traits(value.op).removable:
            return True
        if value.op == "call":
            fn = try_static(state, value.func)
            return fn is not MISSING and fn in _pure_calls()
    return False


def remove_dead_pure(state, labels=None) -> bool:
    """Remove dead pure assignments in the given blocks (all blocks by default), to a fixed
    point. Returns True if anything was removed."""
    ir = state.ir
    blocks = state.func_ir.blocks
    labels = list(blocks) if labels is None else list(labels)
    removed = False
    while True:
        state.refresh_definitions()
        used = set()
        for b in blocks.values():
            for s in b.body:
                used.update(v.name for v in s.list_vars()
                            if not (isinstance(s, ir.Assign) and v is s.target))
        progress = False
        for lbl in labels:
            block = blocks[lbl]
            keep = [s for s in block.body
                    if not (isinstance(s, ir.Assign) and s.target.name not in used and _is_pure(state, s.value))]
            if len(keep) != len(block.body):
                block.body = keep
                progress = removed = True
        if not progress:
            break
    state.refresh_definitions()
    return removed


class RemoveDeadPure:
    name = "remove_dead_pure"

    def run(self, state) -> bool:
        return remove_dead_pure(state)
