"""IR verifier: structural invariants a pass must not break.

Always, after every pass (cheap): every block ends in exactly one terminator; every
jump/branch targets an existing block; the entry block exists; every ``arg(k)`` names a
parameter slot that exists.

Once per compile, on the IR the pipeline hands to typing (:func:`verify_final`), and after
every pass with ``verify_each_pass`` (``QD_VERIFY_EACH_PASS=1``; the test suite sets it): every variable that is
read is assigned somewhere in the function, and after Offload the loops and tasks are
consistent (indices, labels, disjoint bodies, one range-for task per loop).

A failure raises QuadrantsCompilationError naming the pass that broke the IR: an internal
error, reported before Numba's typing turns it into an obscure message.
"""

from __future__ import annotations

from ..errors import QuadrantsCompilationError
from .ir_builder import successors


def _fail(after: str, what: str):
    raise QuadrantsCompilationError(f"internal error after {after}: {what}")


def verify_ir(state, after: str) -> None:
    ir = state.ir
    blocks = state.func_ir.blocks
    if not blocks:
        _fail(after, "no blocks")
    nargs = len(state.runtime_params) + len(state.hidden)
    for label, block in blocks.items():
        if not block.body or not block.body[-1].is_terminator:
            _fail(after, f"block {label} has no terminator")
        for stmt in block.body[:-1]:
            if stmt.is_terminator:
                _fail(after, f"terminator inside block {label}")
            if isinstance(stmt, ir.Assign) and isinstance(stmt.value, ir.Arg) and stmt.value.index >= nargs:
                _fail(after, f"arg index {stmt.value.index}")
        for t in successors(ir, block):
            if t not in blocks:
                _fail(after, f"block {label} jumps to {t}")
    if state.config.verify_each_pass:
        verify_final(state, after)


def verify_final(state, after: str) -> None:
    """The expensive checks: definitions of every used variable, and the task structure."""
    _verify_definitions(state, after)
    if getattr(state, "loops", None):
        _verify_tasks(state, after)



def _verify_definitions(state, after: str) -> None:
    ir = state.ir
    defined, used = set(), {}
    for block in state.func_ir.blocks.values():
        for stmt in block.body:
            if isinstance(stmt, ir.Assign):
                defined.add(stmt.target.name)
                reads = stmt.value.list_vars() if isinstance(stmt.value, ir.Expr) else \
                    [stmt.value] if isinstance(stmt.value, ir.Var) else []
            else:
                reads = stmt.list_vars()
            for v in reads:
                used.setdefault(v.name, stmt.loc)
    missing = sorted(set(used) - defined)
    if missing:
        loc = used[missing[0]]
        where = f" ({loc.filename}:{loc.line})" if loc is not None else ""
        _fail(after, f"variable '{missing[0]}' is read but never assigned{where}")


def _verify_tasks(state, after: str) -> None:
    blocks = state.func_ir.blocks
    tasks = state.tasks
    if [t.index for t in tasks] != list(range(len(tasks))):
        _fail(after, f"task indices {[t.index for t in tasks]} are not 0..{len(tasks) - 1}")
    seen = set()
    for lp in state.loops:
        if not 0 <= lp.task_index < len(tasks) or tasks[lp.task_index].kind != "range_for":
            _fail(after, f"loop at block {lp.header} maps to task {lp.task_index}, not a range-for task")
        for what, lbl in (("header", lp.header), ("preheader", lp.preheader), ("exit", lp.exit)):
            if lbl not in blocks:
                _fail(after, f"task {lp.task_index}: {what} block {lbl} does not exist")
        missing = sorted(lp.body - set(blocks))
        if missing:
            _fail(after, f"task {lp.task_index}: body block {missing[0]} does not exist")
        if lp.header not in lp.body or lp.preheader in lp.body or lp.exit in lp.body:
            _fail(after, f"task {lp.task_index}: header/preheader/exit inconsistent with its body")
        if seen & lp.body:
            _fail(after, f"task {lp.task_index} shares body blocks {sorted(seen & lp.body)} with another task")
        seen |= lp.body
    for task in tasks:
        if task.kind == "serial" and seen & task.body:
            _fail(after, f"serial task {task.index} shares blocks {sorted(seen & task.body)} with another task")
        if task.kind == "serial":
            seen |= task.body
    range_tasks = [t.index for t in tasks if t.kind == "range_for"]
    if sorted(lp.task_index for lp in state.loops) != range_tasks:
        _fail(after, "range-for tasks and offloaded loops do not correspond one to one")
