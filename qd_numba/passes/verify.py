"""IR verifier, run after every pass: structural invariants a pass must not break.

Checks: every block ends in exactly one terminator; every jump/branch targets an existing
block; the entry block exists; every ``arg(k)`` names a parameter slot that exists.
Raises QuadrantsCompilationError naming the pass that broke the IR (an internal error).
"""

from __future__ import annotations

from ..errors import QuadrantsCompilationError


def verify_ir(state, after: str) -> None:
    ir = state.ir
    blocks = state.func_ir.blocks
    if not blocks:
        raise QuadrantsCompilationError(f"internal error after {after}: no blocks")
    nargs = len(state.runtime_params) + len(state.hidden)
    for label, block in blocks.items():
        if not block.body or not block.body[-1].is_terminator:
            raise QuadrantsCompilationError(f"internal error after {after}: block {label} has no terminator")
        for stmt in block.body[:-1]:
            if stmt.is_terminator:
                raise QuadrantsCompilationError(f"internal error after {after}: terminator inside block {label}")
            if isinstance(stmt, ir.Assign) and isinstance(stmt.value, ir.Arg) and stmt.value.index >= nargs:
                raise QuadrantsCompilationError(f"internal error after {after}: arg index {stmt.value.index}")
        term = block.body[-1]
        targets = [term.target] if isinstance(term, ir.Jump) else \
            [term.truebr, term.falsebr] if isinstance(term, ir.Branch) else []
        for t in targets:
            if t not in blocks:
                raise QuadrantsCompilationError(f"internal error after {after}: block {label} jumps to {t}")
