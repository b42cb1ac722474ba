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
    point. Returns True if anything was removed.

    One scan counts the reads of every variable (by name, over all blocks); removing an
    assignment takes its reads back, and a variable left unread makes its pure assignments in
    the given blocks dead in turn: linear in the statements, where re-scanning the IR until
    nothing changed cost a scan per link of a chain of dead values."""
    ir = state.ir
    blocks = state.func_ir.blocks
    labels = list(blocks) if labels is None else list(labels)
    state.refresh_definitions()
    in_labels = set(labels)
    reads: dict = {}        # id(assignment in the given blocks) -> the names it reads
    defs: dict = {}         # name -> its assignments in the given blocks
    uses: dict = {}
    for label, block in blocks.items():
        for stmt in block.body:
            assign = isinstance(stmt, ir.Assign)
            names = [v.name for v in stmt.list_vars() if not (assign and v is stmt.target)]
            for name in names:
                uses[name] = uses.get(name, 0) + 1
            if assign and label in in_labels:
                reads[id(stmt)] = names
                defs.setdefault(stmt.target.name, []).append(stmt)
    work = [stmt for name, stmts in defs.items() if not uses.get(name) for stmt in stmts]
    dead: set = set()
    while work:
        stmt = work.pop()
        if id(stmt) in dead or uses.get(stmt.target.name) or not _is_pure(state, stmt.value):
            continue
        dead.add(id(stmt))
        for name in reads[id(stmt)]:
            uses[name] -= 1
            if not uses[name]:
                work.extend(defs.get(name, ()))
    if not dead:
        return False
    for label in labels:
        block = blocks[label]
        if any(id(stmt) in dead for stmt in block.body):
            block.body = [stmt for stmt in block.body if id(stmt) not in dead]
    state.refresh_definitions()
    return True


class RemoveDeadPure:
    name = "remove_dead_pure"

    def run(self, state) -> bool:
        return remove_dead_pure(state)
